"""The real side of the store contracts: a sandbox PostgreSQL database of their own
(created on the stack's server, migrated to head with Alembic, dropped at the end of
the session), as :func:`streams.devtools.sandbox.pipeline.isolated_pipeline` makes one, without
the Debezium parts the stores do not need."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from streams import bootstrap
from streams.apps.email.store import Deliveries, DeliveryStore
from streams.core.billing.stores import POSTGRES
from streams.settings import Settings
from tests.contracts.stores import StoreHarness
from tests.support.roles import migrated_database


@pytest.fixture(scope="session")
def sandbox_settings(settings: Settings) -> Iterator[Settings]:
    """Settings pointing at a new database ``inv_contract_<hex>`` (created by the
    provisioner, owned by the owner, migrated to head with its grants)."""
    with migrated_database(settings.postgres, f"inv_contract_{uuid.uuid4().hex[:10]}") as pg:
        yield settings.model_copy(update={"postgres": pg})


@pytest.fixture(scope="session")
def sandbox_pool(sandbox_settings: Settings) -> Iterator[ConnectionPool[Any]]:
    pool = bootstrap.postgres_pool(
        # The owner: the contracts are the stores' semantics (tests/integration/test_roles.py
        # has each role's privileges); the triggers of migration 0006 hold for the owner too.
        sandbox_settings,
        name="contract-stores",
        role="owner",
        min_size=1,
        max_size=6,
    )
    yield pool
    pool.close()


@pytest.fixture
def store_harness(sandbox_pool: ConnectionPool[Any]) -> StoreHarness:
    def deliveries(lock_timeout_s: float) -> Deliveries:
        return DeliveryStore(sandbox_pool, lock_timeout_s=lock_timeout_s)

    return StoreHarness(db=sandbox_pool, stores=POSTGRES, deliveries=deliveries, blocked_s=1.0)
