"""Run the Alembic migrations shipped in the ``migrations`` package (``regen db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations

from .errors import ConfigError
from .settings import Settings


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    # ConfigParser interpolation would choke on a '%' in a password.
    config.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)


def current(settings: Settings) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from .db import make_engine

    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest migration this code ships."""
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return ScriptDirectory.from_config(config).get_current_head()


def require_head(settings: Settings) -> None:
    """Refuse to work on a ledger at another migration than this code's.

    A worker newer than its ledger writes what the ledger's constraints refuse (a new
    quality class: every commit fails, and every batch dies after its attempts); an
    older one misses columns. Both fail batch by batch, late and noisily; this fails
    once, at start, saying what to run.

    Raises:
        ConfigError: the ledger is behind (run ``regen db upgrade``) or ahead (upgrade regen).
    """
    want, have = head(), current(settings)
    if have == want:
        return
    from alembic.script import ScriptDirectory

    known = {rev.revision for rev in ScriptDirectory.from_config(alembic_config(settings)).walk_revisions()}
    if have is None or have in known:
        raise ConfigError(f"the ledger is at migration {have or '(none)'}, this regen needs {want}: run "
                          "`regen db upgrade` first (it is safe while old workers run; start the new ones after)")
    raise ConfigError(f"the ledger is at migration {have}, which this regen ({want}) does not know: a newer "
                      "regen migrated it; install that version on this node")
