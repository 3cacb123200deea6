"""The dispatch channel: the Celery app, its reliability settings and the task message.

Redis carries only ids and the input shard's key, never prompts, so it can be
flushed and the queue rebuilt from the ledger (``regen requeue``). Every setting
below is there for a measured reason (../shared/notes/celery_reliability.md):
the broker is a best-effort channel and the ledger is the truth.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from celery import Celery

from .settings import Settings

TASK_NAME = "regen.generate_batch"
DEFAULT_QUEUE = "regen"

#: The broker re-delivers an unacknowledged message this long after *delivery*
#: (never refreshed while the task runs). Batches run up to an hour, so it must be
#: far longer than that or a healthy batch runs twice. It is only a safety net:
#: crashed workers are detected by the ledger's heartbeats within minutes.
VISIBILITY_TIMEOUT_S = 6 * 60 * 60


@dataclass(frozen=True)
class BatchMessage:
    """The whole task message: ids and a key. Kwargs, so Flower shows them by name."""

    run: str
    run_id: int
    batch_id: int
    seq: int
    input_key: str

    def kwargs(self) -> dict:
        return asdict(self)


def make_celery(settings: Settings, *, name: str = "regen") -> Celery:
    app = Celery(name, broker=settings.redis_url, set_as_current=False)
    vt = settings.visibility_timeout_s or VISIBILITY_TIMEOUT_S
    app.conf.update(
        # JSON only: a pickle payload from a compromised producer must never execute.
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        # Results live in S3 and the ledger, not in a Celery backend.
        task_ignore_result=True,
        task_default_queue=DEFAULT_QUEUE,
        # Ack only after the batch is uploaded and committed; a lost worker's batch is re-queued.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        # One message reserved per free slot: a busy node must not hoard batches others could run.
        worker_prefetch_multiplier=1,
        broker_transport_options={
            "visibility_timeout": vt,
            # kombu >= 5.7: sweep for expired unacked messages every ~10 s instead of ~100 s.
            "unacked_restore_interval": 10,
            "unacked_restore_throttle": 1,
            "health_check_interval": 25,
            "socket_keepalive": True,
        },
        visibility_timeout=vt,
        # After a broker connection loss the unacked message is redelivered elsewhere;
        # stop our copy instead of running it twice.
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        # Flower needs events and heartbeats.
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
    )
    return app


def publish_batch(app: Celery, message: BatchMessage, *, queue: str) -> None:
    app.send_task(TASK_NAME, kwargs=message.kwargs(), queue=queue)
