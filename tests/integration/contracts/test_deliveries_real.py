"""The contract of the delivery store (tests/contracts/deliveries.py) on PostgreSQL
(``streams.apps.email.store.DeliveryStore``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.deliveries import DeliveriesContract
from tests.contracts.stores import StoreHarness


class TestPostgresDeliveries(DeliveriesContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
