"""bench/farm.py's figures: the timing files read back, one table per phase, the goals of issue 22."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

from bench.farm_services import Samples

#: Issue 22 item 4.
P99_GOAL_MS = 100.0
CONNECTIONS_GOAL = 500
ONE_RUN_COMMITS_GOAL = 300.0
TAIL_GOAL = 1.5
KIND_ORDER = ("claim", "heartbeat", "commit", "gate", "gate_pass", "reconcile_offer", "reconcile_pass", "release",
              "fail")


def read_timings(folder: Path, t0: float, t1: float) -> dict[str, list[float]]:
    """Every process's recorded calls (worker/measure/ledger_timing.py) that ended within ``[t0, t1]``: ms by kind."""
    out: dict[str, list[float]] = defaultdict(list)
    if not folder.is_dir():
        return out
    for name in os.listdir(folder):
        with open(folder / name) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut by a killed process
                out[rec["kind"]] += [ms for t, ms in zip(rec["t"], rec["ms"], strict=True) if t0 <= t <= t1]
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(math.ceil(q * len(ordered))) - 1)]


class Table:
    def __init__(self, title: str, *, gpus: int):
        self.title, self.gpus = title, gpus
        self.lines: list[str] = []
        self.notes: list[str] = []
        self.p99: dict[str, float] = {}
        self.rates: dict[str, float] = {}
        self.server_peak = self.client_peak = 0
        self.redis_peak_mb = self.redis_commands_s = 0.0
        self.commits_target = 0.0
        self.burst_commits_s: float | None = None
        self.tail_ratio: float | None = None
        self.tail_ratio_achieved: float | None = None
        self.kind = "ledger" if "ledger only" in title else "tail" if "tail" in title else "window"

    def fill(self, timings: dict[str, list[float]], samples: Samples, cores: dict[str, float], seconds: float, *,
             pool: int) -> None:
        self.seconds = seconds
        self.lines.append(f"{'call':<16}{'n':>8}{'/s':>9}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
        for kind in sorted(timings, key=lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else 99):
            ms = timings[kind]
            if not ms:
                continue
            self.rates[kind] = len(ms) / seconds
            self.p99[kind] = pct(ms, 0.99)
            self.lines.append(f"{kind:<16}{len(ms):>8,}{self.rates[kind]:>9.1f}{pct(ms, 0.5):>10.1f}"
                              f"{self.p99[kind]:>10.1f}{max(ms):>10.1f}")
        self.server_peak = max(samples.server_conns, default=0)
        self.client_peak = max(samples.client_conns, default=0)
        self.redis_peak_mb = max(samples.redis_used, default=0) / 2**20
        self.redis_commands_s = samples.commands_s()
        self.lines.append(f"postgres connections: server peak {self.server_peak} (PgBouncer pool {pool}), "
                          f"PgBouncer clients peak {self.client_peak}, waiting peak "
                          f"{max(samples.waiting_clients, default=0)}")
        self.lines.append(f"redis: used_memory peak {self.redis_peak_mb:.1f} MB, {self.redis_commands_s:,.0f} "
                          "commands/s")
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        self.lines.append("CPU (cores): " + ", ".join(f"{k} {v:.2f}" for k, v in cores.items())
                          + f"; load average {load} on {os.cpu_count()} cores (shared)")

    def targets(self, *, samples_s: float, commits_s: float, heartbeats_s: float) -> None:
        self.commits_target = commits_s
        got = self.rates.get("commit", 0.0)
        self.lines.insert(0, f"claims/s {self.rates.get('claim', 0.0):.1f}, commits/s {got:.1f} of a target "
                             f"{commits_s:.1f} ({got / commits_s:.0%}; {samples_s:,.0f} samples/s), heartbeat "
                             f"statements/s {self.rates.get('heartbeat', 0.0):.1f} of {heartbeats_s:.1f}, over "
                             f"{self.seconds:.0f} s")

    def tail(self, fig, *, samples: int, gpus: int, time_factor: float, timed_out: bool) -> None:
        from bench.farm_workers import MEAN_TOKENS, SAMPLES_S_PER_GPU

        ideal_run = samples / (gpus * SAMPLES_S_PER_GPU * time_factor)
        if timed_out or 100 not in fig.at:
            self.lines.insert(0, f"NOT FINISHED within the timeout: {fig.samples_done:,} of {samples:,} samples done")
            return
        run_s, tail_s = fig.at[100], fig.at[100] - fig.at[95]
        mid_rate = 0.8 * samples / (fig.at[90] - fig.at[10])
        self.tail_ratio = tail_s / (0.05 * ideal_run)
        self.tail_ratio_achieved = tail_s / (0.05 * samples / mid_rate)
        idle = 1 - fig.completion_tokens / (gpus * SAMPLES_S_PER_GPU * MEAN_TOKENS * time_factor * run_s)
        self.lines[:0] = [
            f"run: {run_s:.0f} s, first claim to last commit (ideal {ideal_run:.0f} s at {gpus} GPUs x "
            f"{SAMPLES_S_PER_GPU} x{time_factor:g} samples/s; x{time_factor:g} = {run_s * time_factor / 60:.0f} "
            "min of farm time)",
            f"reached {mid_rate:,.0f} samples/s between 10% and 90% done ({mid_rate * ideal_run / samples:.0%} "
            "of the farm's rate)",
            f"tail, 95% -> 100% done: {tail_s:.1f} s = {self.tail_ratio:.2f}x its share of the ideal time "
            f"({0.05 * ideal_run:.1f} s), {self.tail_ratio_achieved:.2f}x its share at the rate reached",
            f"idle GPU share: {idle:.1%} (1 - tokens made / (tok/s of 64 engines x run time))",
        ]

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self) -> str:
        return "\n".join([f"\n== {self.title}", *self.lines, *(f"note: {n}" for n in self.notes)])


def summary(tables: list[Table]) -> str:
    rows = [("goal (issue 22, item 4)", "figure", "met?")]

    def yes(ok: bool | None) -> str:
        return "n/a" if ok is None else "yes" if ok else "NO"

    for t in tables:
        if t.gpus < 1000 or t.kind == "tail":
            continue
        where = "ledger only" if t.kind == "ledger" else "full path"
        worst = max(t.p99.items(), key=lambda kv: kv[1], default=("-", math.nan))
        rows.append((f"{t.gpus:,} GPUs ({where}): p99 < {P99_GOAL_MS:.0f} ms, every call",
                     f"worst {worst[0]} {worst[1]:.0f} ms at {t.rates.get('commit', 0):.0f} of "
                     f"{t.commits_target:.0f} commits/s", yes(worst[1] < P99_GOAL_MS)))
        rows.append((f"{t.gpus:,} GPUs ({where}): Postgres connections <= {CONNECTIONS_GOAL} via the pooler",
                     f"{t.server_peak} server, {t.client_peak} clients", yes(t.server_peak <= CONNECTIONS_GOAL)))
        if t.burst_commits_s is not None:
            rows.append((f"one run's commits not serialised below {ONE_RUN_COMMITS_GOAL:.0f}/s",
                         f"{t.burst_commits_s:,.0f}/s on 2 shared cores (CPU-bound)",
                         yes(t.burst_commits_s >= ONE_RUN_COMMITS_GOAL)))
    for t in tables:
        if t.kind == "tail" and t.tail_ratio is not None:
            rows.append((f"64 GPUs: last 5% <= {TAIL_GOAL}x its ideal share", f"{t.tail_ratio:.2f}x "
                         f"({t.tail_ratio_achieved:.2f}x at the rate reached)", yes(t.tail_ratio <= TAIL_GOAL)))
    rows += [
        ("100M-sample ledger: finish check, gate, reconciler pass, status < 100 ms",
         "not run here: bench/ledger_commits.py, bench/reconcile_scale.py (docs/results/)", "n/a"),
        ("Redis < 100 MB for a 100M-sample run",
         f"peak {max((t.redis_peak_mb for t in tables), default=0):.0f} MB here (two runs, a queue window each); "
         "100M: bench/reconcile_scale.py", "n/a"),
    ]
    width = max(len(r[0]) for r in rows)
    fig = max(len(r[1]) for r in rows)
    return "\n== summary\n" + "\n".join(f"{a:<{width}}  {b:<{fig}}  {c}" for a, b, c in rows)
