"""The store set: which implementation of each store port a writer of the kernel uses.

The stores are modules of functions that take a connection first
(:mod:`streams.core.billing.store`, :mod:`streams.core.billing.fencing`); a :class:`Stores`
names one implementation of each store port (:mod:`streams.core.billing.ports`) over one
connection type. :data:`POSTGRES` is the PostgreSQL set, the default of every writer
(the invoicing worker, the invoice job, :func:`streams.core.billing.commit.write_fenced`,
:func:`streams.core.billing.issuance.issue`); the in-memory twin's set is
:data:`streams.adapters.memory.stores.MEMORY`, used with an
:class:`~streams.adapters.memory.database.InMemoryDatabase` as the ``Database``.

A writer that receives a ``Database`` and a ``Stores`` must get them over the same
connection type (a psycopg pool with :data:`POSTGRES`, the in-memory database with
the twin's set); the writers type both with ``Any`` connections, so a mismatch is
found by the first statement, not by mypy.

Adding a store port (say ``RatingStore``): a field here, the PostgreSQL module in
:data:`POSTGRES`, the twin's module in ``MEMORY`` (see :mod:`streams.adapters.memory`),
and a contract suite in ``tests/contracts/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psycopg

from streams.core.billing import fencing, store
from streams.core.billing.fencing import Fence, FencingToken, LeaseFence
from streams.core.billing.ports import (
    CloseStore,
    DeadLetterStore,
    DraftStore,
    FenceStore,
    HoldStore,
    InvoiceStore,
    MeteringStore,
    PriceBookStore,
    UsageStore,
)

__all__ = ["POSTGRES", "Stores"]

C = TypeVar("C")


@dataclass(frozen=True)
class Stores(Generic[C]):
    """One implementation of each store port, over connections of type ``C``."""

    usage: UsageStore[C]
    invoices: InvoiceStore[C]
    holds: HoldStore[C]
    closes: CloseStore[C]
    fences: FenceStore[C]
    metering: MeteringStore[C]
    pricing: PriceBookStore[C]
    dead_letters: DeadLetterStore[C]
    drafts: DraftStore[C]

    def check(self, conn: C, fence: Fence) -> None:
        """``fence``'s check with these stores, inside the caller's open transaction:
        a partition fence (:class:`~streams.core.billing.fencing.FencingToken`) through
        ``fences.check``, a lease fence (:class:`~streams.core.billing.fencing.LeaseFence`)
        through ``fences.check_lease_fence``; any other fence checks itself.

        Raises:
            Fenced / LeaseFenced: the fence moved on.
        """
        if isinstance(fence, FencingToken):
            self.fences.check(conn, fence)
        elif isinstance(fence, LeaseFence):
            self.fences.check_lease_fence(conn, fence.lease_name, fence.fencing_token, fence.holder)
        else:  # a fence of its own kind knows only PostgreSQL
            fence.check(conn)  # type: ignore[arg-type]


#: The PostgreSQL stores (the default everywhere).
POSTGRES: Stores[psycopg.Connection[Any]] = Stores(
    usage=store.usage,
    invoices=store.invoices,
    holds=store.holds,
    closes=store.closes,
    fences=fencing,
    metering=store.metering,
    pricing=store.pricing,
    dead_letters=store.dead_letters,
    drafts=store.drafts,
)
