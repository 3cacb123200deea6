"""The batch path: one Celery delivery, from claim to an acknowledged, committed output shard.

In order::

    task.py          the Celery task: thin, takes ids
    delivery.py      one delivery: claim, input shard from S3, generation, upload, commit
    ledger_calls.py  claim (fenced by attempt), heartbeat, release, fail, commit
    held.py          the (batch, attempt)s a process holds: what its heartbeat keeps
    hand_backs.py    what it handed back: not taken again at once, released however slow the ledger
    holding.py       how many batches a process holds for its engine (grown when it runs short)
    backlog.py       the work left on the queues and the GPUs sharing them (Redis), for holding.py
"""
