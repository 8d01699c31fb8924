"""The invoice job (streams/apps/invoicing/jobs.py) on the twins: the in-memory database with
the twin stores and the in-memory tax service. Each test stores a customer and usage,
claims the partition fence, runs one job for a close marker and reads what it wrote."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.adapters.memory import fencing as twin_fencing
from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.store import holds, tables, usage
from streams.adapters.memory.stores import MEMORY
from streams.adapters.memory.tax import InMemoryTaxService
from streams.apps.invoicing.jobs import JobContext, JobResult, Outcome, run_invoice_job
from streams.core.billing.fencing import FencingToken
from streams.core.billing.issuance import tax_idempotency_key
from streams.core.billing.ports import TaxRejected, TaxService
from streams.core.billing.rows import CloseMarker, SourceCoordinates, UsageRecord
from streams.core.domain.events import CustomerUpserted, UsageRecorded, invoice_id_for
from tests.support.twins import PERIOD, GatedTax, metric

TOPIC = "billing.account-events.v1"
PARTITION = 4


@dataclass
class Job:
    """One customer's world: the database, the tax service, the fence token."""

    db: InMemoryDatabase
    tax: InMemoryTaxService
    token: FencingToken
    customer: str = "cust-1"

    def add_customer(self, currency: str = "USD") -> None:
        data = CustomerUpserted(
            customer_id=self.customer, name="Acme", email="ap@acme.example", currency=currency
        )
        with self.db.connection() as conn:
            usage.upsert_customer(conn, "c-1", data, SourceCoordinates(TOPIC, PARTITION, 0))

    def add_usage(self, *amounts: str, currency: str = "USD", first_offset: int = 1) -> None:
        records = [
            UsageRecord(
                f"u-{first_offset + n}",
                UsageRecorded(
                    customer_id=self.customer,
                    billing_period=PERIOD,
                    amount=Decimal(amount),
                    currency=currency,
                    region_id="us-west-2",
                    event_time=datetime(2026, 1, 3, tzinfo=UTC),
                ),
                SourceCoordinates(TOPIC, PARTITION, first_offset + n),
            )
            for n, amount in enumerate(amounts)
        ]
        with self.db.connection() as conn:
            usage.insert_usage(conn, records)

    def marker(self, offset: int = 10, event_id: str = "close-1") -> CloseMarker:
        return CloseMarker(
            event_id,
            self.customer,
            PERIOD,
            "period_closed",
            SourceCoordinates(TOPIC, PARTITION, offset),
        )

    def run(
        self,
        marker: CloseMarker | None = None,
        *,
        tax: TaxService | None = None,
        cancel: threading.Event | None = None,
        token: FencingToken | None = None,
    ) -> JobResult:
        ctx = JobContext(
            pool=self.db,
            tax=tax or self.tax,
            invoices_topic="test.billing.invoices.v1",
            stores=MEMORY,
        )
        return run_invoice_job(
            ctx, marker or self.marker(), token or self.token, cancel or threading.Event()
        )

    def invoices(self) -> list[tables.InvoiceRow]:
        return list(self.db.table(tables.INVOICES).values())

    def closes(self) -> list[tuple[str, str]]:
        return sorted((r.event_id, r.outcome) for r in self.db.table(tables.PERIOD_CLOSES).values())

    def outbox(self) -> list[tables.OutboxRow]:
        return list(self.db.table(tables.OUTBOX).values())


@pytest.fixture
def job() -> Job:
    db = InMemoryDatabase()
    token = FencingToken("invoicing", TOPIC, PARTITION, 3, "member-a")
    with db.connection() as conn:
        twin_fencing.claim(conn, token)
    return Job(db, InMemoryTaxService(), token)


def test_invoiced_with_its_lines_outbox_event_and_close_record(job: Job) -> None:
    job.add_customer()
    job.add_usage("10.00", "0.50", "-1.25")
    result = job.run()
    assert result.outcome is Outcome.INVOICED
    invoice_id = invoice_id_for(job.customer, PERIOD, 1)
    assert (result.invoice_id, result.invoice_number) == (invoice_id, "INV-2026-01-000001")
    (invoice,) = job.invoices()
    assert (invoice.subtotal, invoice.line_count, invoice.status) == (Decimal("9.25"), 3, "issued")
    assert invoice.tax_total == Decimal("0.60")  # 9.25 * 6.5 % (us-west-2), rounded once
    assert invoice.total == invoice.subtotal + invoice.tax_total
    assert (invoice.fence_group, invoice.fence_generation, invoice.fence_member) == (
        "invoicing",
        3,
        "member-a",
    )
    assert (
        invoice.close_event_id,
        invoice.close_offset,
        invoice.first_offset,
        invoice.last_offset,
    ) == (
        "close-1",
        10,
        1,
        3,
    )
    lines = sorted(job.db.table(tables.INVOICE_LINES).values(), key=lambda ln: ln.line_no)
    assert [(ln.event_id, ln.amount) for ln in lines] == [
        ("u-1", Decimal("10.00")),
        ("u-2", Decimal("0.50")),
        ("u-3", Decimal("-1.25")),
    ]
    (event,) = job.outbox()
    assert (event.type, event.aggregateid, event.document_id) == (
        "invoice.issued",
        job.customer,
        invoice_id,
    )
    assert event.payload["invoice_number"] == "INV-2026-01-000001"
    assert event.payload["total"] == str(invoice.total)
    assert job.closes() == [("close-1", "invoiced")]
    assert [c.idempotency_key for c in job.tax.calls] == [f"{tax_idempotency_key(invoice_id, 1)}:0"]


def test_only_the_usage_before_the_marker_is_invoiced(job: Job) -> None:
    job.add_customer()
    job.add_usage("1.00", "2.00", first_offset=8)  # offsets 8 and 9
    job.add_usage("4.00", first_offset=11)  # after the marker at 10
    assert job.run().outcome is Outcome.INVOICED
    (invoice,) = job.invoices()
    assert invoice.subtotal == Decimal("3.00")


def test_already_invoiced(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    first = job.run()
    again = job.run(job.marker(offset=12, event_id="close-2"))  # a second marker
    redelivered = job.run()  # the same marker again
    assert first.outcome is Outcome.INVOICED
    assert again.outcome is redelivered.outcome is Outcome.ALREADY_INVOICED
    assert again.invoice_number == first.invoice_number
    assert len(job.invoices()) == 1 and len(job.outbox()) == 1
    assert job.closes() == [("close-1", "invoiced"), ("close-2", "already_invoiced")]
    assert len(job.tax.calls) == 1  # no tax call once invoiced


def test_held(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    with job.db.connection() as conn:
        holds.record_hold(
            conn,
            customer_id=job.customer,
            billing_period=None,
            reason="dead-lettered: value is not JSON",
            event_id=None,
            source=SourceCoordinates(TOPIC, PARTITION, 2),
        )
    held = metric("invoicing_holds_total")
    result = job.run()
    assert result.outcome is Outcome.HELD
    assert "value is not JSON" in result.detail and f"{TOPIC}[{PARTITION}]@2" in result.detail
    assert job.invoices() == [] and job.tax.calls == []
    assert job.closes() == [("close-1", "held")]
    assert metric("invoicing_holds_total") == held + 1


def test_tax_unavailable_is_retried_under_the_same_key(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    job.tax.fail_next(1)
    result = job.run()
    assert result.outcome is Outcome.RETRY
    assert "TaxUnavailable" in result.detail
    assert job.invoices() == [] and job.closes() == []
    assert job.run().outcome is Outcome.INVOICED
    key = tax_idempotency_key(invoice_id_for(job.customer, PERIOD, 1), 1)
    assert job.tax.outcomes(key) == ["error", "ok"]


def test_a_transient_database_error_is_retried_and_gives_the_number_back(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    job.db.fail_next(1, statement="invoices.insert_invoice")
    assert job.run().outcome is Outcome.RETRY
    assert job.invoices() == []
    again = job.run()
    assert (again.outcome, again.invoice_number) == (Outcome.INVOICED, "INV-2026-01-000001")


@pytest.mark.parametrize(
    ("setup", "says"),
    [
        ("other-currency", "currency"),
        ("no-customer", "no customer.upserted"),
    ],
)
def test_a_rule_violation_fails_before_the_tax_call(job: Job, setup: str, says: str) -> None:
    if setup == "other-currency":
        job.add_customer(currency="EUR")
        job.add_usage("5.00", currency="USD")
    else:
        job.add_usage("5.00")
    result = job.run()
    assert result.outcome is Outcome.FAILED
    assert says in result.detail
    assert job.tax.calls == []  # nothing committed under the tax key: a fix can be invoiced
    assert job.invoices() == [] and job.closes() == []


def test_a_tax_rejection_fails(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    job.tax.fail_next(1, TaxRejected("unknown product tax code", status=422))
    result = job.run()
    assert (result.outcome, "TaxRejected" in result.detail) == (Outcome.FAILED, True)
    assert job.invoices() == []


def test_cancelled_before_the_tax_call(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    cancel = threading.Event()
    cancel.set()
    result = job.run(cancel=cancel)
    assert (result.outcome, result.detail) == (Outcome.CANCELLED, "cancelled before the tax call")
    assert job.tax.calls == [] and job.invoices() == []


def test_cancelled_after_the_tax_call(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    cancel = threading.Event()
    tax = GatedTax(job.tax)
    tax.during = cancel.set  # the partition is revoked while the tax call runs
    tax.release.set()
    result = job.run(tax=tax, cancel=cancel)
    assert (result.outcome, result.detail) == (Outcome.CANCELLED, "cancelled after the tax call")
    assert len(job.tax.calls) == 1
    assert job.invoices() == [] and job.outbox() == [] and job.closes() == []


def test_fenced(job: Job) -> None:
    job.add_customer()
    job.add_usage("5.00")
    with job.db.connection() as conn:  # the partition's next owner claimed it
        twin_fencing.claim(conn, FencingToken("invoicing", TOPIC, PARTITION, 4, "member-b"))
    result = job.run()
    assert result.outcome is Outcome.FENCED
    assert "generation 4 member member-b" in result.detail
    assert job.invoices() == [] and job.outbox() == [] and job.closes() == []
    # an unclaimed token is refused the same way, also for the close record alone
    stranger = FencingToken("invoicing", TOPIC, PARTITION + 1, 9, "member-c")
    assert job.run(token=stranger).outcome is Outcome.FENCED


def _metered_on_another_partition(job: Job) -> None:
    from streams.adapters.memory.store import metering
    from streams.core.billing.rows import MeteredRecord
    from streams.core.domain.events import UsageMetered

    record = MeteredRecord(
        "m-1",
        UsageMetered(
            customer_id=job.customer,
            metric="api_calls",
            event_time=datetime(2026, 1, 3, tzinfo=UTC),
            values={"calls": Decimal(500)},
        ),
        SourceCoordinates(TOPIC, PARTITION - 2, 40),  # read before the topic gained partitions
    )
    with job.db.connection() as conn:
        metering.insert_metered(conn, [record])


def test_metered_usage_on_another_partition_is_refused_not_left_out(job: Job) -> None:
    """Usage on another partition is held, not left out (docs/operations.md "Adding
    partitions"), for metered usage too: the close marker's partition has the
    pass-through lines, another partition a metered event; the invoice is refused
    (the worker holds it), never issued from the pass-through lines alone."""
    job.add_customer()
    job.add_usage("10.00")
    _metered_on_another_partition(job)
    result = job.run()
    assert result.outcome is not Outcome.INVOICED
    assert job.invoices() == []
    assert "metered event(s)" in result.detail and "other partitions" in result.detail


def test_a_released_hold_rates_the_metered_usage_of_every_partition(job: Job) -> None:
    """After the operator's release, the other partition's metered event is the
    customer's: here it has no subscription, so rating holds the invoice (never a
    pass-through-only invoice that leaves the event out)."""
    job.add_customer()
    job.add_usage("10.00")
    _metered_on_another_partition(job)
    released = CloseMarker(
        "close-2", job.customer, PERIOD, "hold_released", SourceCoordinates(TOPIC, PARTITION, 11)
    )
    result = job.run(released)
    assert result.outcome is Outcome.HELD, result.detail
    assert job.invoices() == []
