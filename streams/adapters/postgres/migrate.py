"""Database schema migrations with Alembic (raw-SQL revisions in ``streams/adapters/postgres/migrations``).

Why Alembic: it is the best-kept migration tool in the Python ecosystem, keeps a
version table, and takes plain SQL (``op.execute``), so the schema stays
readable SQL while the tool handles ordering and "already applied". SQLAlchemy
is used only here, by Alembic; the application speaks psycopg directly.

Migrations run as the owner role (``settings.postgres.owner``), which owns every table.
The connection URL is a :class:`sqlalchemy.engine.URL` built with ``URL.create`` from
the parts (never a formatted string), handed to ``migrations/env.py`` as an object in
the Alembic config's ``attributes``: a password with ``@``, ``/``, ``:``, ``%``,
spaces or quotes reaches libpq unchanged, and ``repr`` of the URL masks it. After an
upgrade to head, the privileges of every table are made equal to :mod:`streams.adapters.postgres.grants`
(idempotent; in the migrations' advisory lock), so an edited matrix or a new table's
entry reaches existing databases with the next ``invoicing db migrate``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import URL

from streams.adapters.postgres import grants
from streams.settings import PostgresSettings

#: The Alembic script folder shipped inside the package.
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

#: Key of the PostgreSQL advisory lock that serialises migrations (migrations/env.py).
MIGRATION_LOCK_KEY = 7_246_011


def url(pg: PostgresSettings) -> URL:
    """The owner's SQLAlchemy URL (``postgresql+psycopg``), built from its parts."""
    return URL.create(
        "postgresql+psycopg",
        username=pg.owner.user,
        password=pg.owner.password.get_secret_value(),
        host=pg.host,
        port=pg.port,
        database=pg.database,
        query={"application_name": "invoicing-migrate", **pg.tls_params()},
    )


def alembic_config(pg: PostgresSettings) -> Config:
    """An Alembic config pointing at ``streams/adapters/postgres/migrations``, with the owner's URL in
    ``config.attributes["url"]`` (an object: never rendered to a string)."""
    config = Config()
    # A filesystem path, not "streams:migrations": importlib.resources cannot read
    # through setuptools' editable-install finder.
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["url"] = url(pg)
    return config


def upgrade(pg: PostgresSettings, revision: str = "head") -> None:
    """Apply every migration up to ``revision`` (a no-op when already there); at head,
    then make every table's privileges equal :mod:`streams.adapters.postgres.grants`.

    Concurrent callers serialise on an advisory lock (see migrations/env.py).

    Raises:
        sqlalchemy.exc.OperationalError: the database refused the owner's login.
        sqlalchemy.exc.ProgrammingError: a migration failed, or a matrix entry names a
            table that does not exist.
    """
    command.upgrade(alembic_config(pg), revision)
    if revision == "head":
        apply_grants(pg)


def apply_grants(pg: PostgresSettings) -> None:
    """Converge the privileges on :mod:`streams.adapters.postgres.grants`, as the owner, in one transaction
    holding the migrations' advisory lock."""
    engine = create_engine(url(pg), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            grants.apply(conn)
    finally:
        engine.dispose()


def current_revision(pg: PostgresSettings) -> str | None:
    """The revision the database is at (``None`` before the first migration)."""
    engine = create_engine(url(pg), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision(pg: PostgresSettings) -> str | None:
    """The newest revision shipped with the code."""
    return ScriptDirectory.from_config(alembic_config(pg)).get_current_head()
