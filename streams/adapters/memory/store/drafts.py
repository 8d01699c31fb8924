"""Twin of :mod:`streams.core.billing.store.drafts`: ``invoice_drafts`` in memory (the
:class:`~streams.core.billing.ports.DraftStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`), keyed by invoice id: a
draft is created once, re-rated in place only at a later watermark while open, and
finalised once (migration 0024's trigger: a finalised draft never changes). ``lock``
is accepted and has no effect (the twin database serialises transactions).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from decimal import Decimal

from streams.adapters.memory.database import MemoryConnection
from streams.core.billing.rows import CloseMarker, Draft
from streams.core.domain.invoice import InvoiceTotals

__all__ = ["find_draft", "mark_finalized", "open_draft", "open_drafts_on", "save_draft"]

INVOICE_DRAFTS = "invoice_drafts"


def save_draft(
    conn: MemoryConnection,
    *,
    invoice_id: str,
    revision: int,
    marker: CloseMarker,
    watermark_offset: int,
    totals: InvoiceTotals,
    grace_hours: Decimal,
    grace_source: str,
    grace_ends_at: datetime,
    fence: tuple[int, str] | None,
) -> bool:
    """Create the draft, or re-rate the open one at a later watermark (see the original)."""
    del fence  # recorded by PostgreSQL only (not read back)
    with conn.statement("drafts.save_draft") as stmt:
        table = stmt.table(INVOICE_DRAFTS)
        stored: Draft | None = table.get(invoice_id)
        if stored is None:
            table[invoice_id] = Draft(
                invoice_id=invoice_id,
                customer_id=marker.customer_id,
                billing_period=marker.billing_period,
                revision=revision,
                status="draft",
                grace_hours=grace_hours,
                grace_source=grace_source,
                grace_ends_at=grace_ends_at,
                currency=totals.currency,
                line_count=totals.line_count,
                subtotal=totals.subtotal,
                tax_total=totals.tax_total,
                total=totals.total,
                rerated=0,
                close_event_id=marker.event_id,
                lease_fencing_token=marker.lease_fencing_token,
                source_topic=marker.source.topic,
                source_partition=marker.source.partition,
                close_offset=marker.source.offset,
                watermark_offset=watermark_offset,
                created_at=stmt.now,
                updated_at=stmt.now,
                finalized_at=None,
                invoice_number=None,
            )
            return True
        if stored.status != "draft" or stored.watermark_offset >= watermark_offset:
            return False
        table[invoice_id] = replace(
            stored,
            currency=totals.currency,
            line_count=totals.line_count,
            subtotal=totals.subtotal,
            tax_total=totals.tax_total,
            total=totals.total,
            rerated=stored.rerated + 1,
            watermark_offset=watermark_offset,
            updated_at=stmt.now,
        )
        return True


def open_draft(
    conn: MemoryConnection, customer_id: str, billing_period: str, *, lock: bool = False
) -> Draft | None:
    """The open draft of (customer, period), if any."""
    del lock
    with conn.statement("drafts.open_draft") as stmt:
        return next(
            (
                row
                for row in stmt.table(INVOICE_DRAFTS).values()
                if row.customer_id == customer_id
                and row.billing_period == billing_period
                and row.status == "draft"
            ),
            None,
        )


def find_draft(conn: MemoryConnection, invoice_id: str) -> Draft | None:
    """The draft row of ``invoice_id`` (open or finalised), if any."""
    with conn.statement("drafts.find_draft") as stmt:
        found: Draft | None = stmt.table(INVOICE_DRAFTS).get(invoice_id)
        return found


def open_drafts_on(conn: MemoryConnection, topic: str, partition: int) -> list[Draft]:
    """The open drafts whose close marker was read from ``topic[partition]``."""
    with conn.statement("drafts.open_drafts_on") as stmt:
        rows = [
            row
            for row in stmt.table(INVOICE_DRAFTS).values()
            if row.status == "draft"
            and row.source_topic == topic
            and row.source_partition == partition
        ]
        return sorted(rows, key=lambda row: row.grace_ends_at)


def mark_finalized(
    conn: MemoryConnection, invoice_id: str, invoice_number: str, finalized_at: datetime
) -> bool:
    """``draft`` → ``finalized`` with the issued number; False when it was not open."""
    with conn.statement("drafts.mark_finalized") as stmt:
        table = stmt.table(INVOICE_DRAFTS)
        stored: Draft | None = table.get(invoice_id)
        if stored is None or stored.status != "draft":
            return False
        table[invoice_id] = replace(
            stored,
            status="finalized",
            invoice_number=invoice_number,
            finalized_at=finalized_at,
            updated_at=stmt.now,
        )
        return True
