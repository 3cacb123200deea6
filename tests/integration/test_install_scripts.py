"""scripts/install.sh's first step and scripts/test.sh on stock images: no python3-venv, no pip, no make.

A stock Debian or Ubuntu image's ``python3`` is emulated by a wrapper around this machine's
interpreter that does what Debian's does without ``python3-venv``: ``-m venv`` makes a folder
without pip in it and fails with Debian's message, ``-m ensurepip`` fails; without
``python3-pip`` ``-m pip`` fails too. The PATH given to the scripts has no uv and no make.
(docs/testing.md: which images were tried, and how.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import make_recipe  # noqa: E402 - scripts, not a package
import torch_build  # noqa: E402

#: The interpreter this venv is made from: what a stock image's /usr/bin/python3 is to its venv.
BASE_PYTHON = os.path.realpath(sys.executable)
#: The commands the scripts use, and nothing else: no uv, no make, no curl.
TOOLS = ("bash", "sh", "env", "dirname", "mktemp", "rm", "touch", "cat", "test", "[", "tail")

STOCK_PYTHON = """#!/bin/sh
# python3 as a stock Debian/Ubuntu image has it without python3-venv (and, with NO_PIP=1, python3-pip)
prev=
for a in "$@"; do
  if [ "$prev" = -m ]; then
    case "$a" in
      venv)
        shift 2  # Debian's venv makes the folder, then fails for want of ensurepip
        "{real}" -m venv --without-pip "$@" >/dev/null 2>&1
        echo "The virtual environment was not created successfully because ensurepip is not available." >&2
        echo "On Debian/Ubuntu systems, you need to install the python3-venv package" >&2
        exit 1;;
      ensurepip) echo "/usr/bin/python3: No module named ensurepip" >&2; exit 1;;
      pip) if [ -n "$NO_PIP" ]; then echo "/usr/bin/python3: No module named pip" >&2; exit 1; fi;;
    esac
  fi
  prev=$a
done
exec "{real}" "$@"
"""


@pytest.fixture
def stock_bin(tmp_path) -> Path:
    """A PATH folder: ``python3`` as a stock image has it, and the few tools the scripts use."""
    folder = tmp_path / "bin"
    folder.mkdir()
    python = folder / "python3"
    python.write_text(STOCK_PYTHON.replace("{real}", BASE_PYTHON))
    python.chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    assert shutil.which("make", path=str(folder)) is None and shutil.which("uv", path=str(folder)) is None
    return folder


def make_venv(stock_bin: Path, venv: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "make_venv.sh"), str(venv)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PATH": str(stock_bin), "PYTHON": "python3", **env})


def test_the_stock_python_refuses_venv_as_debian_does(stock_bin, tmp_path):
    out = subprocess.run([str(stock_bin / "python3"), "-m", "venv", str(tmp_path / "v")], capture_output=True,
                         text=True, env={"PATH": str(stock_bin)})
    assert out.returncode == 1 and "python3-venv" in out.stderr
    assert (tmp_path / "v").is_dir() and not (tmp_path / "v" / "bin" / "pip").exists()


def test_without_ensurepip_or_pip_the_one_apt_line_is_printed_and_nothing_is_left(stock_bin, tmp_path):
    venv = tmp_path / "venv"
    out = make_venv(stock_bin, venv, NO_PIP="1")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"apt-get install -y python{version}-venv" in out.stderr
    assert not venv.exists(), "the half-made folder of the failed venv is removed"


def test_a_folder_that_was_there_before_is_never_removed(stock_bin, tmp_path):
    venv = tmp_path / "mine"
    venv.mkdir()
    (venv / "keep.txt").write_text("someone's")
    out = make_venv(stock_bin, venv, NO_PIP="1")
    assert out.returncode == 1
    assert (venv / "keep.txt").read_text() == "someone's"


def test_without_ensurepip_virtualenv_comes_from_the_pip_there_is(stock_bin, tmp_path):
    venv = tmp_path / "venv"
    out = make_venv(stock_bin, venv)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "virtualenv fetched with pip" in out.stdout
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True, text=True)
    assert pip.returncode == 0 and str(venv) in pip.stdout
    # The base interpreter's packages were left alone (--target): no virtualenv installed into them.
    base = subprocess.run([BASE_PYTHON, "-c", "import virtualenv"], capture_output=True)
    assert base.returncode != 0


def test_an_existing_virtualenv_is_kept(stock_bin, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([BASE_PYTHON, "-m", "venv", str(venv)], check=True)
    out = make_venv(stock_bin, venv, NO_PIP="1")
    assert out.returncode == 0 and "already there" in out.stdout, out.stdout + out.stderr


# --- make's recipes without make --------------------------------------------------------------------

@pytest.mark.parametrize("target", ["test", "test-fast", "lint"])
@pytest.mark.parametrize("venv", [None, "/opt/some venv"])
def test_the_recipe_read_without_make_is_the_one_make_runs(target, venv):
    if shutil.which("make") is None:
        pytest.skip("make is not installed here: nothing to compare with")
    env = {k: v for k, v in os.environ.items() if k != "VENV"} | ({"VENV": venv} if venv else {})
    # -o install: its prerequisite is not remade (the caller installs first, as scripts/test.sh does).
    made = subprocess.run(["make", "-s", "-n", "-o", "install", target], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True).stdout.splitlines()
    assert made, f"make -n {target} printed nothing"
    assert make_recipe.recipe(target, [], (ROOT / "Makefile").read_text(), env) == made


def test_extra_arguments_go_on_the_last_line_quoted():
    text = "VENV ?= .venv\nPY := $(VENV)/bin/python\nT ?= 2\n\ntest: install\n\t$(PY) -m pytest -n $(T)\n"
    assert make_recipe.recipe("test", ["-k", "a b"], text, {"T": "4"}) == [".venv/bin/python -m pytest -n 4 -k 'a b'"]
    with pytest.raises(SystemExit, match="no recipe for 'bench'"):
        make_recipe.recipe("bench", [], text, {})


def test_scripts_test_sh_runs_the_suite_where_there_is_no_make(stock_bin, tmp_path):
    venv = Path(sys.prefix)
    if not (venv / ".installed").exists():
        pytest.skip(f"{venv} was not installed by scripts/install.sh (no .installed): test.sh would install")
    out = subprocess.run([str(ROOT / "scripts" / "test.sh"), "--collect-only", "tests/unit/test_layout.py"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PATH": str(stock_bin), "VENV": str(venv)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"+ {venv}/bin/python -m pytest -q -rs" in out.stdout, out.stdout  # the Makefile's recipe, echoed
    assert "collected" in out.stdout and "error" not in out.stdout.lower(), out.stdout


# --- torch: which build plain pip would take ---------------------------------------------------------

def test_a_torch_that_requires_nvidia_packages_is_the_cuda_build():
    assert torch_build.build_of({"version": "2.13.0+cpu", "requires_dist": []}) == "cpu"
    assert torch_build.build_of({"version": "2.13.0", "requires_dist": ["filelock", "nvidia-cublas==13.1; "
                                                                        "platform_system == 'Linux'"]}) == "cuda"
    assert torch_build.build_of({"version": "2.13.0", "requires_dist": ["filelock"]}) == "cpu"  # e.g. aarch64


def test_pypis_torch_for_linux_x86_64_is_seen_as_the_cuda_build(tmp_path):
    # No pip config and no find-links: what a stock image's pip sees (PyPI alone). Only metadata is fetched.
    if os.uname().machine != "x86_64":
        pytest.skip("PyPI's Linux torch is a CUDA build on x86_64 only")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "torch_build.py"), "2.13.0"], capture_output=True,
                         text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.stdout.strip() == "cuda", out.stdout + out.stderr
