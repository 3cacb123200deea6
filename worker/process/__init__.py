"""The worker's processes and their life: started, supervised, stopped, never orphaned.

In order::

    launcher.py   ``regen worker``: one process per GPU group, supervised
    reaper.py     beside it: stops every process of its workers once the launcher is gone
    consumer.py   one worker process: Celery consumer, threads pool (``python -m worker.process.consumer``)
    runtime.py    its shared state: sessions, store, engine, the reconciler; composes held.py, hand_backs.py
    heartbeat.py  the leases of its held attempts and unreleased hand-backs, renewed every beat
    options.py    every worker setting and its default
    orphans.py    PR_SET_PDEATHSIG: a child that dies with its parent
"""
