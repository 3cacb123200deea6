"""Defaults the producer's commands and the workers must agree on, in a module that imports nothing.

The ``regen`` command reads them for its option defaults without importing Celery or
SQLAlchemy; ledger/dispatch.py and ledger/reconcile.py re-export the ones they use.
"""

#: The queue of runs submitted without --queue, and the one workers consume without --queues.
DEFAULT_QUEUE = "regen"
#: Seconds without a heartbeat before a running batch is presumed lost: six missed
#: heartbeats at the workers' 5 s, so a long GC pause or a slow Postgres is not a death,
#: while a dead node's batches are back in work within lease + reconcile interval (< 60 s).
DEFAULT_LEASE_S = 30.0
DEFAULT_HEARTBEAT_S = 5.0
#: How often every worker offers to run the reconciler (one pass at a time farm-wide).
DEFAULT_RECONCILE_S = 10.0
#: A queued batch whose message is neither waiting on its queue nor claimed this long
#: after it was published gets a new one (ledger/reconcile.py): its message was lost, or
#: sits with a consumer that is gone. Younger, the message may still be on its way to a
#: claim (a delivery is claimed within milliseconds; a busy thread pool may take longer,
#: and then the second message only lets another worker take the batch first).
QUEUED_GRACE_S = 60.0
#: Messages the broker holds per queue, waiting: submit publishes up to this many and
#: the reconciler tops the queue up from the ledger's planned batches as workers drain
#: it (ledger/reconcile.py). ~1.45 KB each in Redis: ~15 MB per queue, whatever the run's size,
#: and ~100 s of work for 1,000 GPUs between two reconciler passes 10 s apart.
DEFAULT_QUEUE_WINDOW = 10_000
#: Samples per batch of ``regen submit``; workers size the batches they hold by it
#: before they have seen one.
DEFAULT_BATCH_SIZE = 64
#: Failed attempts (errors or lost leases) before a batch is dead. Workers take
#: theirs from ``regen worker --max-attempts``.
DEFAULT_MAX_ATTEMPTS = 3
