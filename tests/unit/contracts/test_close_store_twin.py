"""The contract of the close store (tests/contracts/close_store.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.close_store import CloseStoreContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryCloseStore(CloseStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
