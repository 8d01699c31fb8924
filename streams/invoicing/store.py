"""PostgreSQL statements of the invoicing worker (psycopg 3).

Every function takes an open connection and runs inside the caller's
transaction; the caller starts it with :func:`streams.invoicing.fencing.check`
so no write lands without the fence. Rows map to dataclasses, not dicts.

Shapes: money is ``Decimal`` in the currency's units (``NUMERIC``), periods are
``YYYY-MM`` text, times are UTC ``timestamptz``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import class_row

from streams.domain.events import CustomerUpserted, InvoiceIssued, UsageRecorded
from streams.domain.invoice import InvoiceTotals, TaxedLine, UsageLine


class InvoiceNumberTaken(Exception):
    """An invoice number was already used by another document (an integrity error)."""


@dataclass(frozen=True)
class SourceCoordinates:
    """Where a record was read: topic, partition, offset."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class UsageRecord:
    """A ``usage.recorded`` event and where it was read, ready to be stored."""

    event_id: str
    data: UsageRecorded
    source: SourceCoordinates

    @property
    def payload_sha256(self) -> str:
        return payload_hash(self.data)


def payload_hash(data: UsageRecorded) -> str:
    """SHA-256 of the event data's canonical JSON: equal facts, equal hash."""
    canonical = json.dumps(data.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class UsageConflict:
    """An event id already stored with a different payload (never overwritten)."""

    record: UsageRecord
    stored_sha256: str
    stored_source: SourceCoordinates


def upsert_customer(
    conn: psycopg.Connection[Any], event_id: str, data: CustomerUpserted, source: SourceCoordinates
) -> None:
    """Insert or update the customer; an older record (lower offset) never overwrites a newer one."""
    conn.execute(
        """
        INSERT INTO customers (customer_id, name, email, currency, billing_account_id, event_id,
                               source_topic, source_partition, source_offset, updated_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, now())
        ON CONFLICT (customer_id) DO UPDATE SET
            name = EXCLUDED.name, email = EXCLUDED.email, currency = EXCLUDED.currency,
            billing_account_id = EXCLUDED.billing_account_id, event_id = EXCLUDED.event_id,
            source_topic = EXCLUDED.source_topic, source_partition = EXCLUDED.source_partition,
            source_offset = EXCLUDED.source_offset, updated_at = now()
        WHERE customers.source_topic <> EXCLUDED.source_topic
           OR customers.source_offset <= EXCLUDED.source_offset
        """,
        (
            data.customer_id,
            data.name,
            data.email,
            data.currency,
            data.billing_account_id,
            event_id,
            source.topic,
            source.partition,
            source.offset,
        ),
    )


def insert_usage(
    conn: psycopg.Connection[Any], records: Sequence[UsageRecord]
) -> list[UsageConflict]:
    """Store usage lines, deduplicated by event id. Returns the conflicts: event ids
    already stored with a different payload (the stored row is kept as it is).

    A record whose id is stored with the same payload is a duplicate: a no-op.
    """
    if not records:
        return []
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO usage_lines (event_id, customer_id, billing_period, amount, currency, quantity, unit,
                consumed_quantity, consumed_unit, sku_id, description, region_id, charge_category, provider,
                event_time, payload_sha256, source_topic, source_partition, source_offset)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (event_id) DO NOTHING
            """,
            [
                (
                    r.event_id,
                    r.data.customer_id,
                    r.data.billing_period,
                    r.data.amount,
                    r.data.currency,
                    r.data.quantity,
                    r.data.unit,
                    r.data.consumed_quantity,
                    r.data.consumed_unit,
                    r.data.sku_id,
                    r.data.description,
                    r.data.region_id,
                    r.data.charge_category,
                    r.data.provider,
                    r.data.event_time,
                    r.payload_sha256,
                    r.source.topic,
                    r.source.partition,
                    r.source.offset,
                )
                for r in records
            ],
        )
        stored = {
            row[0]: (row[1], SourceCoordinates(row[2], row[3], row[4]))
            for row in cur.execute(
                "SELECT event_id, payload_sha256, source_topic, source_partition, source_offset "
                "FROM usage_lines WHERE event_id = ANY(%s)",
                ([r.event_id for r in records],),
            )
        }
    conflicts: list[UsageConflict] = []
    # The stored row is the first occurrence (an earlier batch, or the first of this
    # batch: executemany inserts in order). A record conflicts only with it; a later
    # exact duplicate of the stored payload is a no-op even when a conflicting record
    # came between them in the batch.
    for record in records:
        stored_digest, stored_source = stored[record.event_id]
        if record.payload_sha256 != stored_digest:
            conflicts.append(UsageConflict(record, stored_digest, stored_source))
    return conflicts


@dataclass(frozen=True)
class Hold:
    hold_id: int
    customer_id: str
    billing_period: str | None
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    created_at: datetime


def open_holds(conn: psycopg.Connection[Any], customer_id: str, billing_period: str) -> list[Hold]:
    """Unreleased holds that block ``customer_id``'s invoice for ``billing_period``."""
    with conn.cursor(row_factory=class_row(Hold)) as cur:
        return cur.execute(
            """
            SELECT hold_id, customer_id, billing_period, reason, source_topic, source_partition,
                   source_offset, created_at
              FROM invoice_holds
             WHERE customer_id = %s AND (billing_period = %s OR billing_period IS NULL)
               AND released_at IS NULL
             ORDER BY hold_id
            """,
            (customer_id, billing_period),
        ).fetchall()


@dataclass(frozen=True)
class Customer:
    customer_id: str
    name: str
    email: str
    currency: str


def get_customer(conn: psycopg.Connection[Any], customer_id: str) -> Customer | None:
    with conn.cursor(row_factory=class_row(Customer)) as cur:
        return cur.execute(
            "SELECT customer_id, name, email, currency FROM customers WHERE customer_id = %s",
            (customer_id,),
        ).fetchone()


def usage_before(
    conn: psycopg.Connection[Any],
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
    before_offset: int,
) -> list[UsageLine]:
    """The customer's usage lines of the period read from ``topic[partition]`` before
    ``before_offset`` (the close marker), ordered by offset (DESIGN §3, invariant 3)."""
    rows = conn.execute(
        """
        SELECT event_id, customer_id, billing_period, amount, currency, quantity, unit, description,
               sku_id, region_id, charge_category, event_time, source_topic, source_partition, source_offset
          FROM usage_lines
         WHERE customer_id = %s AND billing_period = %s
           AND source_topic = %s AND source_partition = %s AND source_offset < %s
         ORDER BY source_offset
        """,
        (customer_id, billing_period, topic, partition, before_offset),
    ).fetchall()
    return [
        UsageLine(
            event_id=r[0],
            customer_id=r[1],
            billing_period=r[2],
            amount=r[3],
            currency=r[4].strip(),
            quantity=r[5],
            unit=r[6],
            description=r[7],
            sku_id=r[8],
            region_id=r[9],
            charge_category=r[10],
            event_time=r[11],
            source_topic=r[12],
            source_partition=r[13],
            source_offset=r[14],
        )
        for r in rows
    ]


@dataclass(frozen=True)
class IssuedInvoice:
    invoice_id: str
    invoice_number: str
    revision: int
    status: str
    subtotal: Decimal
    total: Decimal


def current_invoice(
    conn: psycopg.Connection[Any], customer_id: str, billing_period: str
) -> IssuedInvoice | None:
    """The issued (current) revision of the customer's invoice for the period, if any.

    Raises:
        psycopg.Error: the database failed.
    """
    row = conn.execute(
        "SELECT invoice_id::text, invoice_number, revision, status, subtotal, total FROM invoices "
        "WHERE customer_id = %s AND billing_period = %s AND status = 'issued'",
        (customer_id, billing_period),
    ).fetchone()
    return IssuedInvoice(*row) if row else None


def next_number(conn: psycopg.Connection[Any], series: str) -> int:
    """The next number of ``series``, gapless: the counter row is incremented inside the
    caller's transaction, so a rollback also returns the number."""
    row = conn.execute(
        """
        INSERT INTO document_counters (series, last_value) VALUES (%s, 1)
        ON CONFLICT (series) DO UPDATE SET last_value = document_counters.last_value + 1
        RETURNING last_value
        """,
        (series,),
    ).fetchone()
    assert row is not None  # INSERT … RETURNING always returns the row
    return int(row[0])


def invoice_number(billing_period: str, sequence: int) -> str:
    """Readable invoice number: ``INV-2024-09-000042`` (series per billing period)."""
    return f"INV-{billing_period}-{sequence:06d}"


@dataclass(frozen=True)
class CloseMarker:
    """A ``billing_period.closed`` event and where it was read."""

    event_id: str
    customer_id: str
    billing_period: str
    reason: str
    source: SourceCoordinates
    lease_fencing_token: int | None = None


def record_close(
    conn: psycopg.Connection[Any], marker: CloseMarker, outcome: str, invoice_id: str | None
) -> None:
    """Record that a close marker was handled (idempotent per marker event id)."""
    conn.execute(
        """
        INSERT INTO period_closes (event_id, customer_id, billing_period, reason, outcome, invoice_id,
                                   source_topic, source_partition, source_offset)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (event_id) DO NOTHING
        """,
        (
            marker.event_id,
            marker.customer_id,
            marker.billing_period,
            marker.reason,
            outcome,
            invoice_id,
            marker.source.topic,
            marker.source.partition,
            marker.source.offset,
        ),
    )


@dataclass(frozen=True)
class InvoiceDraft:
    """Everything an invoice revision states, computed outside any transaction."""

    invoice_id: str
    revision: int
    customer: Customer
    billing_period: str
    totals: InvoiceTotals
    lines: tuple[UsageLine, ...]
    taxed: tuple[TaxedLine, ...]
    marker: CloseMarker
    supersedes_invoice_id: str | None = None


def insert_invoice(
    conn: psycopg.Connection[Any],
    draft: InvoiceDraft,
    *,
    number: str,
    fence: tuple[str, int, str] | None,
    lease_fencing_token: int | None,
    issued_at: datetime,
) -> bool:
    """Insert the invoice and its lines. Returns False (nothing written) when the same
    invoice id, a row for (customer, period, revision), or a current revision of
    (customer, period) already exists: ``INSERT … ON CONFLICT DO NOTHING`` (DESIGN
    "Ownership and fencing"; the constraints are in migration 0001).

    Raises:
        InvoiceNumberTaken: the only conflict was ``invoice_number`` (the number
            series fell out of step with the numbers issued): never read as "already
            invoiced", which would leave the customer silently without an invoice.
        psycopg.Error: the database failed.
    """
    totals = draft.totals
    first = min((line.source_offset for line in draft.lines), default=None)
    last = max((line.source_offset for line in draft.lines), default=None)
    row = conn.execute(
        """
        INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period, revision, status,
            customer_name, email, currency, line_count, subtotal, tax_total, total, taxes, close_event_id,
            source_topic, source_partition, first_offset, last_offset, close_offset,
            fence_group, fence_generation, fence_member, lease_fencing_token, supersedes_invoice_id, issued_at)
        VALUES (%s, %s, %s, %s, %s, 'issued', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
                %s, %s, %s, %s, %s, %s)
        ON CONFLICT DO NOTHING
        RETURNING invoice_id
        """,
        (
            draft.invoice_id,
            number,
            draft.customer.customer_id,
            draft.billing_period,
            draft.revision,
            draft.customer.name,
            draft.customer.email,
            totals.currency,
            totals.line_count,
            totals.subtotal,
            totals.tax_total,
            totals.total,
            json.dumps([t.model_dump(mode="json") for t in totals.taxes]),
            draft.marker.event_id,
            draft.marker.source.topic,
            draft.marker.source.partition,
            first,
            last,
            draft.marker.source.offset,
            fence[0] if fence else None,
            fence[1] if fence else None,
            fence[2] if fence else None,
            lease_fencing_token,
            draft.supersedes_invoice_id,
            issued_at,
        ),
    ).fetchone()
    if row is None:
        same = conn.execute(
            """
            SELECT 1 FROM invoices
             WHERE invoice_id = %s
                OR (customer_id = %s AND billing_period = %s
                    AND (revision = %s OR status = 'issued'))
             LIMIT 1
            """,
            (draft.invoice_id, draft.customer.customer_id, draft.billing_period, draft.revision),
        ).fetchone()
        if same is None:
            raise InvoiceNumberTaken(
                f"invoice number {number} is already used by another invoice; "
                f"{draft.customer.customer_id} {draft.billing_period} revision {draft.revision} "
                "was not written (check document_counters against the invoices issued)"
            )
        return False
    taxed = {t.line_id: t for t in draft.taxed}
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, quantity, unit, description,
                sku_id, region_id, tax_code, tax_rate, tax, source_topic, source_partition, source_offset)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            [
                (
                    draft.invoice_id,
                    n,
                    line.event_id,
                    line.amount,
                    line.quantity,
                    line.unit,
                    line.description,
                    line.sku_id,
                    line.region_id,
                    taxed[line.event_id].tax_code,
                    taxed[line.event_id].rate,
                    taxed[line.event_id].tax,
                    line.source_topic,
                    line.source_partition,
                    line.source_offset,
                )
                for n, line in enumerate(draft.lines, start=1)
            ],
        )
    return True


def insert_outbox(
    conn: psycopg.Connection[Any],
    *,
    event_id: str,
    topic: str,
    customer_id: str,
    event: InvoiceIssued | Any,
    source: str,
    time: datetime,
    document_id: str,
) -> None:
    """One outbox row; Debezium's EventRouter routes it to ``topic`` (aggregatetype),
    key = customer id (aggregateid), CloudEvents headers from the ce_* columns."""
    conn.execute(
        """
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, ce_time, document_id)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            event_id,
            topic,
            customer_id,
            event.event_type,
            json.dumps(event.model_dump(mode="json")),
            source,
            time.isoformat().replace("+00:00", "Z"),
            document_id,
        ),
    )
