"""``regen status --watch``: a live terminal view of every run, redrawn every few seconds.

Plain ANSI escapes (home, clear to end of line/screen, colours), no curses: it works
in any terminal, over ssh and in tmux, and piping it to a file gives one plain
frame per refresh. ``render_watch`` is a pure function of the status dicts of
``producer.monitoring.status.run_status`` (tested with a fixed dict); ``watch`` is the loop.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import TextIO

from sqlalchemy.exc import SQLAlchemyError

from ledger.errors import ConfigError, RunNotFound
from ledger.settings import Settings

from .status import RECENT_WINDOW_S

#: Redraw from the top-left, clearing each line's leftovers, then everything below.
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"
HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
RESET, GREEN, RED, YELLOW, DIM, BOLD = "\x1b[0m", "\x1b[32m", "\x1b[31m", "\x1b[33m", "\x1b[2m", "\x1b[1m"
#: Bar cells: done, failed, in a running batch, waiting. Distinct shapes, so the bar reads without colour.
DONE_CELL, FAILED_CELL, FLIGHT_CELL, WAITING_CELL = "█", "▓", "▒", "░"
#: Narrowest bar worth drawing; the rest of the line holds the percentage.
MIN_BAR = 10
DEFAULT_INTERVAL_S = 5.0


def _paint(text: str, code: str, color: bool) -> str:
    return f"{code}{text}{RESET}" if color and text else text


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def format_duration(seconds: float | None) -> str:
    """``3d04h``, ``2h05m``, ``4m07s``, ``12s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    seconds = max(0, int(round(seconds)))
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def progress_bar(done: int, failed: int, in_flight: int, waiting: int, cells: int, *, color: bool = False) -> str:
    """``[██▓▒▒░░░]``: cumulative boundaries are rounded, so the bar is always ``cells`` wide."""
    total = done + failed + in_flight + waiting
    if total <= 0:
        return "[" + WAITING_CELL * cells + "]"
    bounds, running = [], 0
    for part in (done, failed, in_flight):
        running += part
        bounds.append(round(cells * running / total))
    widths = [bounds[0], bounds[1] - bounds[0], bounds[2] - bounds[1], cells - bounds[2]]
    parts = [(DONE_CELL, GREEN), (FAILED_CELL, RED), (FLIGHT_CELL, YELLOW), (WAITING_CELL, DIM)]
    return "[" + "".join(_paint(cell * n, code, color) for (cell, code), n in zip(parts, widths, strict=True)) + "]"


def _eta_text(run: dict, now: datetime) -> str:
    s, t = run["samples"], run["throughput"]
    if s["pending"] == 0:
        return "nothing left to generate"
    if run["status"] == "paused":
        return "ETA - (paused)"
    if t.get("eta_s") is None:
        return f"ETA - (no batch committed in the last {format_duration(t.get('window_s') or RECENT_WINDOW_S)})"
    finish = now + timedelta(seconds=t["eta_s"])
    when = finish.strftime("%H:%M %Z" if finish.date() == now.date() else "%Y-%m-%d %H:%M %Z").strip()
    return f"ETA {format_duration(t['eta_s'])} (at {when})"


def render_run(run: dict, *, width: int, now: datetime, color: bool = False) -> list[str]:
    s, b, t = run["samples"], run["batches"], run["throughput"]
    total = s["pending"] + s["done"] + s["failed"]
    in_flight = min(s["pending"], int(run.get("samples_in_flight") or 0))
    pct = 100.0 * s["done"] / total if total else 0.0
    state = run["status"] + (f": {run['status_reason']}" if run.get("status_reason") else "")
    state_color = {"active": GREEN, "paused": YELLOW}.get(run["status"], BOLD)
    header = f"{run['name']}  [{state}]  model {run['model']}  queue {run.get('queue', '?')}"
    lines = [_paint(_fit(header, width), state_color, color)]

    suffix = f" {pct:5.1f}% done"
    cells = max(MIN_BAR, width - 2 - 2 - len(suffix))
    bar = progress_bar(s["done"], s["failed"], in_flight, s["pending"] - in_flight, cells, color=color)
    lines.append("  " + bar + suffix)
    counts = (f"  samples  {s['done']:,} done · {s['failed']:,} failed · {in_flight:,} in flight · "
              f"{s['pending'] - in_flight:,} waiting · of {total:,}")
    lines.append(_fit(counts, width))
    batch_text = " · ".join(f"{n:,} {status}" for status, n in b.items() if n) or "none"
    lines.append(_fit(f"  batches  {batch_text}    rows rejected {s.get('rejected', 0):,} · duplicates "
                      f"{s.get('duplicates', 0):,}", width))
    lines.append(_fit(f"  speed    {t['completion_tokens_per_s']:,.0f} tok/s · {t['samples_per_s']:.2f} samples/s "
                      f"(last {format_duration(t['window_s'])})    {_eta_text(run, now)}", width))
    tokens = f"  tokens   {run['tokens']['completion']:,} generated · {run['tokens']['prompt']:,} prompt"
    projection = run.get("projection") or {}
    if projection.get("completion_tokens_total") is not None:
        tokens += (f" · {projection['completion_tokens_total']:,} projected in all"
                   f" (ETA by tokens {format_duration(projection.get('eta_s'))})")
    lines.append(_fit(tokens, width))
    for w in run.get("workers", []):
        age = w.get("heartbeat_age_s")
        beat = f", heartbeat {format_duration(age)} ago" if age is not None else ""
        lines.append(_fit(f"  worker   {w['worker']}: {w['batches']} running{beat}", width))
    for x in run.get("refused", []):
        line = _fit(f"  ! REFUSED {x['batches']:,} queued batches, by {x['workers']:,} workers that cannot run them "
                    f"(no failure counted): {x['reason']}", width)
        lines.append(_paint(line, YELLOW, color))
    for e in run.get("batch_errors", []):
        line = _fit(f"  ! batch {e['seq']} [{e['status']}, {e['failures']} failures]: {e['error']}", width)
        lines.append(_paint(line, RED if e["status"] == "dead" else YELLOW, color))
    return lines


def render_watch(runs: list[dict], *, width: int = 100, now: datetime, interval_s: float | None = None,
                 color: bool = False, notice: str | None = None) -> str:
    """One frame: a header line, then each run's bar, counts, speed, ETA and workers.

    Pure: the same dicts, width and clock give the same text (tested in tests/unit/test_watch.py).
    """
    width = max(40, width)
    every = f" · every {format_duration(interval_s)}" if interval_s else ""
    header = f"regen status · {now.strftime('%Y-%m-%d %H:%M:%S %Z').strip()}{every} · Ctrl-C to quit"
    lines = [_paint(_fit(header, width), BOLD, color)]
    if notice:
        lines.append(_paint(_fit(f"! {notice}", width), RED, color))
    if not runs:
        lines += ["", "no runs"]
    for run in runs:
        lines.append("")
        lines += render_run(run, width=width, now=now, color=color)
    legend = f"{DONE_CELL} done  {FAILED_CELL} failed  {FLIGHT_CELL} in a running batch  {WAITING_CELL} waiting"
    lines += ["", _paint(legend, DIM, color)]
    return "\n".join(lines)


def watch(fetch: Callable[[], list[dict]], *, interval_s: float = DEFAULT_INTERVAL_S, out: TextIO | None = None,
          color: bool | None = None, width: Callable[[], int] | None = None,
          now: Callable[[], datetime] | None = None, sleep: Callable[[float], None] = time.sleep,
          iterations: int | None = None) -> int:
    """Redraw ``fetch()`` every ``interval_s`` until Ctrl-C (or ``iterations`` frames); return 0.

    A ledger that stops answering does not end the view: the last figures stay on
    screen under a notice until it answers again.
    """
    out = out if out is not None else sys.stdout
    tty = out.isatty()
    color = tty if color is None else color
    width = width if width is not None else (lambda: shutil.get_terminal_size().columns)
    now = now if now is not None else (lambda: datetime.now(timezone.utc).astimezone())
    runs: list[dict] = []
    frames = 0
    try:
        if tty:
            out.write(HIDE_CURSOR)
        while True:
            notice = None
            try:
                runs = fetch()
            except SQLAlchemyError as e:
                notice = f"ledger unreachable ({type(e).__name__}); showing the last figures"
            frame = render_watch(runs, width=width(), now=now(), interval_s=interval_s, color=color, notice=notice)
            if tty:
                out.write(HOME + frame.replace("\n", CLEAR_LINE + "\n") + CLEAR_LINE + CLEAR_BELOW)
            else:
                out.write(frame + "\n\n")
            out.flush()
            frames += 1
            if iterations is not None and frames >= iterations:
                return 0
            sleep(interval_s)
    except KeyboardInterrupt:
        return 0
    finally:
        if tty:
            out.write(RESET + SHOW_CURSOR + "\n")
            out.flush()


def watch_status(settings: Settings, run_name: str | None = None, *, interval_s: float = DEFAULT_INTERVAL_S,
                 out: TextIO | None = None, iterations: int | None = None) -> int:
    """``regen status --watch``: the live view of one run (or all), from the ledger every ``interval_s``.

    Raises:
        ConfigError: ``interval_s`` is not positive, or no run is named ``run_name``.
    """
    from ledger.db import make_engine, make_sessionmaker

    from .status import run_status

    if interval_s <= 0:
        raise ConfigError(f"--interval must be positive (got {interval_s})")
    engine = make_engine(settings, pool_size=1, max_overflow=0)
    sessions = make_sessionmaker(engine)

    def fetch() -> list[dict]:
        with sessions() as session:
            return run_status(session, run_name)

    try:
        if run_name is not None and not fetch():
            raise RunNotFound(run_name)
        out = out if out is not None else sys.stdout
        color = out.isatty() and "NO_COLOR" not in os.environ
        return watch(fetch, interval_s=interval_s, out=out, color=color, iterations=iterations)
    finally:
        engine.dispose()
