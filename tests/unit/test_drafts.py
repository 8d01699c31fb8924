"""Drafts and finalisation without services (docs/invoices.md "Drafts and finalisation"):
the grace rule, the field's bounds on the wire, and the invoicing worker's loop on the
twins — a close with a grace period makes a draft (no number, no outbox row), late usage
re-rates it in place, the grace timer produces the finalisation marker on the customer's
partition and the owner issues it once; grace 0 issues at the close as before.

Oracles: literals (the rule's table, sums of the amounts this test sends), the twin
tables and the in-memory topic.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pydantic
import pytest

from streams.adapters.memory.store import drafts as twin_drafts
from streams.adapters.memory.store import tables
from streams.apps.invoicing.jobs import draft_grace
from streams.core.billing.rating import PeriodInputs, Rated, rate_period
from streams.core.billing.rows import Customer, Draft
from streams.core.domain.codec import decode
from streams.core.domain.drafts import (
    FINALIZE_REASON,
    Grace,
    finalize_marker,
    grace_ends_at,
    grace_of,
)
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    SubscriptionEvent,
    close_marker_id,
    invoice_id_for,
)
from streams.core.domain.rating import PlanVersion, PriceBook, load_price_book
from streams.core.domain.rating.published import canonical, content_sha256
from streams.settings import Settings
from tests.support import rating as rating_scenario
from tests.support.kafka import headers_of
from tests.support.twins import PERIOD, Twins, drive, subscribe

# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("customer", "plan", "expected"),
    [
        (None, None, Grace(Decimal(0), "default")),
        (None, Decimal(24), Grace(Decimal(24), "plan")),
        (Decimal(2), Decimal(24), Grace(Decimal(2), "customer")),
        (Decimal(0), Decimal(24), Grace(Decimal(0), "customer")),  # opting out wins
        (Decimal("0.5"), None, Grace(Decimal("0.5"), "customer")),
    ],
)
def test_the_customers_grace_wins_over_the_plans(
    customer: Decimal | None, plan: Decimal | None, expected: Grace
) -> None:
    assert grace_of(customer, plan) == expected
    assert expected.drafts is (expected.hours > 0)


def test_the_grace_period_ends_hours_later_to_the_microsecond() -> None:
    start = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert grace_ends_at(start, Decimal("0.5")) == start + timedelta(minutes=30)
    assert grace_ends_at(start, Decimal("0.002")) == start + timedelta(seconds=7.2)
    assert grace_ends_at(start, Decimal(72)) == start + timedelta(days=3)


def _customer(**extra: object) -> CustomerUpserted:
    return CustomerUpserted.model_validate(
        {"customer_id": "c1", "name": "C", "email": "a@c.example", "currency": "USD", **extra}
    )


@pytest.mark.parametrize("value", ["0", "0.5", "72", "8760", "0.000001", "1.50"])
def test_a_grace_period_is_a_decimal_string_of_hours(value: str) -> None:
    parsed = _customer(invoice_grace_hours=value)
    assert parsed.invoice_grace_hours == Decimal(value)
    assert parsed.model_dump(mode="json")["invoice_grace_hours"] == format(
        Decimal(value).normalize(), "f"
    )


@pytest.mark.parametrize("value", ["-1", "8760.5", "0.0000001", "abc", "1e400"])
def test_a_grace_period_out_of_bounds_is_refused(value: str) -> None:
    with pytest.raises(pydantic.ValidationError):
        _customer(invoice_grace_hours=value)


def test_a_customer_without_the_field_is_what_it_was() -> None:
    assert _customer().invoice_grace_hours is None
    assert "invoice_grace_hours" not in _customer().model_dump(mode="json", exclude_none=True)


def test_a_plan_version_without_grace_keeps_its_content_hash() -> None:
    version = PlanVersion.model_validate(
        {"version": 1, "effective_from": "2026-01-01", "currency": "USD"}
    )
    definition = canonical(version)
    assert "invoice_grace_hours" not in definition
    assert content_sha256(definition) == content_sha256(
        {"version": 1, "effective_from": "2026-01-01", "currency": "USD", "charges": []}
    )
    graced = PlanVersion.model_validate(
        {"version": 1, "effective_from": "2026-01-01", "currency": "USD",
         "invoice_grace_hours": "24"}
    )  # fmt: skip
    assert canonical(graced)["invoice_grace_hours"] == "24"


def test_the_timer_and_the_command_send_one_marker_id() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)
    a = finalize_marker("c1", PERIOD, "id-1", at=at, source="/a")
    b = finalize_marker("c1", PERIOD, "id-1", at=at + timedelta(hours=1), source="/b")
    assert a.id == b.id == close_marker_id("c1", PERIOD, FINALIZE_REASON, "id-1")
    assert isinstance(a.data, BillingPeriodClosed) and a.data.reason == "draft_finalize"


# --------------------------------------------------------------------------- the worker


@pytest.fixture
def twins(settings: Settings) -> Twins:
    return Twins.create(settings)


def _graced(twins: Twins, customer: str, hours: str | None) -> None:
    twins.send(
        CustomerUpserted(
            customer_id=customer,
            name=f"Customer {customer}",
            email=f"ap@{customer}.example",
            currency="USD",
            invoice_grace_hours=None if hours is None else Decimal(hours),
        ),
        event_id=f"customer-{customer}-{uuid.uuid4().hex[:6]}",
    )


def _draft(twins: Twins, customer: str) -> Draft | None:
    found: Draft | None = twins.db.table(twin_drafts.INVOICE_DRAFTS).get(
        invoice_id_for(customer, PERIOD, 1)
    )
    return found


def _finalize_markers(twins: Twins, customer: str) -> list[BillingPeriodClosed]:
    found = []
    for record in twins.kafka.records(twins.topic):
        if record.key() != customer.encode():
            continue
        envelope = decode(record.key(), record.value(), headers_of(record))
        data = envelope.data
        if isinstance(data, BillingPeriodClosed) and data.reason == FINALIZE_REASON:
            found.append(data)
    return found


def test_grace_zero_issues_at_the_close(twins: Twins) -> None:
    customer = twins.customer_on(1, "zero")
    _graced(twins, customer, "0")
    twins.usage(customer, "10.125")
    twins.close(customer)
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: bool(twins.invoices(customer)), what="the invoice")
    assert twins.invoices(customer)[0].invoice_number.startswith(f"INV-{PERIOD}-")
    assert _draft(twins, customer) is None
    assert len(twins.rows(tables.OUTBOX)) == 1
    worker.executor.shutdown()


def test_a_draft_is_re_rated_by_late_usage_and_finalised_by_the_timer(twins: Twins) -> None:
    customer = twins.customer_on(2, "graced")
    _graced(twins, customer, "1000")
    twins.usage(customer, "10.125")
    twins.usage(customer, "2.5")
    twins.close(customer)
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: _draft(twins, customer) is not None, what="the draft")
    draft = _draft(twins, customer)
    assert draft is not None and draft.status == "draft" and draft.invoice_number is None
    assert (draft.subtotal, draft.grace_source, draft.grace_hours) == (
        Decimal("12.62"), "customer", Decimal(1000)
    )  # fmt: skip
    assert twins.invoices(customer) == [] and twins.rows(tables.OUTBOX) == []
    closes = [r for r in twins.rows(tables.PERIOD_CLOSES) if r.customer_id == customer]
    assert [c.outcome for c in closes] == ["drafted"]

    twins.usage(customer, "1.00")  # late: after the close marker
    drive(
        worker,
        lambda: (d := _draft(twins, customer)) is not None and d.rerated == 1,
        what="the re-rating",
    )
    state = worker.partitions[twins.partition_of(customer)]
    drive(worker, lambda: state.job is None, what="the re-rating collected")
    rerated = _draft(twins, customer)
    assert rerated is not None and rerated.subtotal == Decimal("13.62")
    assert rerated.grace_ends_at == draft.grace_ends_at  # the first close's end
    assert twins.invoices(customer) == [] and twins.rows(tables.OUTBOX) == []
    assert _finalize_markers(twins, customer) == []  # its grace period is far away

    # The grace period ends: the owner's timer sends the marker on the customer's key.
    key = (customer, PERIOD)
    state.drafts[key] = datetime.now(UTC)
    drive(worker, lambda: key not in state.drafts, what="the finalisation")
    invoice = twins.invoices(customer)[0]
    assert invoice.invoice_number.startswith(f"INV-{PERIOD}-") and invoice.subtotal == Decimal(
        "13.62"
    )
    assert len(_finalize_markers(twins, customer)) == 1
    final = _draft(twins, customer)
    assert final is not None and final.status == "finalized"
    assert final.invoice_number == invoice.invoice_number
    assert len(twins.rows(tables.OUTBOX)) == 1
    worker.executor.shutdown()


def test_a_new_owner_loads_the_open_drafts_of_its_partitions(twins: Twins) -> None:
    customer = twins.customer_on(3, "moved")
    _graced(twins, customer, "1000")
    twins.usage(customer, "5")
    twins.close(customer)
    first = twins.worker()
    subscribe(first)
    drive(first, lambda: _draft(twins, customer) is not None, what="the draft")
    first.consumer.close()
    first.executor.shutdown()
    second = twins.worker()
    subscribe(second)
    partition = twins.partition_of(customer)
    drive(
        second,
        lambda: (customer, PERIOD) in getattr(second.partitions.get(partition), "drafts", {}),
        what="the drafts loaded",
    )
    second.executor.shutdown()


# --------------------------------------------------------------------------- plan versions


def _rated(book_text: str, *subscriptions: SubscriptionEvent) -> tuple[PriceBook, Rated]:
    book = load_price_book(book_text)
    inputs = PeriodInputs(
        period=rating_scenario.PERIOD,
        currency="USD",
        book=book,
        subscriptions=subscriptions,
        metered=(),
        pass_through=(),
    )
    return book, rate_period(inputs)


def _book_with_grace(v1: str | None, v2: str | None) -> str:
    text = rating_scenario.book_text(with_v2=True)
    for version, hours in ((1, v1), (2, v2)):
        if hours is not None:
            text = text.replace(
                f"      - version: {version}\n",
                f'      - version: {version}\n        invoice_grace_hours: "{hours}"\n',
            )
    return text


def test_the_plan_version_of_the_periods_last_segment_gives_the_grace() -> None:
    customer = Customer("c", "C", "c@x.invalid", "USD")
    # v1 all month: its grace period
    book, rating = _rated(_book_with_grace("24", None), rating_scenario.started("c"))
    assert draft_grace(customer, book, rating) == Grace(Decimal(24), "plan")
    # v1 then v2 from the 16th: the last segment's version (v2, none stated) wins
    book, rating = _rated(
        _book_with_grace("24", None),
        rating_scenario.started("c"),
        rating_scenario.changed_to_v2("c"),
    )
    assert draft_grace(customer, book, rating) == Grace(Decimal(0), "default")
    book, rating = _rated(
        _book_with_grace(None, "0.5"),
        rating_scenario.started("c"),
        rating_scenario.changed_to_v2("c"),
    )
    assert draft_grace(customer, book, rating) == Grace(Decimal("0.5"), "plan")
    # the customer's own value, 0 included, wins over the plan's
    opted_out = Customer("c", "C", "c@x.invalid", "USD", invoice_grace_hours=Decimal(0))
    assert draft_grace(opted_out, book, rating) == Grace(Decimal(0), "customer")
    # no subscription (pre-priced only): the customer's, else 0
    book, rating = _rated(_book_with_grace("24", "24"))
    assert draft_grace(customer, book, rating) == Grace(Decimal(0), "default")
