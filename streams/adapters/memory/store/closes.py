"""Twin of :mod:`streams.core.billing.store.closes`: ``period_closes`` in memory (the
:class:`~streams.core.billing.ports.CloseStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`): one row per marker
event id (``ON CONFLICT DO NOTHING``: the first outcome stays), the outcome one of
``invoiced``, ``already_invoiced``, ``held``, ``drafted`` (a check), ``received_at`` = ``now()``.
"""

from __future__ import annotations

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import PERIOD_CLOSES, CloseRow, as_uuid, check_period
from streams.core.billing.rows import CloseMarker

__all__ = ["closed_customers", "record_close"]

_OUTCOMES = frozenset({"invoiced", "already_invoiced", "held", "drafted"})


def record_close(
    conn: MemoryConnection, marker: CloseMarker, outcome: str, invoice_id: str | None
) -> None:
    """Record that a close marker was handled (idempotent per marker event id)."""
    with conn.statement("closes.record_close") as stmt:
        check_period(stmt, PERIOD_CLOSES, marker.billing_period)
        if outcome not in _OUTCOMES:
            raise stmt.check_violation("period_closes_outcome_check", f"outcome {outcome!r}")
        stored_id = as_uuid(stmt, invoice_id, "invoice_id") if invoice_id is not None else None
        table = stmt.table(PERIOD_CLOSES)
        if marker.event_id in table:
            return
        table[marker.event_id] = CloseRow(
            event_id=marker.event_id,
            customer_id=marker.customer_id,
            billing_period=marker.billing_period,
            reason=marker.reason,
            outcome=outcome,
            invoice_id=stored_id,
            source_topic=marker.source.topic,
            source_partition=marker.source.partition,
            source_offset=marker.source.offset,
            received_at=stmt.now,
        )


def closed_customers(conn: MemoryConnection, billing_period: str, topic: str) -> set[str]:
    """Customers whose close marker of the period the workers handled."""
    with conn.statement("closes.closed_customers") as stmt:
        return {
            row.customer_id
            for row in stmt.table(PERIOD_CLOSES).values()
            if row.billing_period == billing_period and row.source_topic == topic
        }
