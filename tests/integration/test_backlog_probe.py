"""What a worker reads of its queues' backlog (worker/batches/backlog.py): the ledger's counter, Redis's live GPUs and queue."""

from __future__ import annotations

import time

import redis as redis_lib
from sqlalchemy import text

from ledger import transitions
from worker.batches.backlog import HOLDERS_KEY, HolderRegistry, make_probe
from worker.batches.ledger_calls import run_backlog


def _new_run(s, name: str, *, queue: str = "regen", status: str = "active") -> int:
    return s.execute(text(
        "INSERT INTO runs (name, model, sampling, config_hash, output_url, queue, batch_size, status) "
        "VALUES (:n, 'm', '{}', 'h', 's3://b/x', :q, 4, :st) RETURNING id"),
        {"n": name, "q": queue, "st": status}).scalar_one()


def test_the_ledger_backlog_counts_open_batches_of_active_runs_on_the_queues_and_sees_planned_ones(sessions):
    with sessions.begin() as s:
        run = _new_run(s, "left")
        ids = transitions.insert_batches(s, run, [(i, f"k{i}", 4) for i in range(5)])
        other_queue = _new_run(s, "elsewhere", queue="other")
        transitions.insert_batches(s, other_queue, [(0, "k", 4)])
        paused = _new_run(s, "paused", status="paused")
        transitions.insert_batches(s, paused, [(0, "k", 4)])
    assert run_backlog(sessions, ("regen",)) == (5, True)
    with sessions.begin() as s:
        transitions.mark_published(s, ids)                     # all queued now: none planned
        attempt = transitions.claim(s, ids[0], worker="w", lease_s=30)
        assert attempt == 1
        transitions.mark_done(s, ids[0], attempt, output_key="o", output_sha256="x", prompt_tokens=1,
                              completion_tokens=1)
        transitions.claim(s, ids[1], worker="w", lease_s=30)  # running: still open
    assert run_backlog(sessions, ("regen",)) == (4, False)
    assert run_backlog(sessions, ("regen", "other")) == (5, True)     # the other queue's batch is planned
    assert run_backlog(sessions, ("nothing",)) == (0, False)


def test_the_registry_counts_each_workers_gpus_once_drops_the_silent_and_reads_the_queue(redis_url, sessions):
    client = redis_lib.Redis.from_url(redis_url)
    a = HolderRegistry(client, name="a", queues=("regen",), gpus=1, stale_s=1.0)
    b = HolderRegistry(client, name="b", queues=("regen",), gpus=16, stale_s=1.0)
    client.lpush("regen", "m1", "m2", "m3")
    assert a.probe() == (1, 3)
    assert b.probe() == (17, 3)
    assert a.probe() == (17, 3), "a second probe refreshes the worker's members, it does not add to them"
    time.sleep(1.2)                                            # b stopped probing: stale
    assert a.probe() == (1, 3)
    b.probe()
    b.leave()                                                  # a clean stop leaves at once
    assert a.probe() == (1, 3)
    assert 0 < client.ttl(HOLDERS_KEY.format(queue="regen")) <= 4, "an abandoned queue's set expires"
    with sessions.begin() as s:
        transitions.insert_batches(s, _new_run(s, "r"), [(0, "k", 4), (1, "k", 4)])
    backlog = make_probe(b, lambda: run_backlog(sessions, ("regen",)))()
    assert (backlog.open_batches, backlog.waiting, backlog.planned, backlog.live_gpus) == (2, 3, True, 17)
    assert backlog.queue_has_work
