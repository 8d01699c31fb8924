"""The contract of the draft store (tests/contracts/draft_store.py) on PostgreSQL
(``streams.core.billing.store.drafts``) in the sandbox database of tests/integration/contracts/conftest.py."""

from __future__ import annotations

import pytest

from tests.contracts.draft_store import DraftStoreContract
from tests.contracts.stores import StoreHarness


class TestPostgresDraftStore(DraftStoreContract):
    @pytest.fixture
    def harness(self, store_harness: StoreHarness) -> StoreHarness:
        return store_harness
