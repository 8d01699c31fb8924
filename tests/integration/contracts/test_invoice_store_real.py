"""The contract of the invoice store (tests/contracts/invoice_store.py) on PostgreSQL
(``streams.core.billing.store.invoices``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.invoice_store import InvoiceStoreContract
from tests.contracts.stores import StoreHarness


class TestPostgresInvoiceStore(InvoiceStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
