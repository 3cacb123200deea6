"""The broker as a window of the ledger, and lost deliveries, against the real Postgres and Redis (no engine).

A "consumer" here is Redis itself: RPOP takes the next message as a worker's BRPOP
does; a message popped and dropped is one that a dead worker holds (or Redis lost).
"""

from __future__ import annotations

import json
import time

import redis as redis_lib
from sqlalchemy import text

from ledger.dispatch import make_celery
from ledger.reconcile import mark_top_ups, reconcile_once, requeue
from producer.monitoring.status import render_status, run_status
from tests.faults.ledger_setup import write_dataset
from worker.batches.ledger_calls import ClaimOutcome, claim_batch

QUEUE = "regen"


def _submit(settings, sessions, tmp_path, bucket, *, run="w", n=20, batch_size=2, window=3):
    from ledger.objects import ObjectStore
    from producer.run_config import build_run_config
    from producer.submit import submit_run

    data = write_dataset(tmp_path / f"{run}.jsonl", n, prefix=run)
    return submit_run(sessions, make_celery(settings), ObjectStore(), [str(data)], run_name=run,
                      config=build_run_config("tiny", max_tokens=8, seed=1), output_url=f"{bucket}/{run}",
                      batch_size=batch_size, queue=QUEUE, window=window)


def _batch_id(raw: bytes) -> int:
    return json.loads(raw)["headers"]["regen_batch"]


def _statuses(sessions, run="w") -> dict[int, str]:
    with sessions() as s:
        return dict(s.execute(text("SELECT b.seq, b.status FROM batches b JOIN runs r ON r.id = b.run_id "
                                   "WHERE r.name = :r ORDER BY b.seq"), {"r": run}).all())


def _age_queued(sessions, seconds: int = 3600) -> None:
    with sessions.begin() as s:
        s.execute(text("UPDATE batches SET enqueued_at = now() - make_interval(secs => :s) WHERE status = 'queued'"),
                  {"s": seconds})


def _pass(sessions, settings, **kw):
    kw.setdefault("grace_s", 60)
    kw.setdefault("window", 3)
    kw.setdefault("lease_s", 60)
    return reconcile_once(sessions, make_celery(settings), max_attempts=3, **kw)


#: A lease short enough that the session's own Postgres is older than it: no lease expires on a server
#: younger than the lease (it may have just restarted, ledger/transitions.py), and a test session's
#: embedded server can be seconds old when this module runs first on its xdist worker.
SHORT_LEASE_S = 5


def _server_older_than(sessions, seconds: float) -> None:
    with sessions() as s:
        age = s.execute(text("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")).scalar()
    time.sleep(max(0.0, seconds + 0.5 - float(age)))


def _seq_of(sessions, batch_id: int) -> int:
    with sessions() as s:
        return s.execute(text("SELECT seq FROM batches WHERE id = :b"), {"b": batch_id}).scalar()


def test_submit_publishes_a_window_and_the_reconciler_tops_it_up_in_seq_order(settings, sessions, tmp_path,
                                                                             s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    report = _submit(settings, sessions, tmp_path, s3_bucket)
    assert (report.batches_new, report.batches_published, report.batches_planned) == (10, 3, 7)
    assert _statuses(sessions) == {1: "queued", 2: "queued", 3: "queued", **{i: "planned" for i in range(4, 11)}}
    assert r.llen(QUEUE) == 3
    # Workers take two messages: the next pass publishes the next two planned batches, no more.
    taken = [_batch_id(r.rpop(QUEUE)) for _ in range(2)]
    assert [_seq_of(sessions, b) for b in taken] == [1, 2]
    report = _pass(sessions, settings)
    assert (report.topped_up, report.republished) == (2, 0)
    assert r.llen(QUEUE) == 3
    assert [s for s, st in _statuses(sessions).items() if st == "planned"] == list(range(6, 11))
    # A full window publishes nothing.
    assert _pass(sessions, settings).topped_up == 0


def test_a_top_up_that_dies_between_its_commit_and_its_publish_is_published_by_a_later_pass(
        settings, sessions, tmp_path, s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, window=3)
    # top_up's transaction, committed; its process dies before the publish (nothing of it reaches Redis).
    marked = mark_top_ups(sessions, make_celery(settings), window=5)
    assert [[_seq_of(sessions, row.id) for row in rows] for rows in marked.values()] == [[4, 5]]
    assert _statuses(sessions)[4] == _statuses(sessions)[5] == "queued" and r.llen(QUEUE) == 3
    # Within their grace period they wait (a publish may be on its way); past it, a pass publishes them.
    assert _pass(sessions, settings).republished == 0 and r.llen(QUEUE) == 3
    _age_queued(sessions)
    report = _pass(sessions, settings)
    assert (report.lost, report.republished, report.topped_up) == (2, 2, 0)
    ids = [_batch_id(m) for m in r.lrange(QUEUE, 0, -1)]
    assert sorted(_seq_of(sessions, b) for b in ids) == [1, 2, 3, 4, 5]


def test_a_delivery_held_by_a_dead_consumer_is_republished_at_the_front_once_per_grace(settings, sessions,
                                                                                       tmp_path, s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, window=5)
    lost = _batch_id(r.rpop(QUEUE))          # delivered to a worker that died before claiming it
    # Within the grace period nothing happens: the delivery may be on its way to a claim.
    report = _pass(sessions, settings)
    assert report.republished == 0 and r.llen(QUEUE) == 4 + report.topped_up
    # Past it, the batches still waiting are left alone, and the lost one is first in line again.
    _age_queued(sessions)
    report = _pass(sessions, settings)
    assert (report.lost, report.republished) == (1, 1)
    assert _batch_id(r.lindex(QUEUE, -1)) == lost
    ids = [_batch_id(m) for m in r.lrange(QUEUE, 0, -1)]
    assert len(ids) == len(set(ids)), "a batch waiting on the queue was published again"
    with sessions() as s:
        assert s.execute(text("SELECT republishes FROM batches WHERE id = :b"), {"b": lost}).scalar() == 1
    # The next pass finds its message waiting: once per grace period, never a flood.
    _age_queued(sessions)
    assert _pass(sessions, settings).republished == 0


def test_expired_leases_go_to_the_front_and_a_flushed_broker_is_rebuilt(settings, sessions, tmp_path, s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, window=4)
    crashed = _batch_id(r.rpop(QUEUE))
    assert claim_batch(sessions, crashed, worker="crashed", lease_s=60).outcome is ClaimOutcome.CLAIMED
    with sessions.begin() as s:
        s.execute(text("UPDATE batches SET heartbeat_at = now() - interval '1 hour' WHERE id = :b"), {"b": crashed})
    _server_older_than(sessions, SHORT_LEASE_S)
    report = _pass(sessions, settings, window=4, lease_s=SHORT_LEASE_S)
    assert report.expired == 1 and _batch_id(r.lindex(QUEUE, -1)) == crashed
    # Redis loses everything: the queued batches past the grace period come back, the window is filled.
    r.flushdb()
    _age_queued(sessions)
    report = _pass(sessions, settings, window=4)
    assert report.lost == 4 and r.llen(QUEUE) == 4
    # `regen requeue` republishes only what is not waiting, then fills the window.
    report = requeue(sessions, make_celery(settings), run="w", lease_s=60, window=6)
    assert (report.republished, report.topped_up) == (0, 2) and r.llen(QUEUE) == 6


def test_one_pass_per_interval_farm_wide(settings, sessions, tmp_path, s3_bucket):
    _submit(settings, sessions, tmp_path, s3_bucket)
    assert _pass(sessions, settings, min_interval_s=60, worker="gpu0@a") is not None
    assert _pass(sessions, settings, min_interval_s=60, worker="gpu0@b") is None
    with sessions() as s:
        assert s.execute(text("SELECT last_pass_by FROM reconciler_state")).scalar() == "gpu0@a"


def test_a_paused_run_is_not_topped_up_and_resume_fills_the_window(settings, sessions, tmp_path, s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket)
    r.delete(QUEUE)                           # its messages were acknowledged without work while paused
    with sessions.begin() as s:
        s.execute(text("UPDATE runs SET status = 'paused' WHERE name = 'w'"))
    _age_queued(sessions)
    report = _pass(sessions, settings)
    assert (report.topped_up, report.republished) == (0, 0) and r.llen(QUEUE) == 0
    with sessions.begin() as s:
        s.execute(text("UPDATE runs SET status = 'active' WHERE name = 'w'"))
    report = requeue(sessions, make_celery(settings), run="w", lease_s=60, window=5)
    assert (report.republished, report.topped_up) == (3, 2) and r.llen(QUEUE) == 5


def test_an_older_run_on_the_same_queue_goes_first(settings, sessions, tmp_path, s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, run="old", window=2)
    _submit(settings, sessions, tmp_path, s3_bucket, run="new", window=2)
    assert r.llen(QUEUE) == 2
    r.delete(QUEUE)
    with sessions.begin() as s:   # both consumed and committed
        s.execute(text("UPDATE batches SET status = 'done' WHERE status = 'queued'"))
    _pass(sessions, settings, window=3)
    assert [_statuses(sessions, "old")[i] for i in (3, 4, 5)] == ["queued"] * 3
    assert set(_statuses(sessions, "new").values()) == {"planned"}


def test_stale_deliveries_are_counted_and_status_shows_a_stall(settings, sessions, tmp_path, s3_bucket):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, window=4)
    first = _batch_id(r.rpop(QUEUE))
    assert claim_batch(sessions, first, worker="a", lease_s=60).outcome is ClaimOutcome.CLAIMED
    # A second message for it (a republished duplicate) is acknowledged without work, and counted.
    assert claim_batch(sessions, first, worker="b", lease_s=60).outcome is ClaimOutcome.HELD_ELSEWHERE
    lost = _batch_id(r.rpop(QUEUE))
    _age_queued(sessions)
    with sessions() as s:
        (run,) = run_status(s, "w", broker_url=settings.redis_url)
        (blind,) = run_status(s, "w")
    assert run["broker"]["stale_deliveries"] == 1
    assert run["broker"]["queued_without_message"] == 1, f"batch {lost} has no message"
    assert blind["broker"]["queued_without_message"] is None
    assert "STALLED   1 queued batches have no message" in render_status([run])
    _pass(sessions, settings, window=4)
    with sessions() as s:
        (run,) = run_status(s, "w", broker_url=settings.redis_url)
    assert (run["broker"]["queued_without_message"], run["broker"]["republishes"]) == (0, 1)


def test_a_lost_message_behind_the_head_read_is_found_by_later_messages_seen_there(settings, sessions, tmp_path,
                                                                                  s3_bucket, monkeypatch):
    # The limits of a 17,000-message queue, scaled down: 2 batches examined, 3 messages read per pass.
    from ledger import broker, reconcile
    from producer.monitoring import status

    monkeypatch.setattr(broker, "HEAD_SCAN_LIMIT", 3)
    monkeypatch.setattr(reconcile, "REPUBLISH_PER_PASS", 2)
    monkeypatch.setattr(status, "BROKER_CHECK_LIMIT", 2)
    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, window=10)
    with sessions.begin() as s:   # published by passes 10 s apart, an hour ago: all past the grace period
        s.execute(text("UPDATE batches SET enqueued_at = now() - interval '1 hour' + seq * interval '10 seconds' "
                       "WHERE status = 'queued'"))
    second = r.lindex(QUEUE, -2)
    lost = _batch_id(second)
    assert _seq_of(sessions, lost) == 2
    r.lrem(QUEUE, 1, second)      # delivered to a consumer that died
    with sessions() as s:
        (run,) = run_status(s, "w", broker_url=settings.redis_url)
    assert run["broker"]["queued_without_message"] == 1
    # Read: seq 1, 3, 4. Seq 2 is not there, and 3 and 4, published after it, are (looked up in the ledger).
    report = _pass(sessions, settings, window=10)
    assert (report.lost, report.topped_up) == (1, 0)
    assert _batch_id(r.lindex(QUEUE, -1)) == lost
    ids = [_batch_id(m) for m in r.lrange(QUEUE, 0, -1)]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 10, "nothing waiting was published again"


def test_requeue_publishes_a_chunk_only_after_its_transaction_commits(settings, sessions, tmp_path, s3_bucket,
                                                                      monkeypatch):
    import ledger.reconcile

    r = redis_lib.Redis.from_url(settings.redis_url)
    _submit(settings, sessions, tmp_path, s3_bucket, window=3)
    r.flushdb()  # the three queued batches lost their messages
    with sessions() as s:
        before = s.scalar(text("SELECT clock_timestamp()"))
    seen: list[tuple[set[int], dict[int, bool]]] = []
    publish = ledger.reconcile._publish_by_queue

    def publish_and_look(app, rows, *, front):
        # What another connection (a worker that takes the message at once) finds as the message goes out.
        ids = {row.id for row in rows}
        with sessions() as s:
            seen.append((ids, dict(s.execute(text("SELECT id, enqueued_at > :t FROM batches WHERE id = ANY(:ids)"),
                                             {"ids": list(ids), "t": before}).all())))
        return publish(app, rows, front=front)

    monkeypatch.setattr(ledger.reconcile, "_publish_by_queue", publish_and_look)
    report = requeue(sessions, make_celery(settings), run="w", lease_s=60, window=3)
    assert report.republished == 3 and r.llen(QUEUE) == 3
    [(ids, marked)] = [call for call in seen if call[0]]
    assert len(ids) == 3 and marked == dict.fromkeys(ids, True), "published before its mark was committed"
