"""Helpers that tests import: helpers.py (the CLI, waiting, a required package), finished_run.py
(a committed run without engines), s3_fault_proxy.py (an HTTP proxy that injects S3 faults),
embedded_services.py (the session's own Postgres and Redis, from wheels)."""
