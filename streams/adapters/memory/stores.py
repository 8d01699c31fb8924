"""The twin's store set: :data:`MEMORY`, the in-memory implementation of every store port
(:class:`streams.core.billing.stores.Stores` over
:class:`~streams.adapters.memory.database.MemoryConnection`).

Give it with an :class:`~streams.adapters.memory.database.InMemoryDatabase` as the pool::

    db = InMemoryDatabase()
    worker = InvoicingWorker(settings, pool=db, stores=MEMORY, tax=…, consumer=…, producer=…)
"""

from __future__ import annotations

from streams.adapters.memory import fencing
from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store import (
    closes,
    dead_letters,
    drafts,
    holds,
    invoices,
    metering,
    pricing,
    usage,
)
from streams.core.billing.stores import Stores

__all__ = ["MEMORY"]

#: The in-memory stores (mypy checks each module against its port here).
MEMORY: Stores[MemoryConnection] = Stores(
    usage=usage,
    invoices=invoices,
    holds=holds,
    closes=closes,
    fences=fencing,
    metering=metering,
    pricing=pricing,
    dead_letters=dead_letters,
    drafts=drafts,
)
