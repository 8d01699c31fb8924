"""The contracts of the metering and price book stores (tests/contracts/metering_store.py)
on the in-memory twins, a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.metering_store import MeteringStoreContract, PriceBookStoreContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryMeteringStore(MeteringStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()


class TestInMemoryPriceBookStore(PriceBookStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
