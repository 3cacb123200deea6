"""bench/farm.py's smallest configuration end to end: 8 simulated GPUs' worker processes through a real
PgBouncer, moto and a Redis of its own, for a few seconds; its table must show the calls it timed.

~45 s on 2 cores. Skipped without the pgbouncer binary, failed under CI (as tests/fixtures/pgbouncer.py).
"""

from __future__ import annotations

import os
import re
import shutil

import pytest

from bench import farm


def test_the_farm_bench_times_the_ledger_calls_of_eight_simulated_gpus(pg_server, capsys):
    if not (shutil.which("pgbouncer") or os.access("/usr/sbin/pgbouncer", os.X_OK)):
        if os.environ.get("CI"):
            pytest.fail("CI must provide pgbouncer (.ci/run installs it)", pytrace=False)
        pytest.skip("the pgbouncer binary is not installed (apt-get install pgbouncer)")
    assert farm.main(["--gpus", "8", "--samples", "3200", "--warm-s", "25", "--measure-s", "10",
                      "--admin-dsn", pg_server.admin_dsn, "--pool-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "== 8 simulated GPUs, full path: 8 worker processes x 1 GPUs" in out, out
    commits = float(re.search(r"commits/s ([\d.]+) of a target", out).group(1))
    assert commits > 0, out
    timed = {m.group(1) for m in re.finditer(r"^(claim|heartbeat|commit|gate)\s+\d", out, re.MULTILINE)}
    assert timed == {"claim", "heartbeat", "commit", "gate"}, out
    # PgBouncer held the ledger to its pool, however many clients the 8 processes opened.
    server = int(re.search(r"server peak (\d+) \(PgBouncer pool 4\)", out).group(1))
    assert 1 <= server <= 4, out
    assert "== summary" in out
