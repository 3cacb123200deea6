"""Shared test fixtures: real Postgres, Redis, a moto S3 server over HTTP, the tiny model.

Service fixtures live in their own modules under tests/ and are loaded here as plugins.
"""

# parallel first: services and fault_report import it, and pytest rewrites a plugin's asserts only on first import.
pytest_plugins = ["tests.fixtures.parallel", "tests.fixtures.s3", "tests.fixtures.services", "tests.fixtures.model", "tests.fixtures.worker",
                  "tests.fixtures.engine", "tests.fixtures.fault_report", "tests.fixtures.pgbouncer"]
