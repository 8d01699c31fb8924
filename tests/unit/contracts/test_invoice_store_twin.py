"""The contract of the invoice store (tests/contracts/invoice_store.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.invoice_store import InvoiceStoreContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryInvoiceStore(InvoiceStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
