"""The contract of the delivery store (tests/contracts/deliveries.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.deliveries import DeliveriesContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryDeliveries(DeliveriesContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
