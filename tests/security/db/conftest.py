"""The security tests that need the real stack: a database of their own on its server,
migrated to head with its grants (:func:`tests.support.roles.migrated_database`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from streams.settings import PostgresSettings, Settings
from tests.support.fixtures import redis_conn, stack, unique
from tests.support.roles import migrated_database

__all__ = ["db", "redis_conn", "stack", "unique"]


@pytest.fixture(scope="session")
def db(settings: Settings, stack: str) -> Iterator[PostgresSettings]:
    """PostgreSQL settings pointing at ``inv_security_<hex>``, migrated to head."""
    with migrated_database(settings.postgres, f"inv_security_{uuid.uuid4().hex[:10]}") as pg:
        yield pg
