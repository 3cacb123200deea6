"""``regen status --watch``: the frame is a pure function of the status dicts; the loop redraws and stops cleanly."""

from __future__ import annotations

import io
from datetime import datetime, timezone

import pytest
from sqlalchemy.exc import OperationalError

from producer.monitoring.watch import (
    CLEAR_BELOW,
    DONE_CELL,
    FAILED_CELL,
    FLIGHT_CELL,
    HIDE_CURSOR,
    HOME,
    SHOW_CURSOR,
    WAITING_CELL,
    format_duration,
    progress_bar,
    render_watch,
    watch,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)


def status(**over) -> dict:
    """A run as producer.monitoring.status.run_status reports it: 1,000 samples, 600 done, 64 in flight."""
    run = {
        "name": "qwen-r1", "model": "/models/Qwen3-27B", "status": "active", "status_reason": None,
        "output": "s3://bucket/regen/qwen-r1", "queue": "regen", "config_hash": "abc", "created_at": "x",
        "samples": {"pending": 300, "done": 600, "failed": 100, "rejected": 8, "duplicates": 1},
        "samples_in_flight": 64,
        "rejected_reasons": {"malformed_json": 8}, "failed_reasons": {"prompt_too_long": 100},
        "batches": {"planned": 0, "queued": 4, "running": 1, "done": 10, "dead": 1},
        "tokens": {"prompt": 234567, "completion": 1234567},
        "throughput": {"window_s": 900.0, "completion_tokens_per_s": 1234.4, "samples_per_s": 0.04, "eta_s": 7500},
        "batch_errors": [{"seq": 17, "status": "dead", "failures": 3, "error": "engine died: CUDA error"}],
        "workers": [{"worker": "gpu0-1@node7", "batches": 1, "heartbeat_at": "x", "heartbeat_age_s": 4.2,
                     "samples": 64}],
    }
    run.update(over)
    return run


def test_bar_splits_done_failed_in_flight_and_waiting_in_proportion():
    bar = progress_bar(600, 100, 64, 236, 50)
    assert bar == "[" + DONE_CELL * 30 + FAILED_CELL * 5 + FLIGHT_CELL * 3 + WAITING_CELL * 12 + "]"


@pytest.mark.parametrize("parts", [(1, 1, 1, 0), (0, 0, 0, 0), (999, 0, 0, 1), (1, 0, 0, 999), (1, 2, 3, 4)])
def test_bar_is_always_as_wide_as_asked(parts):
    assert len(progress_bar(*parts, 37)) == 39


def test_bar_is_full_when_everything_is_done():
    assert progress_bar(10, 0, 0, 0, 20) == "[" + DONE_CELL * 20 + "]"


@pytest.mark.parametrize("seconds, text", [(None, "-"), (12, "12s"), (247, "4m07s"), (7500, "2h05m"),
                                           (273600, "3d04h"), (-3, "0s")])
def test_durations_read_like_a_clock(seconds, text):
    assert format_duration(seconds) == text


def test_frame_shows_bar_percentage_counts_speed_and_eta():
    frame = render_watch([status()], width=100, now=NOW, interval_s=5)
    lines = frame.splitlines()
    assert lines[0] == "regen status · 2026-11-30 12:00:00 UTC · every 5s · Ctrl-C to quit"
    assert "qwen-r1  [active]  model /models/Qwen3-27B  queue regen" in frame
    bar_line = next(line for line in lines if line.startswith("  ["))
    assert bar_line.endswith("]  60.0% done") and len(bar_line) == 100
    cells = bar_line[3:bar_line.index("]")]
    assert len(cells) == 100 - 4 - len("  60.0% done")  # the percentage is padded to 5 characters
    assert cells.count(DONE_CELL) == round(len(cells) * 0.6)
    assert "600 done · 100 failed · 64 in flight · 236 waiting · of 1,000" in frame
    assert "4 queued · 1 running · 10 done · 1 dead" in frame
    assert "rows rejected 8 · duplicates 1" in frame
    assert "1,234 tok/s · 0.04 samples/s (last 15m00s)" in frame
    assert "ETA 2h05m (at 14:05 UTC)" in frame
    assert "1,234,567 generated · 234,567 prompt" in frame
    assert "gpu0-1@node7: 1 running, heartbeat 4s ago" in frame
    assert "! batch 17 [dead, 3 failures]: engine died: CUDA error" in frame
    assert "\x1b[" not in frame  # no colour unless asked


def test_eta_beyond_today_names_the_date():
    frame = render_watch([status(throughput={"window_s": 900.0, "completion_tokens_per_s": 10.0,
                                             "samples_per_s": 0.001, "eta_s": 2 * 86400})], now=NOW)
    assert "ETA 2d00h (at 2026-12-02 12:00 UTC)" in frame


def test_eta_says_why_it_is_unknown():
    stalled = status(throughput={"window_s": 900.0, "completion_tokens_per_s": 0.0, "samples_per_s": 0.0,
                                 "eta_s": None})
    assert "ETA - (no batch committed in the last 15m00s)" in render_watch([stalled], now=NOW)
    paused = status(status="paused", status_reason="quality gate: stub_answer 40% > 5%")
    frame = render_watch([paused], now=NOW)
    assert "[paused: quality gate: stub_answer 40% > 5%]" in frame and "ETA - (paused)" in frame
    finished = status(status="finished", samples={"pending": 0, "done": 900, "failed": 100, "rejected": 0,
                                                  "duplicates": 0}, samples_in_flight=0)
    frame = render_watch([finished], now=NOW)
    assert "nothing left to generate" in frame and " 90.0% done" in frame


def test_token_projection_is_shown_when_status_has_one():
    projected = status(projection={"mean_completion_tokens": 1234.6, "completion_tokens_total": 1234567890,
                                   "completion_tokens_remaining": 5, "eta_s": 9000})
    assert "· 1,234,567,890 projected in all (ETA by tokens 2h30m)" in render_watch([projected], width=140, now=NOW)
    assert "projected" not in render_watch([status()], width=140, now=NOW)


def test_every_line_fits_a_narrow_terminal():
    frame = render_watch([status(model="/very/long/path/" * 10)], width=60, now=NOW)
    assert max(len(line) for line in frame.splitlines()) <= 60


def test_colour_wraps_segments_in_ansi_codes():
    frame = render_watch([status()], now=NOW, color=True)
    assert "\x1b[32m" + DONE_CELL in frame and "\x1b[31m" + FAILED_CELL in frame and "\x1b[0m" in frame


def test_no_runs_says_so():
    assert "no runs" in render_watch([], now=NOW)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_loop_redraws_in_place_on_a_terminal_and_restores_the_cursor():
    out, slept = _Terminal(), []
    code = watch(lambda: [status()], interval_s=2, out=out, width=lambda: 90, now=lambda: NOW, sleep=slept.append,
                 iterations=3, color=False)
    text = out.getvalue()
    assert code == 0 and slept == [2, 2]
    assert text.startswith(HIDE_CURSOR) and text.count(HOME) == 3 and text.count(CLEAR_BELOW) == 3
    assert text.rstrip("\n").endswith(SHOW_CURSOR)


def test_ctrl_c_ends_the_loop_cleanly():
    calls = []

    def fetch():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [status()]

    out = _Terminal()
    assert watch(fetch, interval_s=1, out=out, width=lambda: 90, now=lambda: NOW, sleep=lambda s: None) == 0
    assert len(calls) == 2 and out.getvalue().count(HOME) == 1 and SHOW_CURSOR in out.getvalue()


def test_a_ledger_outage_keeps_the_last_figures_under_a_notice():
    answers = iter([[status()], OperationalError("SELECT 1", {}, Exception("connection refused"))])

    def fetch():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    out = io.StringIO()  # not a terminal: plain frames, one after the other
    watch(fetch, interval_s=1, out=out, width=lambda: 90, now=lambda: NOW, sleep=lambda s: None, iterations=2)
    first, second = out.getvalue().split("regen status ·")[1:]
    assert "ledger unreachable" not in first
    assert "! ledger unreachable (OperationalError); showing the last figures" in second
    assert "600 done" in second and "\x1b[" not in out.getvalue()


def test_frame_says_when_workers_refuse_a_runs_batches():
    refused = [{"reason": "this worker's vLLM cannot build the run's parsers (reasoning 'mistral')", "batches": 12,
                "workers": 3}]
    frame = render_watch([status(refused=refused)], width=200, now=NOW)
    assert ("! REFUSED 12 queued batches, by 3 workers that cannot run them (no failure counted): this worker's "
            "vLLM cannot build the run's parsers (reasoning 'mistral')") in frame
    assert "REFUSED" not in render_watch([status()], width=200, now=NOW)
