"""Database schema migrations with Alembic (raw-SQL revisions in ``streams/migrations``).

Why Alembic: it is the best-kept migration tool in the Python ecosystem, keeps a
version table, and takes plain SQL (``op.execute``), so the schema stays
readable SQL while the tool handles ordering and "already applied". SQLAlchemy
is used only here, by Alembic; the application speaks psycopg directly.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from streams.settings import PostgresSettings

#: The Alembic script folder shipped inside the package.
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _url(pg: PostgresSettings) -> str:
    password = pg.password.get_secret_value()
    return f"postgresql+psycopg://{pg.user}:{password}@{pg.host}:{pg.port}/{pg.database}"


def alembic_config(pg: PostgresSettings) -> Config:
    """An Alembic config pointing at ``streams/migrations`` and ``pg``."""
    config = Config()
    # A filesystem path, not "streams:migrations": importlib.resources cannot read
    # through setuptools' editable-install finder.
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", _url(pg).replace("%", "%%"))
    return config


def upgrade(pg: PostgresSettings, revision: str = "head") -> None:
    """Apply every migration up to ``revision``; a no-op when already there.

    Concurrent callers serialise on an advisory lock (see migrations/env.py).
    """
    command.upgrade(alembic_config(pg), revision)


def current_revision(pg: PostgresSettings) -> str | None:
    """The revision the database is at (``None`` before the first migration)."""
    engine = create_engine(_url(pg), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision(pg: PostgresSettings) -> str | None:
    """The newest revision shipped with the code."""
    return ScriptDirectory.from_config(alembic_config(pg)).get_current_head()
