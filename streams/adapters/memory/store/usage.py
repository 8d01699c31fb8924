"""Twin of :mod:`streams.core.billing.store.usage`: ``customers`` and ``usage_lines`` in memory
(the :class:`~streams.core.billing.ports.UsageStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`).

Kept as PostgreSQL has it: usage keyed by event id with ``ON CONFLICT DO NOTHING``
(the first stored occurrence wins; a different payload under a stored id is returned
as a conflict); a customer replaced only by a record of another topic or read at an
offset not lower than the stored one; ``recorded_at`` / ``updated_at`` = ``now()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import (
    CUSTOMERS,
    INVOICE_LINES,
    INVOICES,
    USAGE_LINES,
    CustomerRow,
    InvoiceLineRow,
    InvoiceRow,
    UsageRow,
    check_period,
)
from streams.core.billing.rows import (
    Customer,
    LateUsage,
    SourceCoordinates,
    UsageConflict,
    UsageRecord,
    UsageRowConflict,
    payload_hash,
)
from streams.core.billing.rows import UsageRow as HotRow
from streams.core.domain.events import CustomerUpserted, UsageRecorded
from streams.core.domain.fastcodec import USAGE_VALUES
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


#: ``-infinity``, the event time of a customer row whose event carried none.
_UNKNOWN_TIME = datetime.min.replace(tzinfo=UTC)


def upsert_customer(
    conn: MemoryConnection,
    event_id: str,
    data: CustomerUpserted,
    source: SourceCoordinates,
    event_time: datetime | None = None,
) -> None:
    """Insert or update the customer: an older upsert never overwrites a newer one (see
    :func:`streams.core.billing.store.usage.upsert_customer`)."""
    when = event_time if event_time is not None else _UNKNOWN_TIME
    with conn.statement("usage.upsert_customer") as stmt:
        table = stmt.table(CUSTOMERS)
        stored: CustomerRow | None = table.get(data.customer_id)
        if stored is not None and (
            stored.event_id == event_id
            or stored.event_time > when
            or (
                stored.event_time == when
                and stored.source_topic == source.topic
                and stored.source_offset > source.offset
            )
        ):
            return
        table[data.customer_id] = CustomerRow(
            customer_id=data.customer_id,
            name=data.name,
            email=data.email,
            currency=data.currency,
            billing_account_id=data.billing_account_id,
            event_id=event_id,
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            updated_at=stmt.now,
            event_time=when,
            invoice_grace_hours=data.invoice_grace_hours,
        )


def insert_usage(conn: MemoryConnection, records: Sequence[UsageRecord]) -> list[UsageConflict]:
    """Store usage lines, deduplicated by event id; returns the conflicts (see
    :func:`streams.core.billing.store.usage.insert_usage`)."""
    if not records:
        return []
    with conn.statement("usage.insert_usage") as stmt:
        table = stmt.table(USAGE_LINES)
        for r in records:
            check_period(stmt, USAGE_LINES, r.data.billing_period)
        for r in records:  # in order: the first occurrence of an id is the stored one
            if r.event_id in table:
                continue
            d = r.data
            table[r.event_id] = UsageRow(
                event_id=r.event_id,
                customer_id=d.customer_id,
                billing_period=d.billing_period,
                amount=d.amount,
                currency=d.currency,
                quantity=d.quantity,
                unit=d.unit,
                consumed_quantity=d.consumed_quantity,
                consumed_unit=d.consumed_unit,
                sku_id=d.sku_id,
                description=d.description,
                region_id=d.region_id,
                charge_category=d.charge_category,
                provider=d.provider,
                event_time=d.event_time,
                payload_sha256=r.payload_sha256,
                source_topic=r.source.topic,
                source_partition=r.source.partition,
                source_offset=r.source.offset,
                recorded_at=stmt.now,
            )
        conflicts: list[UsageConflict] = []
        for r in records:
            first: UsageRow = table[r.event_id]
            # a stored hash may be a hot-path row's raw digest: judge by the columns then
            if r.payload_sha256 != first.payload_sha256 and r.payload_sha256 != _canonical(first):
                conflicts.append(
                    UsageConflict(
                        r,
                        first.payload_sha256,
                        SourceCoordinates(
                            first.source_topic, first.source_partition, first.source_offset
                        ),
                    )
                )
        return conflicts


def insert_usage_rows(conn: MemoryConnection, rows: Sequence[HotRow]) -> list[UsageRowConflict]:
    """The hot path's batch write (see
    :func:`streams.core.billing.store.usage.insert_usage_rows`): rows stored with the raw
    digest; a row under a stored id with another digest is compared canonically."""
    if not rows:
        return []
    with conn.statement("usage.insert_usage_rows") as stmt:
        table = stmt.table(USAGE_LINES)
        for r in rows:
            check_period(stmt, USAGE_LINES, str(r.values[1]))
        for r in rows:  # in order: the first occurrence of an id is the stored one
            if r.event_id in table:
                continue
            data = dict(zip(_VALUE_NAMES, r.values, strict=True))
            table[r.event_id] = UsageRow(
                event_id=r.event_id,
                customer_id=str(data["customer_id"]),
                billing_period=str(data["billing_period"]),
                amount=Decimal(str(data["amount"])),
                currency=str(data["currency"]),
                quantity=_decimal(data["quantity"]),
                unit=data["unit"],
                consumed_quantity=_decimal(data["consumed_quantity"]),
                consumed_unit=data["consumed_unit"],
                sku_id=data["sku_id"],
                description=data["description"],
                region_id=data["region_id"],
                charge_category=data["charge_category"],
                provider=data["provider"],
                event_time=r.event_time,
                payload_sha256=r.payload_sha256,
                source_topic=r.source.topic,
                source_partition=r.source.partition,
                source_offset=r.source.offset,
                recorded_at=stmt.now,
            )
        conflicts: list[UsageRowConflict] = []
        for r in rows:
            first: UsageRow = table[r.event_id]
            if r.payload_sha256 != first.payload_sha256 and r.canonical_sha256() != _canonical(
                first
            ):
                conflicts.append(
                    UsageRowConflict(
                        r,
                        SourceCoordinates(
                            first.source_topic, first.source_partition, first.source_offset
                        ),
                    )
                )
        return conflicts


_VALUE_NAMES = USAGE_VALUES


def _decimal(text: str | None) -> Decimal | None:
    return None if text is None else Decimal(text)


def _canonical(row: UsageRow) -> str:
    """:func:`~streams.core.billing.rows.payload_hash` of a stored row, from its columns
    (as PostgreSQL's ``stored_payloads`` computes it)."""
    return payload_hash(
        UsageRecorded.model_construct(
            schema_version=1,
            customer_id=row.customer_id,
            billing_period=row.billing_period,
            amount=row.amount,
            currency=row.currency.strip(),
            quantity=row.quantity,
            unit=row.unit,
            consumed_quantity=row.consumed_quantity,
            consumed_unit=row.consumed_unit,
            sku_id=row.sku_id,
            description=row.description,
            region_id=row.region_id,
            charge_category=row.charge_category,
            event_time=row.event_time,
            provider=row.provider,
        )
    )


def _customer(row: CustomerRow) -> Customer:
    return Customer(
        row.customer_id, row.name, row.email, row.currency.strip(), row.invoice_grace_hours
    )


def get_customer(conn: MemoryConnection, customer_id: str) -> Customer | None:
    """The stored customer row of ``customer_id``, if any."""
    with conn.statement("usage.get_customer") as stmt:
        row: CustomerRow | None = stmt.table(CUSTOMERS).get(customer_id)
        return _customer(row) if row is not None else None


def customers(conn: MemoryConnection, ids: Sequence[str]) -> dict[str, Customer]:
    """customer id → the stored customer row, for those of ``ids`` that have one."""
    with conn.statement("usage.customers") as stmt:
        table = stmt.table(CUSTOMERS)
        return {i: _customer(table[i]) for i in dict.fromkeys(ids) if i in table}


def _line(row: UsageRow) -> UsageLine:
    return UsageLine(
        event_id=row.event_id,
        customer_id=row.customer_id,
        billing_period=row.billing_period,
        amount=row.amount,
        currency=row.currency.strip(),
        quantity=row.quantity,
        unit=row.unit,
        description=row.description,
        sku_id=row.sku_id,
        region_id=row.region_id,
        charge_category=row.charge_category,
        event_time=row.event_time,
        source_topic=row.source_topic,
        source_partition=row.source_partition,
        source_offset=row.source_offset,
    )


def usage_before(
    conn: MemoryConnection,
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
    before_offset: int,
) -> list[UsageLine]:
    """The customer's usage lines of the period read from ``topic[partition]`` before
    ``before_offset``, ordered by offset."""
    with conn.statement("usage.usage_before") as stmt:
        rows = [
            row
            for row in stmt.table(USAGE_LINES).values()
            if row.customer_id == customer_id
            and row.billing_period == billing_period
            and row.source_topic == topic
            and row.source_partition == partition
            and row.source_offset < before_offset
        ]
        return [_line(row) for row in sorted(rows, key=lambda r: r.source_offset)]


def usage_elsewhere(
    conn: MemoryConnection,
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
) -> list[UsageLine]:
    """The customer's usage lines of the period read from ``topic`` on any partition but
    ``partition``, ordered by (partition, offset)."""
    with conn.statement("usage.usage_elsewhere") as stmt:
        rows = [
            row
            for row in stmt.table(USAGE_LINES).values()
            if row.customer_id == customer_id
            and row.billing_period == billing_period
            and row.source_topic == topic
            and row.source_partition != partition
        ]
        return [
            _line(row) for row in sorted(rows, key=lambda r: (r.source_partition, r.source_offset))
        ]


def stored_payloads(
    conn: MemoryConnection, event_ids: Sequence[str]
) -> dict[str, tuple[str, SourceCoordinates]]:
    """event id → (payload hash, where it was read) of those of ``event_ids`` stored, the
    hash computed from the row's columns (as PostgreSQL does: a hot-path row keeps the
    digest of its raw value in ``payload_sha256``)."""
    with conn.statement("usage.stored_payloads") as stmt:
        table = stmt.table(USAGE_LINES)
        found: dict[str, tuple[str, SourceCoordinates]] = {}
        for event_id in set(event_ids):
            row = table.get(event_id)
            if row is not None:
                found[event_id] = (
                    _canonical(row),
                    SourceCoordinates(row.source_topic, row.source_partition, row.source_offset),
                )
        return found


def stored_usage_ids(conn: MemoryConnection, billing_period: str, topic: str) -> set[str]:
    """Event ids of the period in ``usage_lines`` read from ``topic``."""
    with conn.statement("usage.stored_usage_ids") as stmt:
        return {
            row.event_id
            for row in stmt.table(USAGE_LINES).values()
            if row.billing_period == billing_period and row.source_topic == topic
        }


def customers_with_usage(conn: MemoryConnection, billing_period: str, topic: str) -> set[str]:
    """Customers with a usage line of the period read from ``topic``."""
    with conn.statement("usage.customers_with_usage") as stmt:
        return {
            row.customer_id
            for row in stmt.table(USAGE_LINES).values()
            if row.billing_period == billing_period and row.source_topic == topic
        }


def late_usage(conn: MemoryConnection, period: str | None = None) -> list[LateUsage]:
    """Usage recorded for a (customer, period) whose issued invoice does not include it
    (see :func:`streams.core.billing.store.usage.late_usage`), ordered by period, customer,
    partition, offset."""
    with conn.statement("usage.late_usage") as stmt:
        issued: dict[tuple[str, str], InvoiceRow] = {
            (row.customer_id, row.billing_period): row
            for row in stmt.table(INVOICES).values()
            if row.status == "issued"
        }
        invoiced: set[tuple[str, str]] = {
            (line.invoice_id, line.event_id)
            for line in stmt.table(INVOICE_LINES).values()
            if isinstance(line, InvoiceLineRow)
        }
        found: list[LateUsage] = []
        for u in stmt.table(USAGE_LINES).values():
            if period is not None and u.billing_period != period:
                continue
            invoice = issued.get((u.customer_id, u.billing_period))
            if invoice is None or (invoice.invoice_id, u.event_id) in invoiced:
                continue
            found.append(
                LateUsage(
                    event_id=u.event_id,
                    customer_id=u.customer_id,
                    billing_period=u.billing_period,
                    amount=u.amount,
                    currency=u.currency.strip(),
                    source_topic=u.source_topic,
                    source_partition=u.source_partition,
                    source_offset=u.source_offset,
                    recorded_at=u.recorded_at,
                    invoice_id=invoice.invoice_id,
                    invoice_number=invoice.invoice_number,
                    revision=invoice.revision,
                    after_close=(
                        u.source_topic == invoice.source_topic
                        and u.source_partition == invoice.source_partition
                        and u.source_offset >= invoice.close_offset
                    ),
                )
            )
        return sorted(
            found,
            key=lambda r: (r.billing_period, r.customer_id, r.source_partition, r.source_offset),
        )
