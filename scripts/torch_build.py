"""Which build of torch plain ``pip install torch==VERSION`` would take here: ``cpu`` or ``cuda``.

scripts/install.sh asks before installing torch: a CPU build where one lies on a local find-links
(this project's machines) or where PyPI's is one (not Linux x86_64), else PyPI's CUDA build
(~900 MB plus ~3 GB of nvidia-* wheels), and then it takes the CPU build from PyTorch's CPU index.
pip resolves without installing (``--dry-run --report``: only the wheel's metadata is fetched).

Usage: python scripts/torch_build.py VERSION   (prints cpu, cuda, or unknown when pip cannot say)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def build_of(metadata: dict) -> str:
    """``cuda`` for a torch wheel that requires CUDA's nvidia-* packages, else ``cpu``."""
    if "+cpu" in metadata["version"]:
        return "cpu"
    requires = metadata.get("requires_dist") or []
    return "cuda" if any(r.startswith("nvidia-") for r in requires) else "cpu"


def pip_would_take(version: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--no-deps",
                              "--ignore-installed", "--report", str(report), f"torch=={version}"],
                             capture_output=True, text=True)
        if out.returncode != 0 or not report.exists():
            print(out.stderr[-2000:], file=sys.stderr)
            return "unknown"
        return build_of(json.loads(report.read_text())["install"][0]["metadata"])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(pip_would_take(sys.argv[1]))
