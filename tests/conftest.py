"""Shared test fixtures: real Postgres, Redis, a moto S3 server over HTTP, the tiny model.

Service fixtures live in their own modules under tests/ and are loaded here as plugins.
"""

import os

# OpenMP threads that sleep, not spin, while they wait: in this process (torch, for the tiny models'
# training) and in every worker process and vLLM engine the tests start (they inherit it). Set before
# anything loads torch, which reads it once. Two xdist workers share the cores, often each with an
# engine, and spinning threads steal them from each other: tests/unit/test_tiny_model.py's training
# test took 135-148 s spinning and 76-88 s passive at a load of 20 (2026-12-02); worker/tiny/model.py
# measured 16x on the training.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# parallel first: services and fault_report import it, and pytest rewrites a plugin's asserts only on its
# first import.
pytest_plugins = ["tests.fixtures.parallel", "tests.fixtures.s3", "tests.fixtures.services", "tests.fixtures.model",
                  "tests.fixtures.worker", "tests.fixtures.engine", "tests.fixtures.fault_report",
                  "tests.fixtures.pgbouncer"]
