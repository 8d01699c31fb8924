"""The contract of the hold store (tests/contracts/hold_store.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.hold_store import HoldStoreContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryHoldStore(HoldStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
