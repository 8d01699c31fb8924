"""The store harness on the twins: a fresh in-memory database per test, its store set
(:data:`streams.adapters.memory.stores.MEMORY`) and delivery stores on it."""

from __future__ import annotations

from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.stores import MEMORY
from streams.apps.email.store import Deliveries
from streams.apps.email.twin import InMemoryDeliveryStore
from tests.contracts.stores import StoreHarness

#: "It does not complete" is watched this long on the twin (it serialises transactions,
#: so a blocked writer stays blocked; no need for the real side's second).
BLOCKED_S = 0.3


def memory_harness() -> StoreHarness:
    db = InMemoryDatabase()

    def deliveries(lock_timeout_s: float) -> Deliveries:
        return InMemoryDeliveryStore(db, lock_timeout_s=lock_timeout_s)

    return StoreHarness(db=db, stores=MEMORY, deliveries=deliveries, blocked_s=BLOCKED_S)
