"""Twin of :mod:`streams.core.billing.store.pricing`: the published price book's entries
(``billable_metrics``, ``plan_versions``) in memory (the
:class:`~streams.core.billing.ports.PriceBookStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`).

Kept as PostgreSQL has it: entries keyed by ``metric/<code>`` or
``plan/<code>/<version>``, inserted with ``ON CONFLICT DO NOTHING`` and never changed;
the fingerprint is the pair of counts; the book is every entry assembled by
:func:`streams.core.domain.rating.published.assemble` (an empty book when nothing is
published).
"""

from __future__ import annotations

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import BILLABLE_METRICS, PLAN_VERSIONS
from streams.core.domain.events import BillableMetricPublished
from streams.core.domain.rating import PriceBook
from streams.core.domain.rating.published import Entry, assemble

__all__ = ["book_fingerprint", "insert_entries", "published_book"]


def insert_entries(conn: MemoryConnection, entries: list[Entry], *, published_by: str) -> int:
    """Insert entries not stored yet; returns how many (``published_by`` is not kept)."""
    del published_by
    inserted = 0
    with conn.statement("pricing.insert_entries") as stmt:
        metrics, versions = stmt.table(BILLABLE_METRICS), stmt.table(PLAN_VERSIONS)
        for entry in entries:
            table = metrics if isinstance(entry, BillableMetricPublished) else versions
            key: object = (
                entry.metric_code
                if isinstance(entry, BillableMetricPublished)
                else (entry.plan_code, entry.plan_version)
            )
            if key not in table:
                table[key] = entry
                inserted += 1
    return inserted


def book_fingerprint(conn: MemoryConnection) -> tuple[int, int]:
    """``(metrics, plan versions)`` published (entries are insert-only)."""
    with conn.statement("pricing.book_fingerprint") as stmt:
        return len(stmt.table(BILLABLE_METRICS)), len(stmt.table(PLAN_VERSIONS))


def published_book(conn: MemoryConnection) -> PriceBook:
    """The price book of every stored entry (metrics by code, then plan versions by
    (plan, version)), as :func:`streams.core.billing.store.pricing.published_book`.

    Raises:
        PriceBookError: the stored entries do not make a valid book.
    """
    with conn.statement("pricing.published_book") as stmt:
        metrics, versions = stmt.table(BILLABLE_METRICS), stmt.table(PLAN_VERSIONS)
        entries: list[Entry] = [metrics[k] for k in sorted(metrics)]
        entries.extend(versions[k] for k in sorted(versions))
    return assemble(entries, source="published price book (in-memory twin)")
