"""The Celery task: thin. It takes ids, the logic lives in worker.batches.delivery."""

from __future__ import annotations

from celery import Celery
from celery.exceptions import Reject

from ledger.dispatch import TASK_NAME, BatchMessage
from worker.batches.delivery import Requeue, run_batch
from worker.process.runtime import WorkerRuntime


def register_tasks(app: Celery, runtime: WorkerRuntime) -> None:
    @app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True)
    def batch_task(self, *, run: str, run_id: int, batch_id: int, seq: int, input_key: str) -> dict:
        msg = BatchMessage(run=run, run_id=run_id, batch_id=batch_id, seq=seq, input_key=input_key)
        try:
            outcome = run_batch(runtime, msg)
        except Requeue as e:
            # Back to the broker at once, for another worker (or this one after a restart).
            raise Reject(str(e), requeue=True) from e
        return {"status": outcome.status, "batch_id": outcome.batch_id, "attempt": outcome.attempt,
                "detail": outcome.detail}
