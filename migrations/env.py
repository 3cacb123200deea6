"""Alembic environment. ``regen db upgrade`` passes the URL in; see ledger/migrate.py."""

import time

from alembic import context
from sqlalchemy import create_engine, pool

from ledger.models import Base

config = context.config
target_metadata = Base.metadata


#: Held by one `regen db upgrade` at a time: two at once (a compose stack and an operator) must not race.
UPGRADE_LOCK = 727462
#: Between two tries for the lock (seconds): an upgrade takes a fraction of a second to minutes.
UPGRADE_LOCK_POLL_S = 0.5


def _wait_for_upgrade_lock(connection) -> None:
    """Hold UPGRADE_LOCK for the session (the connection closes with it), polled, never waited for.

    At session level: a migration that builds an index CONCURRENTLY (0015) commits mid-way,
    and the lock must outlast that commit. Polled: CREATE INDEX CONCURRENTLY waits for every
    transaction of the database that holds a snapshot, so an upgrade blocked in
    ``pg_advisory_lock`` meanwhile would wait for the build that waits for it (a deadlock,
    seen with three at once); between two tries it holds no snapshot.
    """
    while not connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({UPGRADE_LOCK})").scalar():
        connection.commit()
        time.sleep(UPGRADE_LOCK_POLL_S)
    connection.commit()  # alembic begins its own transaction below


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        _wait_for_upgrade_lock(connection)
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
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
