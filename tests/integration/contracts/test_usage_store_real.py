"""The contract of the usage store (tests/contracts/usage_store.py) on PostgreSQL
(``streams.core.billing.store.usage``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.stores import StoreHarness
from tests.contracts.usage_store import UsageStoreContract


class TestPostgresUsageStore(UsageStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
