"""bench/gpu/detached.sh: a command outlives the device call that started it, and the next call collects it."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "detached.sh"


def _call(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """One 'device call': its own process group, killed whole when it returns, as the device tool does."""
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    out.mkdir()
    repo = tmp_path / "repo"  # the working tree the call runs in (the script runs the command in a copy)
    if not repo.exists():
        repo.mkdir()
        (repo / "code.txt").write_text("the code")
    env = {**os.environ, "DETACHED_DIR": str(tmp_path / "detached"), "OUT": str(out)}
    proc = subprocess.Popen(["bash", str(SCRIPT), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=repo)
    stdout, _ = proc.communicate(timeout=60)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever the call left in its group
    except ProcessLookupError:
        pass
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout)
    result.out = out  # type: ignore[attr-defined]
    return result


def test_the_command_runs_on_past_its_call_and_the_next_wait_returns_its_output(tmp_path):
    started = _call(tmp_path, "start", "1", "bash", "-c",
                    'echo "first line in $PWD"; sleep 3; cat code.txt > "$OUT/kept.txt"; echo "last line"; exit 4')
    assert started.returncode == 3 and "still running" in started.stdout
    assert "last line" not in started.stdout
    assert f"first line in {tmp_path / 'detached' / 'tree'}" in started.stdout  # a copy of its own
    (tmp_path / "repo" / "code.txt").write_text("changed by the next call's copy")
    ended = _call(tmp_path, "wait", "30")
    assert ended.returncode == 4, ended.stdout
    assert "last line" in ended.stdout and "ended with status 4" in ended.stdout
    assert (ended.out / "kept.txt").read_text() == "the code"     # read from its copy; kept in $OUT, back
    assert not (ended.out / "tree").exists()
    assert "last line" in (ended.out / "log").read_text()


def test_wait_on_a_machine_where_nothing_was_started_says_so(tmp_path):
    result = _call(tmp_path, "wait", "1")
    assert result.returncode == 2 and "nothing was started" in result.stdout
