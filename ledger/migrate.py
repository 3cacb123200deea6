"""Run the Alembic migrations shipped in the ``migrations`` package (``regen db upgrade``)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from ledger.errors import ConfigError
from ledger.settings import Settings


def _scripts_config() -> Config:
    """Where the migrations are: all that reading them (not running them) needs."""
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return config


def alembic_config(settings: Settings) -> Config:
    config = _scripts_config()
    # ConfigParser interpolation would choke on a '%' in a password.
    config.set_main_option("sqlalchemy.url", settings.sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade(settings: Settings, revision: str = "head") -> None:
    command.upgrade(alembic_config(settings), revision)


def downgrade(settings: Settings, revision: str) -> None:
    command.downgrade(alembic_config(settings), revision)


def current(settings: Settings) -> str | None:
    from alembic.runtime.migration import MigrationContext

    from ledger.db import make_engine

    engine = make_engine(settings)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def _scripts():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_scripts_config())


def head() -> str:
    """The newest migration this code ships."""
    return _scripts().get_current_head()


def require_head(settings: Settings) -> None:
    """Refuse to work on a ledger at another migration than this code's.

    A worker newer than its ledger writes what the ledger's constraints refuse (a new
    quality class: every commit fails, and every batch dies after its attempts); an
    older one misses columns. Both fail batch by batch, late and noisily; this fails
    once, at start, saying what to run.

    Raises:
        ConfigError: the ledger is behind (run ``regen db upgrade``) or ahead (upgrade regen).
    """
    scripts = _scripts()
    want, have = scripts.get_current_head(), current(settings)
    if have == want:
        return
    if have is None or have in {rev.revision for rev in scripts.walk_revisions()}:
        raise ConfigError(f"the ledger is at migration {have or '(none)'}, this regen needs {want}: run "
                          "`regen db upgrade` first (it is safe while old workers run; start the new ones after)")
    raise ConfigError(f"the ledger is at migration {have}, which this regen ({want}) does not know: a newer "
                      "regen migrated it; install that version on this node")
