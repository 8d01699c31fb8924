"""The contract of the fence store (tests/contracts/fence_store.py) on PostgreSQL
(``streams.core.billing.fencing``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.fence_store import FenceStoreContract
from tests.contracts.stores import StoreHarness


class TestPostgresFenceStore(FenceStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
