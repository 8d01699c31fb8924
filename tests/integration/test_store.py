"""Usage deduplication and invoice conflicts against the real database (rolled back
after each test)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from streams.billing.rows import (
    CloseMarker,
    Customer,
    InvoiceDraft,
    SourceCoordinates,
    UsageRecord,
)
from streams.billing.store.invoices import InvoiceNumberTaken, insert_invoice
from streams.billing.store.usage import insert_usage
from streams.domain.events import UsageRecorded
from streams.domain.invoice import InvoiceTotals
from streams.settings import Settings


def _usage(customer: str, event_id: str, amount: str, offset: int) -> UsageRecord:
    data = UsageRecorded(
        customer_id=customer,
        billing_period="2026-01",
        amount=Decimal(amount),
        currency="USD",
        event_time=datetime(2026, 1, 2, tzinfo=UTC),
    )
    return UsageRecord(event_id, data, SourceCoordinates("t", 0, offset))


def test_duplicate_after_a_conflict_in_one_batch_is_not_a_conflict(
    settings: Settings, unique: str
) -> None:
    customer, event_id = f"c-{unique}", f"e-{unique}"
    with psycopg.connect(settings.postgres.dsn("owner")) as conn:
        try:
            assert insert_usage(conn, [_usage(customer, event_id, "1.00", 1)]) == []
            batch = [_usage(customer, event_id, "9.99", 2), _usage(customer, event_id, "1.00", 3)]
            conflicts = insert_usage(conn, batch)
            assert [c.record.source.offset for c in conflicts] == [2]
            assert conflicts[0].stored_source.offset == 1
        finally:
            conn.rollback()


def test_first_occurrence_in_a_batch_wins(settings: Settings, unique: str) -> None:
    customer, event_id = f"c-{unique}", f"e-{unique}"
    with psycopg.connect(settings.postgres.dsn("owner")) as conn:
        try:
            batch = [
                _usage(customer, event_id, "2.00", 5),
                _usage(customer, event_id, "2.00", 6),
                _usage(customer, event_id, "3.00", 7),
            ]
            conflicts = insert_usage(conn, batch)
            assert [c.record.source.offset for c in conflicts] == [7]
            amount = conn.execute(
                "SELECT amount, source_offset FROM usage_lines WHERE event_id = %s", (event_id,)
            ).fetchone()
            assert amount == (Decimal("2.00"), 5)
        finally:
            conn.rollback()


def _draft(customer: str, invoice_id: str, period: str = "2026-01") -> InvoiceDraft:
    totals = InvoiceTotals(
        currency="USD",
        line_count=0,
        subtotal=Decimal("0"),
        taxes=(),
        tax_total=Decimal("0"),
        total=Decimal("0"),
        largest_lines=(),
        source=(),
    )
    return InvoiceDraft(
        invoice_id=invoice_id,
        revision=1,
        customer=Customer(customer, "Name", "billing@example.invalid", "USD"),
        billing_period=period,
        totals=totals,
        lines=(),
        taxed=(),
        marker=CloseMarker(
            f"close-{invoice_id}", customer, period, "closed", SourceCoordinates("t", 0, 9)
        ),
    )


def test_an_invoice_number_clash_is_an_error_not_already_invoiced(
    settings: Settings, unique: str
) -> None:
    number = f"INV-TEST-{unique}"
    kw: dict[str, Any] = {
        "fence": None,
        "lease_fencing_token": None,
        "issued_at": datetime.now(UTC),
    }
    with psycopg.connect(settings.postgres.dsn("owner")) as conn:
        try:
            first = _draft(f"a-{unique}", str(uuid.uuid4()))
            assert insert_invoice(conn, first, number=number, **kw) is True
            # the same invoice again (a redelivery): nothing written, not an error
            again = _draft(f"a-{unique}", str(uuid.uuid4()))
            assert insert_invoice(conn, again, number=f"{number}-2", **kw) is False
            # another customer's invoice under a number already used: refused loudly
            other = _draft(f"b-{unique}", str(uuid.uuid4()))
            with pytest.raises(InvoiceNumberTaken, match=number):
                insert_invoice(conn, other, number=number, **kw)
        finally:
            conn.rollback()
