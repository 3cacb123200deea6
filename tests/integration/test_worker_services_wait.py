"""``regen worker`` with no reachable ledger or broker: one line naming which and where, a bounded
printed wait, then a non-zero exit (issue 59), not Celery's 100 retries under ``redis://:**@``."""

from __future__ import annotations

import time

from tests.support.helpers import cli_env, run_cli

#: Nothing listens here: a service that is down.
DEAD = "127.0.0.1:1"


def test_a_worker_without_its_services_says_which_and_where_waits_the_printed_time_then_exits(settings):
    env = {**cli_env(settings, {}), "DATABASE_URL": f"postgresql://regen@{DEAD}/regen",
           "REDIS_URL": f"redis://{DEAD}/0"}
    start = time.monotonic()
    both = run_cli(["worker", "--gpus", "none", "--services-wait-s", "2"], env, check=False, timeout_s=60)
    assert both.returncode == 2 and time.monotonic() - start < 30
    lines = both.stderr.strip().splitlines()
    assert lines[0].startswith(f"cannot reach the ledger at postgresql://regen@{DEAD}/regen (")
    assert f"nor the broker at redis://{DEAD}/0 (" in lines[0] and lines[0].endswith("waiting up to 2 s (--services-wait-s)")
    assert lines[-1].startswith("error: cannot reach the ledger") and "after 2 s" in lines[-1]
    assert ":**@" not in both.stderr and "Traceback" not in both.stderr

    # The ledger answers, the broker does not: only the broker is named.
    broker_only = run_cli(["worker", "--gpus", "none", "--services-wait-s", "0"],
                          {**cli_env(settings, {}), "REDIS_URL": f"redis://{DEAD}/0"}, check=False, timeout_s=60)
    assert broker_only.returncode == 2
    assert broker_only.stderr.startswith(f"error: cannot reach the broker at redis://{DEAD}/0 (")
    assert "ledger" not in broker_only.stderr.split(" after ")[0]
