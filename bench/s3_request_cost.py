"""What one ``ObjectStore.put`` (PUT + verifying HEAD) costs against moto's server: per request or per byte?

    python -m bench.s3_request_cost

Puts the same bytes as many 23 KB objects (one 64-row input shard each, as a submit
wrote before packing) and as a few 740 KB ones (32 shards packed), twice each,
alternated, and prints the client's and the server's CPU per put and per MB. The
answer decided how input shards are written (docs/performance.md).
"""

from __future__ import annotations

import os
import sys
import time

import boto3
import psutil

from ledger.objects import ObjectStore
from local.s3 import start_local_s3

BUCKET = "bench-request-cost"
#: (what, puts, bytes each): the same 14 MB either way.
SHAPES = (("64-row shard, 23 KB", 600, 23_000), ("32 shards packed, 740 KB", 20, 740_000))


def _cpu_s(proc: psutil.Process) -> float:
    return sum(proc.cpu_times()[:2])


def main() -> int:
    s3 = start_local_s3()
    try:
        os.environ.update(s3.env())
        boto3.client("s3").create_bucket(Bucket=BUCKET)
        store, moto, me = ObjectStore(), psutil.Process(s3.process.pid), psutil.Process()
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for what, puts, size in SHAPES * 2:
            data = os.urandom(size)
            moto0, me0, t0 = _cpu_s(moto), _cpu_s(me), time.perf_counter()
            for i in range(puts):
                store.put(f"s3://{BUCKET}/{size}/{i}", data)
            server, client, wall = _cpu_s(moto) - moto0, _cpu_s(me) - me0, time.perf_counter() - t0
            mb = puts * size / 1e6
            print(f"{what:26s} {puts:4d} puts: client {client / puts * 1e3:5.2f} ms/put, moto {server / puts * 1e3:5.2f} "
                  f"ms/put, wall {wall / puts * 1e3:5.2f} ms/put; per MB: client {client / mb:.3f} s, moto "
                  f"{server / mb:.3f} s")
    finally:
        s3.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
