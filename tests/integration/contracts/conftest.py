"""The real side of the store contracts: a sandbox PostgreSQL database of their own
(created on the stack's server, migrated to head with Alembic, dropped at the end of
the session), as :func:`streams.sandbox.pipeline.isolated_pipeline` makes one, without
the Debezium parts the stores do not need."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from streams import bootstrap
from streams.adapters import migrate
from streams.billing.stores import POSTGRES
from streams.email.store import Deliveries, DeliveryStore
from streams.settings import Settings
from tests.contracts.stores import StoreHarness


@pytest.fixture(scope="session")
def sandbox_settings(settings: Settings) -> Iterator[Settings]:
    """Settings pointing at a new, migrated database ``inv_contract_<hex>``."""
    database = f"inv_contract_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    sandbox = settings.model_copy(
        update={"postgres": settings.postgres.model_copy(update={"database": database})}
    )
    try:
        migrate.upgrade(sandbox.postgres)
        yield sandbox
    finally:
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )


@pytest.fixture(scope="session")
def sandbox_pool(sandbox_settings: Settings) -> Iterator[ConnectionPool[Any]]:
    pool = bootstrap.postgres_pool(sandbox_settings, name="contract-stores", min_size=1, max_size=6)
    yield pool
    pool.close()


@pytest.fixture
def store_harness(sandbox_pool: ConnectionPool[Any]) -> StoreHarness:
    def deliveries(lock_timeout_s: float) -> Deliveries:
        return DeliveryStore(sandbox_pool, lock_timeout_s=lock_timeout_s)

    return StoreHarness(db=sandbox_pool, stores=POSTGRES, deliveries=deliveries, blocked_s=1.0)
