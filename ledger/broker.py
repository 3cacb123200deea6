"""What the broker holds, read with redis-py alone (no Celery import: ``regen status`` reads it too).

kombu's Redis transport keeps a queue's waiting messages in a list of that name
(published with LPUSH, delivered with BRPOP) and the delivered, unacknowledged ones
in the ``unacked`` hash. Every batch message carries its batch id in a header of
its own (ledger/dispatch.py ``publish_messages``), so the ids on a queue are read
inside Redis, by a script that matches that header in each entry and returns the
ids alone: a window of 10,000 messages (16 MB) comes back as 10,000 integers.
"""

from __future__ import annotations

import redis as redis_lib

#: The message header holding the batch id.
BATCH_HEADER = "regen_batch"
#: kombu's hash of delivered, unacknowledged messages (ack emulation).
UNACKED_KEY = "unacked"
#: Entries one script call reads: Redis runs nothing else meanwhile (~2 ms per 1,000).
SCAN_CHUNK = 2000

# The header's key is matched only right after "{" or ", ": inside a JSON string (a run
# name, a key) a quote is always escaped, so no string of the message can forge it.
_IDS_IN_RANGE = """
local out = {}
local items = redis.call('LRANGE', KEYS[1], ARGV[1], ARGV[2])
for i = 1, #items do
  local id = string.match(items[i], '[{ ]"regen_batch": (%d+)')
  if id then out[#out + 1] = tonumber(id) end
end
return out
"""


def ready_length(client: redis_lib.Redis, queue: str) -> int:
    """Messages waiting in ``queue`` (regen publishes without priorities: one list)."""
    return int(client.llen(queue))


def ready_batch_ids(client: redis_lib.Redis, queue: str, *, limit: int) -> set[int] | None:
    """The batch ids of the messages waiting in ``queue``; None if it holds more than ``limit``.

    Read in chunks, not atomically: a message delivered or published meanwhile may be
    missed or seen. The caller acts on a missing id by publishing a second message,
    which is harmless (fencing), so an error costs a duplicate, never a batch.
    """
    length = ready_length(client, queue)
    if length > limit:
        return None
    script = client.register_script(_IDS_IN_RANGE)
    ids: set[int] = set()
    for start in range(0, length, SCAN_CHUNK):
        ids.update(int(i) for i in script(keys=[queue], args=[start, start + SCAN_CHUNK - 1]))
    return ids
