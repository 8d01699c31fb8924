"""The contract of the usage store (tests/contracts/usage_store.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.stores import StoreHarness
from tests.contracts.usage_store import UsageStoreContract
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryUsageStore(UsageStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
