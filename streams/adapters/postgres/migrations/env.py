"""Alembic environment: online migrations only, serialised by an advisory lock.

The URL comes from the caller (``streams.adapters.postgres.migrate.upgrade``) as a
:class:`sqlalchemy.engine.URL` object in the Alembic config's ``attributes["url"]``
(never a string to parse: any character of a password stays the password); nothing
is read from the environment here.
Two ``migrate`` commands started at once (two workers, two CI jobs) take the same
advisory lock, so the second waits and then finds nothing to do.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool, text

from streams.adapters.postgres.migrate import MIGRATION_LOCK_KEY


def run_migrations_online() -> None:
    url = context.config.attributes.get("url")
    if url is None:
        raise RuntimeError("no database URL: call streams.adapters.postgres.migrate.upgrade()")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        connection.commit()
        try:
            context.configure(connection=connection, transaction_per_migration=True)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
            connection.commit()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")
run_migrations_online()
