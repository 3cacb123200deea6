"""kombu's ``redis://:**@`` in the worker's log lines only where the broker URL has a password (issue 59)."""

from __future__ import annotations

import io
import logging

from kombu import Connection

from worker.process import log_urls


def _logged(broker_url: str) -> str:
    stream = io.StringIO()
    logger = logging.getLogger(f"test-log-urls-{broker_url}")
    logger.propagate = False
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    log_urls.install(broker_url, logger)
    # What Celery's consumer logs when the broker is down, kombu's masked URL as an argument.
    logger.error("consumer: Cannot connect to %s: %s.", Connection(broker_url).as_uri(), "Connection refused")
    logger.removeHandler(handler)
    return stream.getvalue().strip()


def test_a_broker_url_without_a_password_is_logged_as_configured():
    assert _logged("redis://127.0.0.1:6379/0") == \
        "consumer: Cannot connect to redis://127.0.0.1:6379/0: Connection refused."


def test_a_broker_url_with_a_password_keeps_its_mask():
    assert _logged("redis://:secret@127.0.0.1:6379/0") == \
        "consumer: Cannot connect to redis://:**@127.0.0.1:6379/0: Connection refused."
