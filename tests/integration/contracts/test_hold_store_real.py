"""The contract of the hold store (tests/contracts/hold_store.py) on PostgreSQL
(``streams.core.billing.store.holds``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.hold_store import HoldStoreContract
from tests.contracts.stores import StoreHarness


class TestPostgresHoldStore(HoldStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
