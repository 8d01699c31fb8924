"""The contract of the fence store (tests/contracts/fence_store.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.fence_store import FenceStoreContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryFenceStore(FenceStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
