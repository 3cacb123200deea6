"""Stop taking new batches at a deadline (a SLURM job's end less its drain time).

At ``stop_taking_at`` the worker process cancels its consumers (Celery's own remote control,
sent to itself: it runs in the consumer's thread, as Flower's "cancel consumer" does), and
from then on any message that still arrives is handed back unclaimed (worker/batches/delivery.py).
The batches it holds go on and commit. The process then waits for the job's SIGTERM, which
hands back whatever is still running: the time-limit path is the preemption path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

#: How long the cancel request waits for the consumer's reply before it is sent again.
CANCEL_REPLY_S = 5.0


def watch_deadline(at: float, *, stop_taking: threading.Event, stopping: threading.Event,
                   cancel: Callable[[], bool], held: Callable[[], int], name: str,
                   retry_s: float = CANCEL_REPLY_S) -> threading.Thread:
    """Start the thread that, at epoch ``at``, sets ``stop_taking`` and calls ``cancel`` until it succeeds."""

    def run() -> None:
        if stopping.wait(max(0.0, at - time.time())):
            return
        stop_taking.set()
        log.warning("%s: the job ends soon; taking no new batch (holding %d, they go on)", name, held())
        while not stopping.is_set():
            try:
                if cancel():
                    log.info("%s: stopped consuming", name)
                    return
            except Exception as e:  # noqa: BLE001 - the broker may be away; deliveries are refused meanwhile
                log.warning("%s: could not cancel its consumers yet (%s: %s)", name, type(e).__name__, e)
            stopping.wait(retry_s)

    thread = threading.Thread(target=run, name="deadline", daemon=True)
    thread.start()
    return thread


def celery_cancel(app, name: str, queues: tuple[str, ...]) -> Callable[[], bool]:
    """Cancel this worker's consumers of ``queues`` through Celery's remote control; True once it replied."""

    def cancel() -> bool:
        replies = [app.control.cancel_consumer(q, destination=[name], reply=True, timeout=CANCEL_REPLY_S)
                   for q in queues]
        return all(replies)

    return cancel
