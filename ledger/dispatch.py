"""The dispatch channel: the Celery app, its reliability settings and the task message.

Redis carries only ids and the input shard's key, never prompts, so it can be
flushed and the queue rebuilt from the ledger (``regen requeue``). Every setting
below is there for a measured reason (../shared/notes/celery_reliability.md):
the broker is a best-effort channel and the ledger is the truth.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

from celery import Celery
from kombu.exceptions import KombuError
from kombu.transport.redis import PublishBatch

from ledger.broker import BATCH_HEADER
from ledger.defaults import DEFAULT_QUEUE
from ledger.settings import Settings

log = logging.getLogger(__name__)

TASK_NAME = "regen.generate_batch"
#: Redis commands per pipelined round trip when publishing (kombu's Producer.batch).
PUBLISH_PIPELINE = 1000

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
        # The worker sets its own prefetch count (worker/batches/holding.py: the batches it holds);
        # Celery's reduction after a reconnect would reset it to the pool size later.
        worker_enable_prefetch_count_reduction=False,
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


class _FrontOfQueue(PublishBatch):
    """kombu's Redis publish batch, each message put at the front of its queue.

    kombu publishes with LPUSH and consumers BRPOP, so a new message waits behind every
    other; its own restore of an unacknowledged message uses RPUSH, the next to be
    delivered. A batch the reconciler takes back from a dead consumer goes there too:
    it has waited already, and behind a window of thousands it would wait for hours.
    """

    def add(self, name, *args):
        super().add("rpush" if name == "lpush" else name, *args)


def publish_messages(app: Celery, messages: list[BatchMessage], *, queue: str, attempts: int = 3,
                     front: bool = False) -> None:
    """Publish task messages in pipelined round trips: every batch message goes out here.

    kombu's ``Producer.batch`` buffers the Redis commands of each ``send_task`` (the
    task's LPUSH and the PUBLISH of Flower's task-sent event) and sends them as one
    pipeline per PUBLISH_PIPELINE commands. A failed round trip leaves delivery
    uncertain, so the whole list is sent again: a message delivered twice is harmless
    (the second claim acknowledges without generating), a lost one is not.

    Each message carries its batch id in the ``regen_batch`` header, where the
    reconciler reads it without decoding the body (ledger/broker.py). ``front``: at the
    front of the queue, the next to be delivered (``_FrontOfQueue``).
    """
    if not messages:
        return  # no connection taken for nothing
    for attempt in range(1, attempts + 1):
        try:
            with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_PIPELINE) as batch:
                if front and batch.state.session is None and getattr(producer.channel, "create_publish_batch", None):
                    batch.state.session = _FrontOfQueue(producer.channel, PUBLISH_PIPELINE)
                for message in messages:
                    kwargs = message.kwargs()
                    # Given reprs: Celery would otherwise saferepr() every message (a fifth of the cost).
                    app.send_task(TASK_NAME, kwargs=kwargs, queue=queue, producer=producer, argsrepr="()",
                                  kwargsrepr=repr(kwargs), headers={BATCH_HEADER: message.batch_id})
            return
        except (KombuError, OSError) as e:
            if attempt == attempts:
                raise
            log.warning("publishing %d messages failed (%s); attempt %d of %d in %ds", len(messages), e,
                        attempt + 1, attempts, attempt)
            time.sleep(attempt)
