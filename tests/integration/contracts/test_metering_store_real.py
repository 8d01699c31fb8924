"""The contracts of the metering and price book stores (tests/contracts/metering_store.py)
on PostgreSQL (``streams.core.billing.store.metering`` / ``.pricing``) in the sandbox database
of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.metering_store import MeteringStoreContract, PriceBookStoreContract
from tests.contracts.stores import StoreHarness


class TestPostgresMeteringStore(MeteringStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness


class TestPostgresPriceBookStore(PriceBookStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
