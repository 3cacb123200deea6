"""Defaults the producer's commands and the workers must agree on, in a module that imports nothing.

The ``regen`` command reads them for its option defaults without importing Celery or
SQLAlchemy; ledger/dispatch.py and ledger/reconcile.py re-export the ones they use.
"""

#: The queue of runs submitted without --queue, and the one workers consume without --queues.
DEFAULT_QUEUE = "regen"
#: Seconds without a heartbeat before a running batch is presumed lost: six missed
#: heartbeats at the workers' 15 s, so a long GC pause or a slow Postgres is not a death.
DEFAULT_LEASE_S = 90.0
#: Failed attempts (errors or lost leases) before a batch is dead. Workers take
#: theirs from ``regen worker --max-attempts``.
DEFAULT_MAX_ATTEMPTS = 3
