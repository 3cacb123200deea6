"""The reconciler's read of a queue's head (ledger/broker.py ``missing_messages``) against the real Redis.

The messages are real task messages (ledger/dispatch.py ``publish_messages``); the ledger's
side (which batches are queued, when their last message went out) is given as data, as the
reconciler's query would return it. ``limit`` is small here so that a "long" queue is a few
dozen messages; the benchmark (bench/reconcile_scale.py) runs the same code on 17,000.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import redis as redis_lib

from ledger.broker import HEAD_STEP, Queued, find_at_head, missing_messages
from ledger.dispatch import BatchMessage, make_celery, publish_messages

QUEUE = "regen-head"
T0 = datetime(2026, 12, 1, tzinfo=timezone.utc)


def _publish(settings, ids, *, front=False):
    publish_messages(make_celery(settings), [BatchMessage(run="r", run_id=1, batch_id=i, seq=i, input_key=f"k{i}")
                                             for i in ids], queue=QUEUE, front=front)


def _queued(ids, *, start_s=0):
    """Batches published one second apart, in this order."""
    return [Queued(i, T0 + timedelta(seconds=start_s + n)) for n, i in enumerate(ids)]


def _no_lookup(ids):
    raise AssertionError(f"looked up {ids}: the head alone should decide")


def test_a_healthy_long_queue_is_read_only_as_far_as_its_due_batches(settings):
    r = redis_lib.Redis.from_url(settings.redis_url)
    _publish(settings, range(1, 501))                     # 500 waiting, 1 is next
    oldest = _queued(range(1, 501))
    due = T0 + timedelta(seconds=150)                     # batches 1-150 are past their grace period
    missing, undecided = missing_messages(oldest, due, r, QUEUE, _no_lookup, limit=400)
    assert (missing, undecided) == ([], 0)
    scan = find_at_head(r, QUEUE, [b.id for b in oldest], must=150, limit=400)
    assert (scan.read, scan.length) == (2 * HEAD_STEP, 500) and scan.seen == frozenset(range(1, 201))


def test_a_lost_message_behind_the_limit_is_found_by_a_later_one_seen_ahead(settings):
    r = redis_lib.Redis.from_url(settings.redis_url)
    ids = list(range(1, 101))
    _publish(settings, [i for i in ids if i != 7])        # 7's message is lost (delivered to a dead consumer)
    oldest = _queued(ids)
    missing, undecided = missing_messages(oldest, T0 + timedelta(seconds=30), r, QUEUE, _no_lookup, limit=40,
                                          slack_s=5)
    assert [b.id for b in missing] == [7] and undecided == 0


def test_a_batch_not_seen_with_no_later_message_ahead_is_left_undecided(settings):
    r = redis_lib.Redis.from_url(settings.redis_url)
    # The head is crowded by 50 stale messages (batches done long ago), then batch 1's message.
    _publish(settings, range(1000, 1050))
    _publish(settings, [1, 2])
    oldest = _queued([1, 2], start_s=100)
    looked_up = []

    def enqueued_at(ids):
        looked_up.extend(ids)
        return {}                                          # none of them is queued

    missing, undecided = missing_messages(oldest, T0 + timedelta(seconds=200), r, QUEUE, enqueued_at, limit=20)
    assert (missing, undecided) == ([], 2)
    assert sorted(looked_up) == list(range(1000, 1020))
    # Read to its end, the queue shows both waiting.
    assert missing_messages(oldest, T0 + timedelta(seconds=200), r, QUEUE, _no_lookup, limit=100) == ([], 0)


def test_republished_messages_at_the_front_witness_older_lost_ones(settings):
    r = redis_lib.Redis.from_url(settings.redis_url)
    # A flushed Redis: the last pass republished 30 batches at the front and topped 30 up behind them;
    # batches 1-20, queued longer, are still lost.
    _publish(settings, range(61, 91))
    _publish(settings, range(31, 61), front=True)
    oldest = _queued(range(1, 21))
    recent = {i: T0 + timedelta(seconds=500) for i in range(31, 91)}
    missing, undecided = missing_messages(oldest, T0 + timedelta(seconds=400), r, QUEUE,
                                          lambda ids: {i: recent[i] for i in ids}, limit=25)
    assert [b.id for b in missing] == list(range(1, 21)) and undecided == 0


def test_the_header_is_read_only_where_a_key_of_the_message_can_start(settings):
    r = redis_lib.Redis.from_url(settings.redis_url)
    # A run name holding the header's text cannot forge an id: inside a JSON string the quote is escaped.
    publish_messages(make_celery(settings), [BatchMessage(run='x", "regen_batch": 99, "', run_id=1, batch_id=5,
                                                          seq=1, input_key="k")], queue=QUEUE)
    assert '"regen_batch": 99' not in r.lindex(QUEUE, 0).decode()
    assert json.loads(r.lindex(QUEUE, 0))["headers"]["regen_batch"] == 5
    assert find_at_head(r, QUEUE, [5], must=1).seen == frozenset({5})
