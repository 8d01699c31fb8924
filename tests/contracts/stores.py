"""What the store contracts share: the harness (a database and its store set) and row
builders.

The store suites (``usage_store.py``, ``invoice_store.py``, ``hold_store.py``,
``close_store.py``, ``fence_store.py``, ``deliveries.py``) run on the twin
(:class:`~streams.adapters.memory.database.InMemoryDatabase` with
:data:`~streams.adapters.memory.stores.MEMORY`) in the unit tier and on a sandbox
PostgreSQL database of their own (migrated to head, dropped afterwards) with
:data:`~streams.core.billing.stores.POSTGRES` in the integration tier. The database is
shared by the tests of a run, so every test names its own customers, topics,
groups and series (:func:`unique`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from streams.apps.email.store import Deliveries
from streams.core.billing.ports import Database
from streams.core.billing.rows import (
    CloseMarker,
    Customer,
    InvoiceDraft,
    SourceCoordinates,
    UsageRecord,
)
from streams.core.billing.stores import Stores
from streams.core.domain.events import CustomerUpserted, TaxAmount, UsageRecorded
from streams.core.domain.invoice import InvoiceTotals, TaxedLine, UsageLine

PERIOD = "2026-01"
EVENT_TIME = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


@dataclass
class StoreHarness:
    """A database, the stores over its connections, and delivery stores on it."""

    db: Database[Any]
    stores: Stores[Any]
    #: A delivery store on the same database with the given lock timeout (seconds).
    deliveries: Callable[[float], Deliveries]
    #: How long "it does not complete" is watched for (seconds).
    blocked_s: float = 1.0

    @contextmanager
    def tx(self) -> Iterator[Any]:
        """A connection whose transaction commits when the block ends (rolls back on error)."""
        with self.db.connection() as conn:
            yield conn


def unique(prefix: str = "x") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def usage(
    customer: str,
    event_id: str,
    amount: str,
    offset: int,
    *,
    topic: str = "t",
    partition: int = 0,
    period: str = PERIOD,
    **fields: Any,
) -> UsageRecord:
    data = UsageRecorded(
        customer_id=customer,
        billing_period=period,
        amount=Decimal(amount),
        currency="USD",
        event_time=EVENT_TIME,
        **fields,
    )
    return UsageRecord(event_id, data, SourceCoordinates(topic, partition, offset))


def customer_upserted(customer: str, name: str = "Name", currency: str = "USD") -> CustomerUpserted:
    return CustomerUpserted(
        customer_id=customer,
        name=name,
        email=f"billing@{customer}.example",
        currency=currency,
    )


def line(record: UsageRecord) -> UsageLine:
    d = record.data
    return UsageLine(
        event_id=record.event_id,
        customer_id=d.customer_id,
        billing_period=d.billing_period,
        amount=d.amount,
        currency=d.currency,
        quantity=d.quantity,
        unit=d.unit,
        description=d.description,
        sku_id=d.sku_id,
        region_id=d.region_id,
        charge_category=d.charge_category,
        event_time=d.event_time,
        source_topic=record.source.topic,
        source_partition=record.source.partition,
        source_offset=record.source.offset,
    )


def draft(
    customer: str,
    invoice_id: str | None = None,
    *,
    period: str = PERIOD,
    revision: int = 1,
    lines: tuple[UsageLine, ...] = (),
    topic: str = "t",
    close_offset: int = 9,
    supersedes: str | None = None,
    total: Decimal | None = None,
) -> InvoiceDraft:
    """A draft invoice of ``lines`` taxed at 10 % (``total`` overrides the computed total)."""
    subtotal = sum((ln.amount for ln in lines), Decimal("0"))
    taxed = tuple(TaxedLine(ln.event_id, "T-STD", Decimal("0.1"), ln.amount / 10) for ln in lines)
    tax_total = sum((t.tax for t in taxed), Decimal("0"))
    totals = InvoiceTotals(
        currency="USD",
        line_count=len(lines),
        subtotal=subtotal,
        taxes=(
            (
                TaxAmount(
                    tax_code="T-STD", rate=Decimal("0.1"), taxable_amount=subtotal, amount=tax_total
                ),
            )
            if lines
            else ()
        ),
        tax_total=tax_total,
        total=subtotal + tax_total if total is None else total,
        largest_lines=(),
        source=(),
    )
    invoice_id = invoice_id or str(uuid.uuid4())
    return InvoiceDraft(
        invoice_id=invoice_id,
        revision=revision,
        customer=Customer(customer, "Name", "billing@example.invalid", "USD"),
        billing_period=period,
        totals=totals,
        lines=lines,
        taxed=taxed,
        marker=CloseMarker(
            f"close-{invoice_id}",
            customer,
            period,
            "closed",
            SourceCoordinates(topic, 0, close_offset),
        ),
        supersedes_invoice_id=supersedes,
    )


#: keyword arguments of ``insert_invoice`` for an invoice without a fence
NO_FENCE: dict[str, Any] = {"fence": None, "lease_fencing_token": None}
