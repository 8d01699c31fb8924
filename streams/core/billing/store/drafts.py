"""``invoice_drafts``: invoices in their grace period (migration 0024).

A draft is what the invoice of (customer, period, revision) would state — rated and
taxed — without a number, an outbox row or an email (docs/invoices.md "Drafts and
finalisation"). The invoicing worker that owns the customer's partition writes it
(:func:`save_draft`, under its partition fence, in the caller's transaction), re-rates
it in place while it is open (the same call, with a later watermark), and finalises it
(:func:`mark_finalized`, in the issuance transaction of the issued invoice). The row
then stays, ``finalized``, with the number it was issued under (trigger
``invoice_draft_guard()``: never deleted, never changed once finalised).

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
Money is ``Decimal`` in the currency's units; times are UTC.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import class_row, scalar_row

from streams.core.billing.rows import CloseMarker, Draft
from streams.core.domain.invoice import InvoiceTotals

__all__ = [
    "drafted_customers",
    "find_draft",
    "mark_finalized",
    "open_draft",
    "open_drafts_on",
    "save_draft",
]

_COLUMNS = (
    "invoice_id::text AS invoice_id, customer_id, billing_period, revision, status, "
    "grace_hours, grace_source, grace_ends_at, trim(currency) AS currency, line_count, "
    "subtotal, tax_total, total, rerated, close_event_id, lease_fencing_token, "
    "source_topic, source_partition, close_offset, watermark_offset, created_at, "
    "updated_at, finalized_at, invoice_number"
)


def save_draft(
    conn: psycopg.Connection[Any],
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
    """Create the draft of ``marker``'s (customer, period), or re-rate the open one in
    place (new figures, ``rerated`` + 1) when ``watermark_offset`` is later than its
    stored one. The grace period and its end are the first close's: a re-rating never
    moves them. Returns False when nothing changed (a finalised draft, or a re-rating
    at a watermark not later than the stored one: a redelivery)."""
    row = conn.execute(
        """
        INSERT INTO invoice_drafts AS d (
            invoice_id, customer_id, billing_period, revision, grace_hours, grace_source,
            grace_ends_at, currency, line_count, subtotal, tax_total, total, close_event_id,
            lease_fencing_token, source_topic, source_partition, close_offset,
            watermark_offset, fence_generation, fence_member)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (invoice_id) DO UPDATE SET
            currency = EXCLUDED.currency, line_count = EXCLUDED.line_count,
            subtotal = EXCLUDED.subtotal, tax_total = EXCLUDED.tax_total,
            total = EXCLUDED.total, rerated = d.rerated + 1,
            watermark_offset = EXCLUDED.watermark_offset,
            fence_generation = EXCLUDED.fence_generation, fence_member = EXCLUDED.fence_member,
            updated_at = now()
        WHERE d.status = 'draft' AND d.watermark_offset < EXCLUDED.watermark_offset
        RETURNING 1
        """,
        (
            invoice_id,
            marker.customer_id,
            marker.billing_period,
            revision,
            grace_hours,
            grace_source,
            grace_ends_at,
            totals.currency,
            totals.line_count,
            totals.subtotal,
            totals.tax_total,
            totals.total,
            marker.event_id,
            marker.lease_fencing_token,
            marker.source.topic,
            marker.source.partition,
            marker.source.offset,
            watermark_offset,
            fence[0] if fence else None,
            fence[1] if fence else None,
        ),
    ).fetchone()
    return row is not None


def open_draft(
    conn: psycopg.Connection[Any], customer_id: str, billing_period: str, *, lock: bool = False
) -> Draft | None:
    """The open (``draft``) draft of (customer, period), if any; with ``lock``, locked
    ``FOR UPDATE`` until the caller's transaction ends."""
    with conn.cursor(row_factory=class_row(Draft)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM invoice_drafts WHERE customer_id = %s "
            "AND billing_period = %s AND status = 'draft'" + (" FOR UPDATE" if lock else ""),
            (customer_id, billing_period),
        ).fetchone()


def find_draft(conn: psycopg.Connection[Any], invoice_id: str) -> Draft | None:
    """The draft row of invoice ``invoice_id`` (open or finalised), if any. A text that
    is not a UUID finds nothing."""
    with conn.cursor(row_factory=class_row(Draft)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM invoice_drafts WHERE invoice_id::text = %s",
            (invoice_id,),
        ).fetchone()


def open_drafts_on(conn: psycopg.Connection[Any], topic: str, partition: int) -> list[Draft]:
    """The open drafts whose close marker was read from ``topic[partition]``: the ones
    the partition's owner re-rates and finalises."""
    with conn.cursor(row_factory=class_row(Draft)) as cur:
        return cur.execute(
            f"SELECT {_COLUMNS} FROM invoice_drafts WHERE status = 'draft' "
            "AND source_topic = %s AND source_partition = %s ORDER BY grace_ends_at",
            (topic, partition),
        ).fetchall()


def drafted_customers(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Customers with an open draft of the period whose close was read from ``topic``
    (a replay leaves them to the owner of their partition)."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                "SELECT customer_id FROM invoice_drafts WHERE status = 'draft' "
                "AND billing_period = %s AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        )


def mark_finalized(
    conn: psycopg.Connection[Any], invoice_id: str, invoice_number: str, finalized_at: datetime
) -> bool:
    """``draft`` → ``finalized`` with the issued number; False when it was not open."""
    row = conn.execute(
        "UPDATE invoice_drafts SET status = 'finalized', invoice_number = %s, "
        "finalized_at = %s, updated_at = now() WHERE invoice_id = %s AND status = 'draft' "
        "RETURNING 1",
        (invoice_number, finalized_at, invoice_id),
    ).fetchone()
    return row is not None
