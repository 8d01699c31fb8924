"""Twin of :mod:`streams.core.billing.store.holds`: ``invoice_holds`` in memory (the
:class:`~streams.core.billing.ports.HoldStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`).

Kept as PostgreSQL has it: one hold per (source record, customer), ``ON CONFLICT DO
NOTHING``; ``hold_id`` from a sequence (a rolled-back hold leaves a gap, as a
``bigserial`` does); ``reason`` cut to 2,000 characters; ``created_at`` = ``now()``.
Releasing a hold (``invoicing holds release``) is not part of the port: tests use
:func:`release`.
"""

from __future__ import annotations

from dataclasses import replace

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import INVOICE_HOLDS, HoldRow, check_period
from streams.core.billing.rows import Hold, SourceCoordinates

__all__ = ["has_open_hold", "held_customers", "open_holds", "record_hold", "release"]


def record_hold(
    conn: MemoryConnection,
    *,
    customer_id: str,
    billing_period: str | None,
    reason: str,
    event_id: str | None,
    source: SourceCoordinates,
) -> None:
    """Hold ``customer_id``'s invoicing (one period, or all when ``billing_period`` is
    None) because the record at ``source`` was dead-lettered; idempotent per
    (source record, customer)."""
    with conn.statement("holds.record_hold") as stmt:
        check_period(stmt, INVOICE_HOLDS, billing_period)
        hold_id = stmt.next_value("invoice_holds_hold_id_seq")
        table = stmt.table(INVOICE_HOLDS)
        for row in table.values():
            if (
                row.source_topic,
                row.source_partition,
                row.source_offset,
                row.customer_id,
            ) == (source.topic, source.partition, source.offset, customer_id):
                return
        table[hold_id] = HoldRow(
            hold_id=hold_id,
            customer_id=customer_id,
            billing_period=billing_period,
            reason=reason[:2000],
            event_id=event_id,
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            created_at=stmt.now,
        )


def _hold(row: HoldRow) -> Hold:
    return Hold(
        hold_id=row.hold_id,
        customer_id=row.customer_id,
        billing_period=row.billing_period,
        reason=row.reason,
        source_topic=row.source_topic,
        source_partition=row.source_partition,
        source_offset=row.source_offset,
        created_at=row.created_at,
    )


def open_holds(conn: MemoryConnection, customer_id: str, billing_period: str) -> list[Hold]:
    """Unreleased holds that block ``customer_id``'s invoice for ``billing_period``."""
    with conn.statement("holds.open_holds") as stmt:
        rows = [
            row
            for row in stmt.table(INVOICE_HOLDS).values()
            if row.customer_id == customer_id
            and row.billing_period in (billing_period, None)
            and row.released_at is None
        ]
        return [_hold(row) for row in sorted(rows, key=lambda row: row.hold_id)]


def has_open_hold(conn: MemoryConnection, customer_id: str, billing_period: str) -> bool:
    """Whether an unreleased hold blocks ``customer_id``'s invoice for ``billing_period``."""
    return bool(open_holds(conn, customer_id, billing_period))


def held_customers(conn: MemoryConnection, billing_period: str) -> set[str]:
    """Customers with an unreleased hold on the period (or on every period)."""
    with conn.statement("holds.held_customers") as stmt:
        return {
            row.customer_id
            for row in stmt.table(INVOICE_HOLDS).values()
            if row.released_at is None and row.billing_period in (billing_period, None)
        }


def release(conn: MemoryConnection, hold_id: int, *, by: str, note: str) -> bool:
    """Release hold ``hold_id`` (what ``invoicing holds release`` does on PostgreSQL);
    False when it is unknown or released already. Not part of the port."""
    with conn.statement("holds.release") as stmt:
        table = stmt.table(INVOICE_HOLDS)
        row: HoldRow | None = table.get(hold_id)
        if row is None or row.released_at is not None:
            return False
        table[hold_id] = replace(row, released_at=stmt.now, released_by=by, release_note=note)
        return True
