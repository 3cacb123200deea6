"""Broker URLs in Celery's and kombu's log lines as they are configured: no ``:**@`` for a password never set.

kombu masks the password of a URL it logs ("consumer: Cannot connect to redis://:**@127.0.0.1:6379/0")
whether or not there is one, so a Redis without a password reads as one with a password, and a user
looks for credentials nobody set (issue 59). Where the configured URL carries no credentials, this
filter, on the worker's log handlers, takes the mask out again; a URL with a password keeps it.
"""

from __future__ import annotations

import logging

_MASK = "://:**@"


class UnmaskPasswordless(logging.Filter):
    """Rewrites ``scheme://:**@host`` to ``scheme://host`` in a record, where the broker URL has no password."""

    def __init__(self, broker_url: str):
        super().__init__()
        self.active = "@" not in broker_url.split("://", 1)[-1].split("/", 1)[0]

    def filter(self, record: logging.LogRecord) -> bool:
        if self.active:
            message = record.getMessage()
            if _MASK in message:
                record.msg, record.args = message.replace(_MASK, "://"), None
        return True


def install(broker_url: str, logger: logging.Logger | None = None) -> None:
    """Put the filter on every handler of ``logger`` (the root logger by default)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, UnmaskPasswordless) for f in handler.filters):
            handler.addFilter(UnmaskPasswordless(broker_url))
