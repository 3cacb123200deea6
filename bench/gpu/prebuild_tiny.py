"""Build the tiny models the fidelity suites use into the model cache, before the suites run (issue 31, item 7).

    CUDA_VISIBLE_DEVICES= REGEN_CACHE_DIR=/tmp/regen-cache python3 -m bench.gpu.prebuild_tiny [--jobs N --threads T]

On a fresh GPU machine the suites spend ~8 of their ~15 minutes building eight tiny models on the CPU (their
cache key names torch's and transformers' versions, so no model built elsewhere applies), one after another,
while the GPU waits. Started beside a GPU benchmark (bench/gpu/fidelity.sh --prebuild), the builds take none
of the device time: the suites then find every model in the cache. The builds see no GPU (the caller empties
CUDA_VISIBLE_DEVICES): a benchmark's engine beside them keeps the card to itself, and the trained model is
the one a CPU machine's tests build.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

#: The longest build: regen's trained model (463 s on one thread of the 2-core dev machine, where each family took
#: 73-118 s). It goes first and gets half the cores it is given, the families one thread each, so all end about
#: together.
LEAD = "qwen3"


def fidelity_families() -> list[str]:
    """Every family of worker/tiny/families.py, the longest build first: the three suites build each one's
    trained model (regen's own in test_fidelity.py, gpt-oss in test_harmony_fidelity.py, the rest in
    test_family_fidelity.py), so a family added there is prebuilt too."""
    from worker.tiny.families import SPECS

    return sorted(SPECS, key=lambda family: family != LEAD)


def build_one(family: str, threads: int) -> tuple[str, float]:
    import torch

    torch.set_num_threads(threads)
    from worker.tiny.family_model import build_tiny_model

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(Path(tmp) / family, variant="trained", family=family)  # fills the cache; the copy goes
    return family, time.perf_counter() - t0


def threads_for(family: str, cores: int, threads: int) -> int:
    return max(threads, cores // 2) if family == LEAD else threads


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu.prebuild_tiny", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=0, help="builds at once (default: all of them)")
    p.add_argument("--threads", type=int, default=1, help="torch threads a family's build (default 1)")
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                   help="cores to share (default: those this process may run on); regen's own model gets half")
    p.add_argument("--families", default="",
                   help="comma-separated families to build (default: all), for a run of some cases only (pytest -k)")
    args = p.parse_args(argv)
    families = fidelity_families()
    if args.families:
        wanted = [f.strip() for f in args.families.split(",") if f.strip()]
        unknown = sorted(set(wanted) - set(families))
        if unknown:
            p.error(f"--families: {', '.join(unknown)} not in worker/tiny/families.py (known: {', '.join(families)})")
        families = [f for f in families if f in wanted]
    t0, failed = time.perf_counter(), 0
    with ProcessPoolExecutor(max_workers=args.jobs or len(families)) as pool:
        futures = {pool.submit(build_one, f, threads_for(f, args.cores, args.threads)): f for f in families}
        for future in as_completed(futures):
            try:
                family, seconds = future.result()
                print(f"prebuild_tiny: {family} ready in {seconds:.0f} s", flush=True)
            except Exception as e:  # noqa: BLE001 - each failure named; the suite builds that one itself
                failed += 1
                print(f"prebuild_tiny: {futures[future]} FAILED: {type(e).__name__}: {e}", flush=True)
    print(f"prebuild_tiny: {len(families) - failed} of {len(families)} built in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
