# install / demo / test / lint / bench. The README's test command is `make test`; CI runs it too.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test test-fast lint

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.sh
	scripts/install.sh $(VENV)
	touch $@

demo: install
	$(PY) scripts/demo.py

# Everything, against real Postgres, Redis, a moto S3 server, Celery workers and vLLM's CPU build.
# Postgres and Redis: the ones answering on 127.0.0.1:5432/:6379, else started from wheels for the
# session (REGEN_TEST_SERVICES=embedded: always; docs/testing.md). -rs names every skip and why.
# On TEST_WORKERS pytest-xdist workers, heaviest test groups first (docs/testing.md says the rules);
# --durations=30 lists where the time went. TEST_WORKERS=0: one process, no xdist.
# Three on CI's 2 cores: many tests wait (leases, grace periods, reconcilers) rather than compute, and a
# third worker fills those waits. Measured on a fresh 2-core machine, tiny models built from scratch
# (2026-12-06): pytest 1,248 s on 2 workers, 1,082 s on 3 (docs/testing.md).
TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest -q -rs --durations=30 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# Unit tests only: no services, no engine.
test-fast: install
	$(PY) -m pytest -q tests/unit

lint: install
	$(VENV)/bin/ruff check ledger targets local producer worker tests scripts bench
