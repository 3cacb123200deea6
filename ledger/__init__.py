"""What the producer and the workers agree on.

The Postgres ledger (runs, batches, samples: the truth about every sample), the
objects it points to (input and output shards in S3, their keys and codec), the
dispatch channel (the Celery app, queues and task message) and the settings that
connect to all three. Nothing here imports vLLM or torch.

Modules::

    models.py       the tables (SQLAlchemy 2); migrate.py applies migrations/
    states.py       every status and the transitions allowed between them
    transitions.py  every status write: the only place a status changes
    runs.py         the run record (RunRecord), read by name or id
    reads.py        read queries on a psycopg connection or a SQLAlchemy session alike (regen status)
    db.py           engine, sessions, retry_db for writes that must outlive a Postgres restart
    reconcile.py    the broker's window of each queue, expired leases, lost messages: from the ledger
    quality.py      quality classes, thresholds, the gate that pauses a run
    dispatch.py     the Celery app, the batch message, publish_messages
    broker.py       what a queue holds (the batch ids waiting), read with redis-py alone
    objects.py      the S3 object store; shards.py the shard codec and keys
    settings.py     Settings; defaults.py defaults both sides share
    errors.py       RegenError and its family; hashing.py config hashes and seeds
"""
