"""Fixtures of the integration and chaos tiers: the real stack, unique names, clients.

Imported by tests/integration/conftest.py and tests/chaos/conftest.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
import redis

from streams.settings import Settings
from tests.support import stack as providers


@pytest.fixture(scope="session", autouse=True)
def stack(settings: Settings) -> Iterator[str]:
    """The real stack, started when not running. Fails the session loudly when it cannot."""
    name = providers.provider_name()
    try:
        if name == "docker":
            handle = providers.start_docker(settings, settings.stack.home)
        else:
            providers.start_local(settings)
            handle = None
    except Exception as exc:  # any failure to start is a test failure, never a skip
        pytest.fail(f"the {name} stack could not be started: {exc}", pytrace=False)
    yield name
    if handle is not None:
        handle.stop()  # type: ignore[attr-defined]


@pytest.fixture
def unique() -> str:
    """A short unique token for topic names, group ids and key prefixes of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def pg(settings: Settings) -> Iterator[psycopg.Connection]:
    """An autocommit connection as the owner (tests inspect rows no runtime role may touch)."""
    with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as conn:
        yield conn


@pytest.fixture
def redis_conn(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=5)
    yield client
    client.close()
