"""Shared test fixtures: real Postgres, Redis, a moto S3 server over HTTP, the tiny model.

Service fixtures live in their own modules under tests/ and are loaded here as plugins.
"""

pytest_plugins = ["tests.s3_fixtures", "tests.service_fixtures", "tests.model_fixtures", "tests.worker_fixtures",
                  "tests.engine_fixtures", "tests.fault_report"]
