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
#: A queued batch younger than this may still have its message in flight: the
#: reconciler republishes it only when the broker is empty and it is older.
QUEUED_GRACE_S = 300.0
#: Samples per batch of ``regen submit``; workers size the batches they hold by it
#: before they have seen one.
DEFAULT_BATCH_SIZE = 64
#: Failed attempts (errors or lost leases) before a batch is dead. Workers take
#: theirs from ``regen worker --max-attempts``.
DEFAULT_MAX_ATTEMPTS = 3
