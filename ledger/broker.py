"""What the broker holds, read with redis-py alone (no Celery import: ``regen status`` reads it too).

kombu's Redis transport keeps a queue's waiting messages in a list of that name
(published with LPUSH, delivered with BRPOP from the other end) and the delivered,
unacknowledged ones in the ``unacked`` hash. Every batch message carries its batch id
in a header of its own (ledger/dispatch.py ``publish_messages``), so the ids on a queue
are read inside Redis, by a script that finds that header in each entry and returns
the ids alone.

Reading a whole queue costs ~5 us per message inside Redis (LRANGE copies each ~1.4 KB
message into the script): 85 ms for 17,000, during which Redis serves no one. So the
reconciler and ``regen status`` read only the **head** (the end BRPOP takes from, the
oldest messages) and only until they have seen what they look for (``find_at_head``);
``missing_messages`` then decides, from the ledger's publish times, which queued
batches have no message, without the rest of the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis as redis_lib

#: The message header holding the batch id.
BATCH_HEADER = "regen_batch"
#: kombu's hash of delivered, unacknowledged messages (ack emulation).
UNACKED_KEY = "unacked"
#: Entries one script call reads when a whole queue is read (``regen requeue``): Redis runs
#: nothing else meanwhile (~5 ms per 1,000).
SCAN_CHUNK = 2000
#: Messages read at the head in one pass at most: ~20 ms of Redis, one atomic script call
#: (so no delivery between chunks shifts what is read), twice the batches a pass examines.
HEAD_SCAN_LIMIT = 4000
#: The reconciler's own publishes (top-ups, republishes) are serialised by its lock, each pass's
#: with one ``enqueued_at``; others (a worker's failed attempt put back, ``regen retry``, ``regen
#: requeue``) may enter the queue out of ``enqueued_at`` order by their transaction's length
#: (milliseconds); a batch counts as "ahead of" a message only when older by more than this.
ORDER_SLACK_S = 1.0
#: Messages per LRANGE of a head read: the read stops within this many of the last one it needs.
HEAD_STEP = 100

# The header's key is matched only right after "{" or ", ": inside a JSON string (a run
# name, a key) a quote is always escaped, so no string of the message can forge it. A plain
# find (memchr), not a pattern: twice as fast on 1.4 KB messages whose header is near the end.
_ID_OF = """
local function id_of(item)
  local p = string.find(item, '"regen_batch": ', 1, true)
  while p do
    local c = string.sub(item, p - 1, p - 1)
    if c == '{' or c == ' ' then return tonumber(string.match(item, '^%d+', p + 15)) end
    p = string.find(item, '"regen_batch": ', p + 1, true)
  end
  return nil
end
"""

_IDS_IN_RANGE = _ID_OF + """
local out = {}
local items = redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])
for i = 1, #items do
  local id = id_of(items[i])
  if id then out[#out + 1] = id end
end
return out
"""

# From the head (index -1, the next BRPOP) toward the tail, ARGV[3] messages per LRANGE, until
# the first ARGV[2] of the wanted ids (ARGV[4..]) are all seen or ARGV[1] messages are read. Returns
# {messages read, queue length, the id of each message read, head first}. One call: atomic.
_FIND_AT_HEAD = _ID_OF + """
local limit, must, step = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local wanted, out = {}, {}
for i = 4, #ARGV do wanted[tonumber(ARGV[i])] = i - 3 end
local length = redis.call('LLEN', KEYS[1])
local read, left = 0, must
while read < limit and read < length and left > 0 do
  local n = math.min(step, limit - read)
  local items = redis.call('LRANGE', KEYS[1], -(read + n), -(read + 1))
  for i = #items, 1, -1 do
    local id = id_of(items[i])
    if id then
      out[#out + 1] = id
      local rank = wanted[id]
      if rank and rank <= must then
        wanted[id] = nil
        left = left - 1
      end
    end
  end
  read = read + #items
  if #items < n then break end
end
return {read, length, unpack(out)}
"""


def ready_length(client: redis_lib.Redis, queue: str) -> int:
    """Messages waiting in ``queue`` (regen publishes without priorities: one list)."""
    return int(client.llen(queue))


def ready_batch_ids(client: redis_lib.Redis, queue: str, *, limit: int) -> set[int] | None:
    """The batch ids of every message waiting in ``queue``; None if it holds more than ``limit``.

    ``regen requeue`` reads a whole queue so (after a Redis loss, when it is short); the
    reconciler and ``regen status`` read the head only (``find_at_head``). Read in chunks,
    not atomically: a message delivered or published meanwhile may be missed or seen. The
    caller acts on a missing id by publishing a second message, which is harmless
    (fencing), so an error costs a duplicate, never a batch.
    """
    length = ready_length(client, queue)
    if length > limit:
        return None
    script = client.register_script(_IDS_IN_RANGE)
    ids: set[int] = set()
    for start in range(0, length, SCAN_CHUNK):
        ids.update(int(i) for i in script(keys=[queue], args=[start, start + SCAN_CHUNK - 1]))
    return ids


@dataclass(frozen=True)
class HeadScan:
    """What ``find_at_head`` saw: the batch ids of the first ``read`` messages of ``length``."""

    seen: frozenset[int]
    read: int
    length: int

    @property
    def whole(self) -> bool:
        return self.read >= self.length


def find_at_head(client: redis_lib.Redis, queue: str, wanted: Sequence[int], *, must: int,
                 limit: int | None = None) -> HeadScan:
    """The messages at the head of ``queue``: read from the next one to be delivered backwards until
    the first ``must`` ids of ``wanted`` are all seen, ``limit`` messages are read, or the queue ends.

    One script call, so no delivery or push lands in the middle of it (Lua's ``unpack`` caps
    ``limit`` below ~7,900).
    """
    script = client.register_script(_FIND_AT_HEAD)
    limit = HEAD_SCAN_LIMIT if limit is None else limit
    read, length, *seen = script(keys=[queue], args=[limit, must, HEAD_STEP, *wanted])
    return HeadScan(frozenset(int(i) for i in seen), int(read), int(length))


@dataclass(frozen=True)
class Queued:
    """A queued batch as the ledger has it: ``enqueued_at``, when its last message was published."""

    id: int
    enqueued_at: datetime


#: The ledger's ``enqueued_at`` of those of the given batch ids that are queued.
EnqueuedAt = Callable[[list[int]], dict[int, datetime]]


def missing_messages(oldest: Sequence[Queued], due: datetime, client: redis_lib.Redis, queue: str,
                     enqueued_at: EnqueuedAt, *, limit: int | None = None,
                     slack_s: float = ORDER_SLACK_S) -> tuple[list[Queued], int]:
    """Of a queue's oldest queued batches (``oldest``), those published before ``due`` whose message
    is not waiting on ``queue``: ``(missing, undecided)``. ``limit``: messages read at most
    (HEAD_SCAN_LIMIT).

    A queue is first in, first out: a message published before another is delivered before
    it. So a batch whose message still waits sits nearer the head than every batch published
    after it, and the oldest queued batches' messages are the first ones at the head. The
    head is read until every batch published before ``due`` is seen: in a healthy queue as
    many messages as there are such batches, however long the queue. A batch not seen there
    has no message waiting when the whole queue was read, or when the message of a batch
    published more than ``slack_s`` after it was seen (``enqueued_at`` looks those up): its
    own would have been ahead of that one. Otherwise (a head crowded with stale deliveries or
    a paused run's messages) it is *undecided*, left for a later pass as the queue moves.

    A wrong "missing" costs a second message, harmless (fencing); it needs a queue out of
    publish order by more than ``slack_s``, or a message at the front (republished) seen
    ahead of more than ``limit`` older ones still waiting.
    """
    due_ones = [b for b in oldest if b.enqueued_at < due]
    if not due_ones:
        return [], 0
    # The due batches first: the read stops once they are all seen.
    later = [b.id for b in oldest if b.enqueued_at >= due]
    scan = find_at_head(client, queue, [b.id for b in due_ones] + later, must=len(due_ones), limit=limit)
    unseen = [b for b in due_ones if b.id not in scan.seen]
    if not unseen or scan.whole:
        return unseen, 0
    known = {b.id: b.enqueued_at for b in oldest}
    times = [known[i] for i in scan.seen if i in known]
    slack = timedelta(seconds=slack_s)
    if not times or max(b.enqueued_at for b in unseen) + slack >= max(times):
        # Witnesses beyond the batches read from the ledger: the other queued ones seen at the head.
        times += enqueued_at([i for i in scan.seen if i not in known]).values()
    if not times:
        return [], len(unseen)
    missing = [b for b in unseen if b.enqueued_at + slack < max(times)]
    return missing, len(unseen) - len(missing)
