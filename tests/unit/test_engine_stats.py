"""vLLM's scheduler stats as regen records them (worker/engine/stats.py): a step, a window's line, its parse."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from worker.engine.stats import SchedulerRecorder, SchedulerWindow, added_up, attach, logged_scheduler_windows


def _stats(running, waiting, kv, queries=0, hits=0, skipped=0):
    return SimpleNamespace(num_running_reqs=running, num_waiting_reqs=waiting, num_skipped_waiting_reqs=skipped,
                           kv_cache_usage=kv, prefix_cache_stats=SimpleNamespace(queries=queries, hits=hits))


def test_recorder_adds_steps_and_logs_a_window_that_parses_back(caplog):
    admitted = iter([0, 40])
    rec = SchedulerRecorder(admitted=lambda: next(admitted))
    rec.record(_stats(300, 1200, 0.99, queries=1000, hits=100), SimpleNamespace(num_preempted_reqs=3))
    rec.record(_stats(320, 1180, 0.90, skipped=20), None, None, engine_idx=0)
    rec.record(None, None)  # a step without scheduler stats counts nothing
    with caplog.at_level("INFO", logger="worker.engine.stats"):
        rec.flush()
    [line] = [r.getMessage() for r in caplog.records]
    [w] = logged_scheduler_windows([line])
    assert (w.steps, w.running, w.running_max, w.waiting, w.waiting_max) == (2, 620, 320, 2400, 1200)
    assert (w.preempted, w.kv_full, w.pc_queries, w.pc_hits, w.admitted) == (3, 1, 1000, 100, 40)
    assert w.kv == pytest.approx(1.89)
    assert "running mean 310" in line and "3 preemptions" in line and "full (>= 95%) in 50% of the steps" in line
    assert "prefix cache 10.0% of queried tokens hit" in line and "40 requests admitted" in line
    assert rec.total().steps == 2


def test_windows_add_up_over_a_run():
    a = SchedulerWindow(steps=2, running=10, running_max=6, preempted=1, kv=1.0, admitted=5, at=10.0, over=5.0)
    b = SchedulerWindow(steps=3, running=9, running_max=4, preempted=2, kv=2.5, admitted=1, at=15.0, over=5.0)
    total = added_up([a, b])
    assert (total.steps, total.running, total.running_max, total.preempted, total.admitted) == (5, 19, 6, 3, 6)
    assert total.over == 10.0 and total.at == 15.0
    assert added_up([]).describe() == "no engine step recorded"


def test_attach_needs_an_engine_built_with_stats_on():
    rec = SchedulerRecorder()
    manager = SimpleNamespace(stat_loggers=[])
    assert attach(SimpleNamespace(logger_manager=manager), rec) is rec and manager.stat_loggers == [rec]
    older = SimpleNamespace(per_engine_logger_dict={0: []})
    attach(SimpleNamespace(logger_manager=older), rec)
    assert older.per_engine_logger_dict[0] == [rec]
    with pytest.raises(RuntimeError, match="disable_log_stats=False"):
        attach(SimpleNamespace(logger_manager=None), rec)
    # vLLM's manager calls hooks the recorder does not implement: they are no-ops, not errors.
    rec.record_sleep_state(1, 0)
    rec.record_admission_rejection("full")
