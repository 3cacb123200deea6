"""What regen prints of a DATABASE_URL or REDIS_URL: never a password, wherever the URL carries it."""

from __future__ import annotations

import pytest

from ledger.settings import redact


@pytest.mark.parametrize("url, shown", [
    ("postgresql://regen:pw1@db:5432/regen", "postgresql://regen:***@db:5432/regen"),
    ("postgresql://db/regen?user=regen&password=pw2&sslmode=require",
     "postgresql://db/regen?user=regen&password=***&sslmode=require"),
    ("postgresql://db/regen?sslpassword=pw3", "postgresql://db/regen?sslpassword=***"),
    ("redis://:pw4@redis:6379/0", "redis://:***@redis:6379/0"),
    ("redis://redis:6379/0?Password=pw5", "redis://redis:6379/0?Password=***"),
    ("postgresql://regen:pw6@db/regen?application_name=a@b", "postgresql://regen:***@db/regen?application_name=a@b"),
    ("postgresql://regen@db/regen", "postgresql://regen@db/regen"),
])
def test_a_url_is_printed_without_its_password(url, shown):
    assert redact(url) == shown
    assert "pw" not in redact(url)
