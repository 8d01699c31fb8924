"""``customers`` and ``usage_lines``: who is billed, and the usage they are billed for.

Usage is keyed by event id (docs/design.md, invariant 3): the same id with the same
payload is a duplicate (a no-op), with another payload a conflict (returned,
the stored line is never overwritten). A customer row is replaced only by a
newer ``customer.upserted``: another event id with a later event time (the envelope's
``time``), or the same time read at a higher offset of the same topic
(:func:`upsert_customer`).

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
Shapes: money ``Decimal`` in currency units, periods ``YYYY-MM``, times UTC.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import class_row, scalar_row

from streams.core.billing.rows import (
    Customer,
    LateUsage,
    SourceCoordinates,
    UsageConflict,
    UsageRecord,
    UsageRow,
    UsageRowConflict,
    payload_hash,
)
from streams.core.domain.events import CustomerUpserted, UsageRecorded
from streams.core.domain.invoice import UsageLine

__all__ = [
    "customers",
    "customers_with_usage",
    "get_customer",
    "insert_usage",
    "insert_usage_rows",
    "late_usage",
    "stored_payloads",
    "stored_usage_ids",
    "upsert_customer",
    "usage_before",
    "usage_elsewhere",
]


def upsert_customer(
    conn: psycopg.Connection[Any],
    event_id: str,
    data: CustomerUpserted,
    source: SourceCoordinates,
    event_time: datetime | None = None,
) -> None:
    """Insert or update the customer: an older upsert never overwrites a newer one.

    ``event_time`` is the event's own time (the CloudEvents ``time`` of its envelope, UTC;
    None: unknown, older than any known time). The stored row is replaced only by another
    event id (a resend of the stored event is a no-op, whatever its offset) that is newer:
    a later ``event_time``; at the same time, a record of another topic, or one read at
    the same or a higher offset of the same topic. So a late resend of an old upsert
    (past the edge's idempotency window, at a higher offset) never restores the old name
    or email (docs/security.md "Customer data"; column ``event_time``: migration 0016).
    """
    conn.execute(
        """
        INSERT INTO customers (customer_id, name, email, currency, billing_account_id, event_id,
                               source_topic, source_partition, source_offset, event_time,
                               updated_at, invoice_grace_hours)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, COALESCE(%s, '-infinity'::timestamptz), now(),
                %s)
        ON CONFLICT (customer_id) DO UPDATE SET
            name = EXCLUDED.name, email = EXCLUDED.email, currency = EXCLUDED.currency,
            billing_account_id = EXCLUDED.billing_account_id, event_id = EXCLUDED.event_id,
            invoice_grace_hours = EXCLUDED.invoice_grace_hours,
            source_topic = EXCLUDED.source_topic, source_partition = EXCLUDED.source_partition,
            source_offset = EXCLUDED.source_offset, event_time = EXCLUDED.event_time,
            updated_at = now()
        WHERE customers.event_id <> EXCLUDED.event_id
          AND (customers.event_time < EXCLUDED.event_time
               OR (customers.event_time = EXCLUDED.event_time
                   AND (customers.source_topic <> EXCLUDED.source_topic
                        OR customers.source_offset <= EXCLUDED.source_offset)))
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
            event_time,
            data.invoice_grace_hours,
        ),
    )


@dataclass(frozen=True)
class _StoredUsage:
    event_id: str
    payload_sha256: str
    source_topic: str
    source_partition: int
    source_offset: int


#: One statement per batch (docs/decisions/0093-hot-path-usage-writes.md): the batch travels as one
#: JSON array (each element: event id ``e``, payload hash ``h``, source ``t``/``p``/``o`` and the
#: data's canonical JSON ``d``, the text the hash is made of, so it is built once per record);
#: ``WITH ORDINALITY`` keeps the batch's order, ``DISTINCT ON`` the first occurrence of an id within
#: the batch, ``ON CONFLICT DO NOTHING`` leaves ids stored by earlier batches alone, and
#: ``RETURNING`` names the ids this batch stored. Values convert from their JSON text exactly
#: (decimal strings to ``numeric``, ISO 8601 to ``timestamptz``). Neither a temporary table (the
#: roles may not create one) nor a parameter per value (psycopg dumps arrays element by element in
#: Python).
_INSERT_USAGE = """
    INSERT INTO usage_lines (event_id, customer_id, billing_period, amount, currency, quantity, unit,
        consumed_quantity, consumed_unit, sku_id, description, region_id, charge_category, provider,
        event_time, payload_sha256, source_topic, source_partition, source_offset)
    SELECT DISTINCT ON (b.e)
           b.e, d.customer_id, d.billing_period, d.amount, d.currency, d.quantity, d.unit,
           d.consumed_quantity, d.consumed_unit, d.sku_id, d.description, d.region_id,
           d.charge_category, d.provider, d.event_time, b.h, b.t, b.p, b.o
      FROM ROWS FROM (json_to_recordset(%s::json)
                      AS (e text, h text, t text, p integer, o bigint, d json))
           WITH ORDINALITY AS b(e, h, t, p, o, d, ordinal)
     CROSS JOIN LATERAL json_to_record(b.d) AS d(
           customer_id text, billing_period text, amount numeric, currency text,
           quantity numeric, unit text, consumed_quantity numeric, consumed_unit text,
           sku_id text, description text, region_id text, charge_category text,
           provider text, event_time timestamptz)
     ORDER BY b.e, b.ordinal
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
"""

_json_text = json.encoder.encode_basestring_ascii


def insert_usage(
    conn: psycopg.Connection[Any], records: Sequence[UsageRecord]
) -> list[UsageConflict]:
    """Store usage lines, deduplicated by event id. Returns the conflicts: event ids
    already stored with a different payload (the stored row is kept as it is).

    A record whose id is stored with the same payload is a duplicate: a no-op. The
    stored row of an id is its first occurrence: a row of an earlier batch, or else
    the first record of this batch with that id. A record conflicts only with that
    row; a later exact duplicate of it is a no-op even when a conflicting record came
    between them in the batch.

    One ``INSERT … SELECT FROM json_to_recordset(…)`` per batch (plus a ``SELECT`` of the rows
    stored before, only when some id was already there), instead of one ``INSERT``
    per record: see :data:`_INSERT_USAGE` and docs/decisions/0093-hot-path-usage-writes.md.
    """
    if not records:
        return []
    first_in_batch: dict[str, UsageRecord] = {}
    elements: list[str] = []
    for r in records:
        first_in_batch.setdefault(r.event_id, r)
        elements.append(
            f'{{"e":{_json_text(r.event_id)},"h":"{r.payload_sha256}",'
            f'"t":{_json_text(r.source.topic)},"p":{int(r.source.partition)},'
            f'"o":{int(r.source.offset)},"d":{r.payload_json}}}'
        )
    with conn.cursor(row_factory=scalar_row) as cur:
        inserted = set(cur.execute(_INSERT_USAGE, ("[" + ",".join(elements) + "]",)).fetchall())
    stored: dict[str, _StoredUsage] = {}
    earlier = [event_id for event_id in first_in_batch if event_id not in inserted]
    if earlier:
        with conn.cursor(row_factory=class_row(_StoredUsage)) as cur:
            stored = {
                found.event_id: found
                for found in cur.execute(
                    "SELECT event_id, payload_sha256, source_topic, source_partition, "
                    "source_offset FROM usage_lines WHERE event_id = ANY(%s)",
                    (earlier,),
                )
            }
    for event_id in inserted:
        first = first_in_batch[event_id]
        stored[event_id] = _StoredUsage(
            event_id,
            first.payload_sha256,
            first.source.topic,
            first.source.partition,
            first.source.offset,
        )
    conflicts: list[UsageConflict] = []
    # A stored hash that differs may be the hash of an older rule (decimals as written,
    # before hashes were canonical): compare those rows by their columns, in canonical form.
    differing = [
        r.event_id for r in records if r.payload_sha256 != stored[r.event_id].payload_sha256
    ]
    canonical = stored_payloads(conn, differing) if differing else {}
    # The stored row is the first occurrence (an earlier batch, or the first of this
    # batch: the INSERT keeps each id's first element). A record conflicts only with it; a later
    # exact duplicate of the stored payload is a no-op even when a conflicting record
    # came between them in the batch.
    for record in records:
        kept = stored[record.event_id]
        same = record.payload_sha256 == kept.payload_sha256 or (
            record.event_id in canonical and canonical[record.event_id][0] == record.payload_sha256
        )
        if not same:
            conflicts.append(
                UsageConflict(
                    record,
                    kept.payload_sha256,
                    SourceCoordinates(kept.source_topic, kept.source_partition, kept.source_offset),
                )
            )
    return conflicts


_USAGE_COLUMNS = (
    "event_id, customer_id, billing_period, amount, currency, quantity, unit, "
    "consumed_quantity, consumed_unit, sku_id, description, region_id, charge_category, "
    "provider, event_time, payload_sha256, source_topic, source_partition, source_offset, "
    # migration 0017: the API key that sent the event (lineage; NULL for other producers)
    "key_id"
)
_COPY_STAGING = f"COPY usage_staging (ordinal, {_USAGE_COLUMNS}) FROM STDIN"
#: A batch with no stored id and none twice: straight into the table (under a savepoint).
_COPY_DIRECT = f"COPY usage_lines ({_USAGE_COLUMNS}) FROM STDIN"
#: One statement moves this transaction's staged rows: the DELETE empties the staging
#: rows of this transaction (``xact``) and feeds the INSERT; ``DISTINCT ON`` keeps the
#: first row of an id in the batch, ``ON CONFLICT DO NOTHING`` leaves stored ids alone.
_MOVE_STAGED = f"""
    WITH staged AS (
        DELETE FROM usage_staging WHERE xact = pg_current_xact_id() RETURNING *
    )
    INSERT INTO usage_lines ({_USAGE_COLUMNS})
    SELECT DISTINCT ON (event_id) {_USAGE_COLUMNS}
      FROM staged ORDER BY event_id, ordinal
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
"""


def _copy_rows(copy: psycopg.Copy, rows: Sequence[UsageRow], *, ordinals: bool) -> None:
    """Write ``rows`` to ``copy`` in :data:`_USAGE_COLUMNS` order, each after its ordinal
    in the batch when ``ordinals`` (``usage_staging``'s first column)."""
    for ordinal, row in enumerate(rows):
        source = row.source
        values = (
            row.event_id,
            *row.values,
            row.payload_sha256,
            source.topic,
            source.partition,
            source.offset,
            row.key_id,
        )
        copy.write_row((ordinal, *values) if ordinals else values)


def insert_usage_rows(
    conn: psycopg.Connection[Any], rows: Sequence[UsageRow], *, direct: bool = True
) -> list[UsageRowConflict]:
    """Store a poll batch's usage rows (the hot path), deduplicated by event id; returns
    the conflicts: rows whose id is stored, or first in this batch, with a different
    payload (the kept row is never overwritten). Same rules as :func:`insert_usage`.

    Two ways, one result (docs/decisions/0010-batch-first-ingest.md, "COPY straight
    into usage_lines"):

    * **direct** (the common case: no id of the batch stored before, none twice in it):
      one ``COPY`` straight into ``usage_lines`` under a savepoint. It stores every row
      or, at the first id already there (``unique_violation``), none: the savepoint is
      rolled back and the batch takes the second way. A batch that names an id twice is
      sent the second way at once.
    * **staged**: one ``COPY`` into ``usage_staging`` and one statement that moves the
      rows into ``usage_lines`` (:data:`_MOVE_STAGED`, migration 0010), skipping ids
      already stored. The payload check is cheap: nothing is compared for a row the
      insert stored; for a row it did not store (its id was there), the stored digest is
      read, and only when the digests of the raw values differ are the canonical
      payloads compared (the stored row's from its columns, :func:`stored_payloads`, so
      a row written under an older rule is judged by the current one).

    ``direct=False`` takes the staged way only (the benchmark's baseline). Runs in the
    caller's transaction. Raises what PostgreSQL raises for a row it refuses for good
    (e.g. ``CheckViolation``), either way.
    """
    if not rows:
        return []
    if direct and len({row.event_id for row in rows}) == len(rows):
        try:
            with conn.transaction(), conn.cursor() as cur, cur.copy(_COPY_DIRECT) as copy:
                _copy_rows(copy, rows, ordinals=False)
        except psycopg.errors.UniqueViolation:
            pass  # an id is stored already: the savepoint is rolled back; the staged way
        else:
            return []
    with conn.cursor() as cur:
        with cur.copy(_COPY_STAGING) as copy:
            _copy_rows(copy, rows, ordinals=True)
        inserted = {str(found[0]) for found in cur.execute(_MOVE_STAGED).fetchall()}
    first: dict[str, UsageRow] = {}
    later: list[UsageRow] = []
    for row in rows:
        if row.event_id in first:
            later.append(row)
        else:
            first[row.event_id] = row
    earlier = [event_id for event_id in first if event_id not in inserted]
    if not earlier and not later:
        return []
    kept: dict[str, tuple[str, SourceCoordinates]] = {}
    if earlier:
        with conn.cursor(row_factory=class_row(_StoredUsage)) as cur:
            for found in cur.execute(
                "SELECT event_id, payload_sha256, source_topic, source_partition, "
                "source_offset FROM usage_lines WHERE event_id = ANY(%s)",
                (earlier,),
            ):
                kept[found.event_id] = (
                    found.payload_sha256,
                    SourceCoordinates(
                        found.source_topic, found.source_partition, found.source_offset
                    ),
                )
    for event_id in inserted:
        row = first[event_id]
        kept[event_id] = (row.payload_sha256, row.source)
    suspects = [
        row
        for row in [*(first[e] for e in earlier), *later]
        if row.payload_sha256 != kept[row.event_id][0]
    ]
    if not suspects:
        return []
    # Raw digests differ: judge by the canonical payloads (the stored ones from columns,
    # this batch's first rows from their values).
    canonical = stored_payloads(
        conn, [row.event_id for row in suspects if row.event_id not in inserted]
    )
    for event_id in {row.event_id for row in suspects if row.event_id in inserted}:
        canonical[event_id] = (first[event_id].canonical_sha256(), first[event_id].source)
    return [
        UsageRowConflict(row, kept[row.event_id][1])
        for row in suspects
        if row.canonical_sha256() != canonical[row.event_id][0]
    ]


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
    """event id → (:func:`~streams.core.billing.rows.payload_hash` of the stored line, read
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
            "SELECT customer_id, name, email, currency, invoice_grace_hours FROM customers "
            "WHERE customer_id = %s",
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
    ``before_offset`` (the close marker), ordered by offset (docs/design.md, invariant 3)."""
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
    gained partitions and moved the customer (docs/design.md "Scaling"; docs/operations.md)."""
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
