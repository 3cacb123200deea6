"""The launcher restarts a worker that crashed, but not one whose engine can never be built (exit 78)."""

from __future__ import annotations

import logging
import sys

from worker.engine.build_errors import EXIT_ENGINE_NEVER_BUILDS
from worker.process.launcher import Launcher, ProcessPlan


def _plan(code: int) -> ProcessPlan:
    return ProcessPlan(name="cpu0@test", devices=(), env={}, argv=(sys.executable, "-c", f"raise SystemExit({code})"))


def test_a_worker_whose_engine_can_never_be_built_is_not_restarted(caplog):
    launcher = Launcher([_plan(EXIT_ENGINE_NEVER_BUILDS)])
    with caplog.at_level(logging.INFO, logger="regen.launcher"):
        assert launcher.run() == 1   # no worker left: the launcher exits non-zero at once
    assert launcher.children[0].starts == 1 and launcher.children[0].gave_up
    assert "cpu0@test stopped: its engine can never be built" in caplog.text
    assert "restarting in" not in caplog.text


def test_a_worker_that_crashed_otherwise_is_restarted(caplog):
    launcher = Launcher([_plan(1)])
    with caplog.at_level(logging.INFO, logger="regen.launcher"):
        launcher._start(launcher.children[0])
        launcher.children[0].proc.wait(timeout=30)
        launcher._on_exit(launcher.children[0], 1)
    assert not launcher.children[0].gave_up and "exited with 1" in caplog.text and "restarting in 2s" in caplog.text
    launcher.reaper.close(wait_s=5)
