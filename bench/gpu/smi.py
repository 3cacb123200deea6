"""What nvidia-smi says about the GPUs while a benchmark phase runs: how busy, and how much memory in use."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import threading


class GpuSampler:
    """``nvidia-smi`` utilisation and memory in use per GPU, once a second, while the block runs.

    The memory peak says how much of the card the engine really used: what is left of the card
    beyond it is headroom that regen's share of the card (worker/engine/gpu_memory.py) keeps
    out of the KV cache, the evidence for or against a larger share. A sample a second can miss a
    spike shorter than that, so the peak is a lower bound on what the engine touched.
    """

    def __init__(self):
        self.samples: dict[str, list[int]] = {}
        #: Per GPU: the most memory seen in use and the card's total, MiB.
        self.peak_mib: dict[str, int] = {}
        self.total_mib: dict[str, int] = {}
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        with contextlib.suppress(OSError):
            self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total",
                                           "--format=csv,noheader,nounits", "-lms", "1000"],
                                          stdout=subprocess.PIPE, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.record(line)

    def record(self, line: str) -> None:
        """One line of the query: ``index, utilization %, memory used MiB, memory total MiB``."""
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 or not parts[1].isdigit():
            return  # "[N/A]" or a message: nothing to count
        gpu = parts[0]
        self.samples.setdefault(gpu, []).append(int(parts[1]))
        if len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
            self.peak_mib[gpu] = max(self.peak_mib.get(gpu, 0), int(parts[2]))
            self.total_mib[gpu] = int(parts[3])

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)

    def summary(self) -> str:
        if not self.samples:
            return "no nvidia-smi samples"
        return "; ".join(f"GPU {gpu}: mean {statistics.mean(v):.0f}% busy, {sum(x >= 50 for x in v)}/{len(v)} "
                         f"samples at 50% or more{self._memory(gpu)}" for gpu, v in sorted(self.samples.items()))

    def _memory(self, gpu: str) -> str:
        if gpu not in self.peak_mib or not self.total_mib.get(gpu):
            return ""
        peak, total = self.peak_mib[gpu], self.total_mib[gpu]
        return f", peak {peak:,} of {total:,} MiB in use ({peak / total:.1%}; {(total - peak) / 1024:.1f} GiB free at the sampled peak)"
