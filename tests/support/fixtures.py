"""Fixtures of the integration and chaos tiers: the real stack, unique names, clients.

Imported by tests/integration/conftest.py and tests/chaos/conftest.py.
"""

from __future__ import annotations

import fcntl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from streams.settings import Settings
from tests.support import stack as providers
from tests.support.pipeline import Pipeline, isolated_pipeline


@pytest.fixture(scope="session", autouse=True)
def stack(settings: Settings) -> Iterator[str]:
    """The real stack, started when not running. Fails the session loudly when it cannot.

    Under pytest-xdist every worker process has its own session: they take turns (a file
    lock in the stack's folder) so that one starts the stack and the others find it up.
    """
    name = providers.provider_name()
    lock_path = settings.stack.local_dir / "test-stack.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
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
    client = redis.Redis.from_url(
        settings.redis.url.get_secret_value(), socket_timeout=5, **settings.redis.client_kwargs()
    )
    yield client
    client.close()


@pytest.fixture
def pipeline(
    request: pytest.FixtureRequest, settings: Settings, unique: str, tmp_path: Path
) -> Iterator[Pipeline]:
    """An isolated pipeline for one test (:func:`tests.support.pipeline.isolated_pipeline`).

    Options by marker, e.g. ``@pytest.mark.sandbox(connector=False, smtp=False)`` for a
    test that needs neither invoice events nor emails (2-3 s less per test), or
    ``max_poll_interval_ms=…``: the keyword arguments of ``isolated_pipeline``. A module
    may still define its own ``pipeline`` fixture; this one is the default of every tier.
    """
    marker = request.node.get_closest_marker("sandbox")
    options: dict[str, Any] = dict(marker.kwargs) if marker else {}
    with isolated_pipeline(settings, unique, tmp_path, **options) as p:
        yield p
