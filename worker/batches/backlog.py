"""What a worker knows of the work left on its queues, read cheaply enough for 1,000 workers.

Once per heartbeat period each worker process (worker/batches/holding.py) reads:

* from the ledger, one statement (worker/batches/ledger_calls.py ``run_backlog``): the open
  batches of the active runs on its queues (``runs.open_batches``, a counter: planned,
  queued and running) and whether any is still planned (one index probe);
* from Redis, one script call: it registers the worker in a sorted set per queue
  (``regen:holders:<queue>``) with one member per GPU it stands for, scored by Redis's
  own clock, drops members not refreshed for ``stale_s``, and returns the live members
  (the GPUs sharing the queue) and the messages waiting on the queue (LLEN).

At 1,000 workers and a 5 s heartbeat that is 200 small statements/s on Postgres and
200 script calls/s on Redis, each O(log n) or a counter, whatever the ledger's size.
A member per GPU (not a weight per worker) keeps the sum a ZCARD: a fake worker
standing for N GPUs (``--fake-engine gpus=N``) counts N times, as its engine does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis as redis_lib

#: The sorted set of live workers' GPUs of a queue.
HOLDERS_KEY = "regen:holders:{queue}"

# KEYS: the holders set and the ready list of each queue, in pairs. ARGV: worker name, its
# GPUs, seconds after which a member is stale. Redis's TIME, not the hosts' clocks, scores
# the members: a farm's clocks may disagree by more than a heartbeat.
_PROBE = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local stale = tonumber(ARGV[3])
local live, waiting = 0, 0
for q = 1, #KEYS, 2 do
  for i = 0, tonumber(ARGV[2]) - 1 do redis.call('ZADD', KEYS[q], now, ARGV[1] .. '#' .. i) end
  redis.call('ZREMRANGEBYSCORE', KEYS[q], '-inf', now - stale)
  redis.call('EXPIRE', KEYS[q], math.ceil(stale * 4))
  live = math.max(live, redis.call('ZCARD', KEYS[q]))
  waiting = waiting + redis.call('LLEN', KEYS[q + 1])
end
return {live, waiting}
"""


@dataclass(frozen=True)
class Backlog:
    """The work left on a worker's queues, and the GPUs that share it."""

    #: Batches of the active runs not yet done or dead: planned, queued and running (held by anyone).
    open_batches: int
    #: Messages waiting on the queues (not yet delivered to any worker).
    waiting: int
    #: Some batch is still planned: the reconciler will publish more.
    planned: bool
    #: GPUs of the live workers on the queues, this one included.
    live_gpus: int

    @property
    def queue_has_work(self) -> bool:
        """More work may still be taken from the queue (waiting now, or planned and published soon)."""
        return self.waiting > 0 or self.planned


class HolderRegistry:
    """The Redis side of the probe: this worker's GPUs registered, the live GPUs and waiting messages read."""

    def __init__(self, client: redis_lib.Redis, *, name: str, queues: tuple[str, ...], gpus: int, stale_s: float):
        if gpus < 1:
            raise ValueError(f"a worker stands for at least one GPU, not {gpus}")
        self.client, self.name, self.queues, self.gpus, self.stale_s = client, name, queues, gpus, stale_s
        self._script = client.register_script(_PROBE)
        self._keys = [k for q in queues for k in (HOLDERS_KEY.format(queue=q), q)]

    def probe(self) -> tuple[int, int]:
        """Register (refresh) this worker; ``(live GPUs on its queues, messages waiting on them)``."""
        live, waiting = self._script(keys=self._keys, args=[self.name, self.gpus, self.stale_s])
        return int(live), int(waiting)

    def leave(self) -> None:
        """Deregister at shutdown, so the others' shares grow at once rather than after ``stale_s``."""
        members = [f"{self.name}#{i}" for i in range(self.gpus)]
        for q in self.queues:
            self.client.zrem(HOLDERS_KEY.format(queue=q), *members)


def make_probe(registry: HolderRegistry, ledger: Callable[[], tuple[int, bool]]) -> Callable[[], Backlog]:
    """A probe reading the ledger's ``(open batches, any planned)`` and the registry."""

    def probe() -> Backlog:
        open_batches, planned = ledger()
        live, waiting = registry.probe()
        return Backlog(open_batches=open_batches, waiting=waiting, planned=planned, live_gpus=max(live, registry.gpus))

    return probe
