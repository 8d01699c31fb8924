"""Twin of :mod:`streams.billing.store.usage`: ``customers`` and ``usage_lines`` in memory
(the :class:`~streams.billing.ports.UsageStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`).

Kept as PostgreSQL has it: usage keyed by event id with ``ON CONFLICT DO NOTHING``
(the first stored occurrence wins; a different payload under a stored id is returned
as a conflict); a customer replaced only by a record of another topic or read at an
offset not lower than the stored one; ``recorded_at`` / ``updated_at`` = ``now()``.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from streams.billing.rows import (
    Customer,
    LateUsage,
    SourceCoordinates,
    UsageConflict,
    UsageRecord,
)
from streams.domain.events import CustomerUpserted
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
    conn: MemoryConnection, event_id: str, data: CustomerUpserted, source: SourceCoordinates
) -> None:
    """Insert or update the customer; an older record (lower offset) never overwrites a newer one."""
    with conn.statement("usage.upsert_customer") as stmt:
        table = stmt.table(CUSTOMERS)
        stored: CustomerRow | None = table.get(data.customer_id)
        if (
            stored is not None
            and stored.source_topic == source.topic
            and stored.source_offset > source.offset
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
        )


def insert_usage(conn: MemoryConnection, records: Sequence[UsageRecord]) -> list[UsageConflict]:
    """Store usage lines, deduplicated by event id; returns the conflicts (see
    :func:`streams.billing.store.usage.insert_usage`)."""
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
            if r.payload_sha256 != first.payload_sha256:
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


def _customer(row: CustomerRow) -> Customer:
    return Customer(row.customer_id, row.name, row.email, row.currency.strip())


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
    """event id → (payload hash, where it was read) of those of ``event_ids`` stored. The
    twin stores every row under the current hashing rule, so its hash is the stored one."""
    with conn.statement("usage.stored_payloads") as stmt:
        table = stmt.table(USAGE_LINES)
        found: dict[str, tuple[str, SourceCoordinates]] = {}
        for event_id in set(event_ids):
            row = table.get(event_id)
            if row is not None:
                found[event_id] = (
                    row.payload_sha256,
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
    (see :func:`streams.billing.store.usage.late_usage`), ordered by period, customer,
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
