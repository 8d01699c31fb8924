"""The contract of the draft store (tests/contracts/draft_store.py) on the in-memory twin
(:mod:`streams.adapters.memory`), a fresh in-memory database per test."""

from __future__ import annotations

import pytest

from tests.contracts.draft_store import DraftStoreContract
from tests.contracts.stores import StoreHarness
from tests.unit.contracts.twin_stores import memory_harness


class TestInMemoryDraftStore(DraftStoreContract):
    @pytest.fixture
    def harness(self) -> StoreHarness:
        return memory_harness()
