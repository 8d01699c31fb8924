"""The contract of the close store (tests/contracts/close_store.py) on PostgreSQL
(``streams.core.billing.store.closes``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.close_store import CloseStoreContract
from tests.contracts.stores import StoreHarness


class TestPostgresCloseStore(CloseStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
