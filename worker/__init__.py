"""The GPU side: the Celery worker that turns batch messages into committed output shards.

Its rooms, in the order a batch message passes through them::

    process/       regen worker: the launcher, one Celery consumer per GPU group, its runtime
                   (heartbeats, the reconciler), the reaper; every setting (options.py)
    batches/       one delivery, claim to commit: the Celery task, the fenced ledger calls,
                   how many batches a process holds for its engine
    conversation/  a batch's conversations on the engine, each turn on policy: rendering
                   through the model's template, parsing back (targets/), tool results spliced
    engine/        the shared vLLM engine, its admission gate and occupancy; the fake engine
                   (benchmarks, never real data); the engine half of ``regen estimate`` (pilot.py)
    measure/       by-thread CPU and ledger-call timing, switched on for a diagnosis
    tiny/          the offline tiny models for the demo and the tests
"""
