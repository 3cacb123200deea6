"""Alembic environment. ``regen db upgrade`` passes the URL in; see ledger/migrate.py."""

from alembic import context
from sqlalchemy import create_engine, pool

from ledger.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            # Two `regen db upgrade` at once (a compose stack and an operator) must not race.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(727462)")
            context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
