"""``customers`` and ``usage_lines``: who is billed, and the usage they are billed for.

Usage is keyed by event id (DESIGN §3, invariant 3): the same id with the same
payload is a duplicate (a no-op), with another payload a conflict (returned,
the stored line is never overwritten). A customer row is replaced only by a
record read at a higher offset of the same topic.

Every function runs in the caller's transaction (see :mod:`streams.billing.store`).
Shapes: money ``Decimal`` in currency units, periods ``YYYY-MM``, times UTC.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import class_row, scalar_row

from streams.billing.rows import (
    Customer,
    LateUsage,
    SourceCoordinates,
    UsageConflict,
    UsageRecord,
    payload_hash,
)
from streams.domain.events import CustomerUpserted, UsageRecorded
from streams.domain.invoice import UsageLine

__all__ = [
    "customers",
    "customers_with_usage",
    "get_customer",
    "insert_usage",
    "late_usage",
    "stored_payloads",
    "stored_usage_ids",
    "upsert_customer",
    "usage_before",
    "usage_elsewhere",
]


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


@dataclass(frozen=True)
class _StoredUsage:
    event_id: str
    payload_sha256: str
    source_topic: str
    source_partition: int
    source_offset: int


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
    with conn.cursor(row_factory=class_row(_StoredUsage)) as cur:
        stored = {
            found.event_id: found
            for found in cur.execute(
                "SELECT event_id, payload_sha256, source_topic, source_partition, source_offset "
                "FROM usage_lines WHERE event_id = ANY(%s)",
                ([r.event_id for r in records],),
            )
        }
    conflicts: list[UsageConflict] = []
    # A stored hash that differs may be the hash of an older rule (decimals as written,
    # before issue 10): compare those rows by their columns, in canonical form.
    differing = [
        r.event_id for r in records if r.payload_sha256 != stored[r.event_id].payload_sha256
    ]
    canonical = stored_payloads(conn, differing) if differing else {}
    # The stored row is the first occurrence (an earlier batch, or the first of this
    # batch: executemany inserts in order). A record conflicts only with it; a later
    # exact duplicate of the stored payload is a no-op even when a conflicting record
    # came between them in the batch.
    for record in records:
        first = stored[record.event_id]
        same = record.payload_sha256 == first.payload_sha256 or (
            record.event_id in canonical and canonical[record.event_id][0] == record.payload_sha256
        )
        if not same:
            conflicts.append(
                UsageConflict(
                    record,
                    first.payload_sha256,
                    SourceCoordinates(
                        first.source_topic, first.source_partition, first.source_offset
                    ),
                )
            )
    return conflicts


@dataclass(frozen=True)
class _StoredPayload:
    event_id: str
    customer_id: str
    billing_period: str
    amount: Decimal
    currency: str
    quantity: Decimal | None
    unit: str | None
    consumed_quantity: Decimal | None
    consumed_unit: str | None
    sku_id: str | None
    description: str | None
    region_id: str | None
    charge_category: str | None
    provider: str | None
    event_time: datetime
    source_topic: str
    source_partition: int
    source_offset: int


def stored_payloads(
    conn: psycopg.Connection[Any], event_ids: Sequence[str]
) -> dict[str, tuple[str, SourceCoordinates]]:
    """event id → (:func:`~streams.billing.rows.payload_hash` of the stored line, read
    back from its columns, and where it was read), for those of ``event_ids`` stored.

    The hash is computed from the columns, so it follows the current hashing rule
    whatever rule ``payload_sha256`` was written under.
    """
    if not event_ids:
        return {}
    with conn.cursor(row_factory=class_row(_StoredPayload)) as cur:
        found = cur.execute(
            """
            SELECT event_id, customer_id, billing_period, amount, trim(currency) AS currency,
                   quantity, unit, consumed_quantity, consumed_unit, sku_id, description,
                   region_id, charge_category, provider, event_time,
                   source_topic, source_partition, source_offset
              FROM usage_lines WHERE event_id = ANY(%s)
            """,
            (list(set(event_ids)),),
        ).fetchall()
    result: dict[str, tuple[str, SourceCoordinates]] = {}
    for row in found:
        data = UsageRecorded.model_construct(
            schema_version=1,
            customer_id=row.customer_id,
            billing_period=row.billing_period,
            amount=row.amount,
            currency=row.currency,
            quantity=row.quantity,
            unit=row.unit,
            consumed_quantity=row.consumed_quantity,
            consumed_unit=row.consumed_unit,
            sku_id=row.sku_id,
            description=row.description,
            region_id=row.region_id,
            charge_category=row.charge_category,
            event_time=row.event_time.astimezone(UTC),
            provider=row.provider,
        )
        source = SourceCoordinates(row.source_topic, row.source_partition, row.source_offset)
        result[row.event_id] = (payload_hash(data), source)
    return result


def get_customer(conn: psycopg.Connection[Any], customer_id: str) -> Customer | None:
    """The stored customer row of ``customer_id``, if any."""
    with conn.cursor(row_factory=class_row(Customer)) as cur:
        return cur.execute(
            "SELECT customer_id, name, email, currency FROM customers WHERE customer_id = %s",
            (customer_id,),
        ).fetchone()


def customers(conn: psycopg.Connection[Any], ids: Sequence[str]) -> dict[str, Customer]:
    """customer id → the stored customer row, for those of ``ids`` that have one."""
    with conn.cursor(row_factory=class_row(Customer)) as cur:
        rows = cur.execute(
            "SELECT customer_id, name, email, currency FROM customers WHERE customer_id = ANY(%s)",
            (list(ids),),
        ).fetchall()
    return {row.customer_id: row for row in rows}


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
    with conn.cursor(row_factory=class_row(UsageLine)) as cur:
        return cur.execute(
            """
            SELECT event_id, customer_id, billing_period, amount, trim(currency) AS currency,
                   quantity, unit, description, sku_id, region_id, charge_category, event_time,
                   source_topic, source_partition, source_offset
              FROM usage_lines
             WHERE customer_id = %s AND billing_period = %s
               AND source_topic = %s AND source_partition = %s AND source_offset < %s
             ORDER BY source_offset
            """,
            (customer_id, billing_period, topic, partition, before_offset),
        ).fetchall()


def usage_elsewhere(
    conn: psycopg.Connection[Any],
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
) -> list[UsageLine]:
    """The customer's usage lines of the period read from ``topic`` on any partition but
    ``partition``, ordered by (partition, offset). Non-empty only after the topic
    gained partitions and moved the customer (DESIGN §5; docs/operations.md)."""
    with conn.cursor(row_factory=class_row(UsageLine)) as cur:
        return cur.execute(
            """
            SELECT event_id, customer_id, billing_period, amount, trim(currency) AS currency,
                   quantity, unit, description, sku_id, region_id, charge_category, event_time,
                   source_topic, source_partition, source_offset
              FROM usage_lines
             WHERE customer_id = %s AND billing_period = %s
               AND source_topic = %s AND source_partition <> %s
             ORDER BY source_partition, source_offset
            """,
            (customer_id, billing_period, topic, partition),
        ).fetchall()


def stored_usage_ids(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Event ids of the period in ``usage_lines`` read from ``topic``."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                "SELECT event_id FROM usage_lines WHERE billing_period = %s AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        )


def customers_with_usage(
    conn: psycopg.Connection[Any], billing_period: str, topic: str
) -> set[str]:
    """Customers with a usage line of the period read from ``topic``."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return {
            str(customer)
            for customer in cur.execute(
                "SELECT DISTINCT customer_id FROM usage_lines "
                "WHERE billing_period = %s AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        }


def late_usage(conn: psycopg.Connection[Any], period: str | None = None) -> list[LateUsage]:
    """Usage recorded for a (customer, period) whose issued invoice does not include it.

    The policy (docs/replay.md "Late usage"): late usage is stored by the worker,
    listed here (``invoicing status``) and in the next ``invoicing replay PERIOD
    --dry-run`` as "usage not invoiced", and invoiced by the next ``--apply`` as a
    credit note plus a new revision — after which it is no longer listed.

    Args:
        conn: any connection (read-only query; runs in the caller's transaction if any).
        period: ``YYYY-MM`` to restrict to one billing period; None for all.

    Returns:
        Rows ordered by period, customer, partition, offset.
    """
    with conn.cursor(row_factory=class_row(LateUsage)) as cur:
        return cur.execute(
            """
            SELECT u.event_id, u.customer_id, u.billing_period, u.amount, trim(u.currency) AS currency,
                   u.source_topic, u.source_partition, u.source_offset, u.recorded_at,
                   i.invoice_id::text AS invoice_id, i.invoice_number, i.revision,
                   (u.source_topic = i.source_topic AND u.source_partition = i.source_partition
                    AND u.source_offset >= i.close_offset) AS after_close
              FROM usage_lines u
              JOIN invoices i ON i.customer_id = u.customer_id
                             AND i.billing_period = u.billing_period
                             AND i.status = 'issued'
             WHERE (%(period)s::text IS NULL OR u.billing_period = %(period)s::text)
               AND NOT EXISTS (SELECT 1 FROM invoice_lines l
                                WHERE l.invoice_id = i.invoice_id AND l.event_id = u.event_id)
             ORDER BY u.billing_period, u.customer_id, u.source_partition, u.source_offset
            """,
            {"period": period},
        ).fetchall()
