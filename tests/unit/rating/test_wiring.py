"""Rating as the pipeline issues it (pure): rated invoice → priced invoice → tax → event and
email; the published price book's entries; the replay's charge comparison.

The figures are those of :mod:`tests.support.rating` (worked by hand there).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from streams.apps.email.render import format_exact, render_email
from streams.apps.replay.diff import IssuedCharge, IssuedInvoice, charge_changes, lines_differ
from streams.core.domain.codec import decode, encode
from streams.core.domain.errors import InvalidEvent, InvoiceRuleViolation
from streams.core.domain.events import (
    Envelope,
    InvoiceIssued,
    PlanVersionPublished,
    SubscriptionStarted,
)
from streams.core.domain.invoice import TaxedLine, UsageLine, apply_tax, price_invoice
from streams.core.domain.rating import (
    MeteredEvent,
    PriceBook,
    PriceBookError,
    RatedInvoice,
    load_price_book,
    priced_invoice,
    rate_events,
)
from streams.core.domain.rating.published import (
    assemble,
    canonical,
    content_sha256,
    entries_of,
    plan_publication,
)
from tests.support import rating as scenario

WHEN = datetime(2024, 8, 1, tzinfo=UTC)
SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def usage_line(event_id: str, amount: str, offset: int, day: int = 2) -> UsageLine:
    return UsageLine(
        event_id=event_id,
        customer_id="c",
        billing_period=scenario.PERIOD,
        amount=Decimal(amount),
        currency="USD",
        quantity=None,
        unit=None,
        description=f"line {event_id}",
        sku_id=None,
        region_id="eu-west-1",
        charge_category=None,
        event_time=scenario.utc(day),
        source_topic="t",
        source_partition=3,
        source_offset=offset,
    )


def metered() -> list[MeteredEvent]:
    return [MeteredEvent.of(event_id, data) for event_id, data in scenario.metered("c")]


def rated_v1(book_text: str | None = None) -> tuple[PriceBook, RatedInvoice]:
    book = load_price_book(book_text or scenario.book_text())
    rated = rate_events(
        scenario.PERIOD,
        currency="USD",
        book=book,
        subscriptions=[scenario.started("c")],
        metered=metered(),
    )
    return book, rated


# --------------------------------------------------------------------------- priced invoice


def test_a_pure_pass_through_customer_is_priced_exactly_as_before_rating() -> None:
    lines = [
        usage_line("u1", "1.005", 10),
        usage_line("u2", "2.50", 11),
        usage_line("u3", "-0.5", 12),
    ]
    rated = rate_events(
        scenario.PERIOD, currency="USD", book=load_price_book(""), pass_through=lines
    )
    assert priced_invoice(rated) == price_invoice(lines, currency="USD")


def test_a_subscriber_is_priced_with_its_charges_rating_and_one_tax_line_per_line() -> None:
    _, rated = rated_v1()
    priced = priced_invoice(rated, metered_events=352)
    assert priced.subtotal == scenario.SUBTOTAL_V1
    assert [c.charge_code for c in priced.charges] == ["platform", "api", "storage"]
    assert priced.rating is not None and priced.rating.exact_total == scenario.EXACT_V1
    assert priced.rating.metered_events == 352
    assert priced.line_count == 3 and priced.lines == ()
    tax_lines = priced.tax_lines()
    assert [t.line_id for t in tax_lines] == [c.line_id for c in priced.charges]
    taxed = [
        TaxedLine(t.line_id, "VAT", Decimal("0.2"), t.amount * Decimal("0.2")) for t in tax_lines
    ]
    totals = apply_tax(priced, taxed)
    assert totals.line_count == 3
    assert totals.taxes[0].taxable_amount == scenario.EXACT_V1
    assert totals.tax_total == Decimal("9.12")  # 9.125 rounded once, half-even
    assert totals.charges == priced.charges and totals.rating == priced.rating
    # A charge line missing from the tax answer is refused, as a usage line would be.
    with pytest.raises(InvoiceRuleViolation, match="without a tax answer"):
        apply_tax(priced, taxed[:-1])


def test_a_markup_bills_each_pre_priced_line_marked_up_with_its_source_kept() -> None:
    text = scenario.book_text().replace(
        "          - {code: storage, model: per_unit, metric: storage_gb, unit_price: 0.25}\n",
        "          - {code: storage, model: per_unit, metric: storage_gb, unit_price: 0.25}\n"
        "          - {code: cloud, model: pass_through, markup_percent: 10}\n",
    )
    lines = [usage_line("u1", "10", 10), usage_line("u2", "5.05", 11)]
    rated = rate_events(
        scenario.PERIOD,
        currency="USD",
        book=load_price_book(text),
        subscriptions=[scenario.started("c")],
        pass_through=lines,
    )
    priced = priced_invoice(rated)
    assert [(line.event_id, line.amount, line.source_offset) for line in priced.lines] == [
        ("u1", Decimal("11.0"), 10),
        ("u2", Decimal("5.555"), 11),
    ]
    assert priced.rating is not None
    [part] = priced.rating.pass_through
    assert (part.plan_code, part.markup_percent, part.lines, part.cost, part.amount) == (
        "pro",
        Decimal(10),
        2,
        Decimal("15.05"),
        Decimal("16.555"),
    )
    # 30 platform + 0 calls + 0 storage + 16.555 = 46.555 → 46.56 (half-even)
    assert priced.subtotal == Decimal("46.56")
    assert [s.topic for s in priced.source] == ["t"]


def test_a_held_rating_cannot_be_priced() -> None:
    rated = rate_events(
        scenario.PERIOD,
        currency="USD",
        book=load_price_book(scenario.book_text()),
        metered=metered(),
    )
    assert rated.holds and rated.holds[0].code.value == "no_subscription"
    with pytest.raises(InvoiceRuleViolation, match="no_subscription"):
        priced_invoice(rated)


def test_the_invoice_event_of_a_rated_invoice_validates_and_a_plain_one_has_no_rating_keys() -> (
    None
):
    _, rated = rated_v1()
    priced = priced_invoice(rated, metered_events=352)
    totals = apply_tax(
        priced, [TaxedLine(t.line_id, "VAT", Decimal(0), Decimal(0)) for t in priced.tax_lines()]
    )
    common = {
        "invoice_id": "6a0e1b0e-6a39-4f8e-8f1e-0d5a3c9d1f11",
        "invoice_number": "INV-2024-09-000001",
        "revision": 1,
        "customer_id": "c",
        "customer_name": "C",
        "email": "c@customers.invalid",
        "billing_period": scenario.PERIOD,
        "currency": "USD",
        "line_count": totals.line_count,
        "subtotal": totals.subtotal,
        "tax_total": totals.tax_total,
        "total": totals.total,
        "issued_at": WHEN,
    }
    rated_event = InvoiceIssued(**common, charges=totals.charges, rating=totals.rating)
    plain = InvoiceIssued(**common)
    schema = json.loads(
        (SCHEMAS / "billing.invoices.v1" / "invoice.issued.schema.json").read_text()
    )
    check = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    value = json.loads(encode(Envelope.wrap(rated_event, id="e", source="/t", time=WHEN)).value)
    check.validate(value)
    assert value["rating"]["exact_total"] == "45.625"
    assert value["charges"][1]["tiers"][1] == {
        "tier": 2,
        "above": "100",
        "up_to": "1000",
        "units": "250",
        "unit_price": "0.05",
        "flat_amount": "0",
        "amount": "12.50",
    }
    plain_value = json.loads(encode(Envelope.wrap(plain, id="e", source="/t", time=WHEN)).value)
    check.validate(plain_value)
    assert "charges" not in plain_value and "rating" not in plain_value
    assert InvoiceIssued.model_validate(value) == rated_event  # round trip

    text = render_email(rated_event, event_id="e", from_address="billing@x.example").get_body(
        preferencelist=("plain",)
    )
    assert text is not None
    body = str(text.get_content())
    assert "Sum of the lines (exact): 45.625 USD" in body
    assert "tier 2 (above 100 up to 1,000): 250 x 0.05 = 12.50" in body
    assert "The 5 largest" not in body and "Lines:           3" in body


@pytest.mark.parametrize(
    ("amount", "currency", "shown"),
    [("187.6536", "USD", "187.6536"), ("199", "USD", "199.00"), ("1234.5", "JPY", "1,234.5"),
     ("-0.000", "USD", "0.00"), ("1000000.125", "USD", "1,000,000.125")],
)  # fmt: skip
def test_exact_amounts_keep_every_decimal_and_at_least_the_minor_unit(
    amount: str, currency: str, shown: str
) -> None:
    assert format_exact(Decimal(amount), currency) == shown


# --------------------------------------------------------------------------- the published book


def test_entries_have_canonical_content_so_a_reformatted_price_is_the_same_entry() -> None:
    book = load_price_book(scenario.book_text())
    reformatted = load_price_book(scenario.book_text(tier2="0.050"))
    first = entries_of(book, published_at=WHEN)
    second = entries_of(reformatted, published_at=WHEN)
    assert [e.content_sha256 for e in first] == [e.content_sha256 for e in second]
    assert [e.record_key() for e in first] == [
        "metric/api_calls",
        "metric/storage_gb",
        "plan/pro/1",
    ]
    [version] = [e for e in first if isinstance(e, PlanVersionPublished)]
    assert version.content_sha256 == content_sha256(canonical(book.plans[0].versions[0]))
    assert version.definition["charges"][1]["tiers"][1]["unit_price"] == "0.05"


def test_publishing_keeps_what_is_published_adds_versions_and_refuses_other_content() -> None:
    published = entries_of(load_price_book(scenario.book_text()), published_at=WHEN)
    later = datetime(2024, 9, 1, tzinfo=UTC)
    same = plan_publication(load_price_book(scenario.book_text()), published, published_at=later)
    assert same.accepted and same.new == () and len(same.unchanged) == 3
    assert {e.published_at for e in same.unchanged} == {WHEN}  # the stored ones, unchanged
    grown = plan_publication(
        load_price_book(scenario.book_text(with_v2=True)), published, published_at=later
    )
    assert [e.record_key() for e in grown.new] == ["plan/pro/2"]
    assert grown.book is not None and [v.version for v in grown.book.plans[0].versions] == [1, 2]
    refused = plan_publication(
        load_price_book(scenario.book_text(tier2="0.06")), published, published_at=later
    )
    assert not refused.accepted and refused.book is None
    [(key, reason)] = refused.refused
    assert key == "plan/pro/1" and "immutable" in reason and "new version" in reason
    # A version that goes back in time next to the published one: the union is invalid.
    backwards = scenario.book_text().replace(
        "version: 1\n        effective_from: 2024-01-01",
        "version: 2\n        effective_from: 2023-12-01",
    )
    with pytest.raises(PriceBookError, match="must not be before 2024-01-01"):
        plan_publication(load_price_book(backwards), published, published_at=later)


def test_the_assembled_book_rates_exactly_as_the_file() -> None:
    book, rated = rated_v1(scenario.book_text(with_v2=True))
    assembled = assemble(entries_of(book, published_at=WHEN))
    again = rate_events(
        scenario.PERIOD,
        currency="USD",
        book=assembled,
        subscriptions=[scenario.started("c")],
        metered=metered(),
    )
    assert again == rated


def test_a_price_book_entry_travels_keyed_by_itself() -> None:
    [entry] = [
        e
        for e in entries_of(load_price_book(scenario.book_text()), published_at=WHEN)
        if isinstance(e, PlanVersionPublished)
    ]
    record = encode(Envelope.wrap(entry, id="p-1", source="/plans/publish", time=WHEN))
    assert record.key == b"plan/pro/1"
    assert decode(record.key, record.value, record.headers).data == entry
    with pytest.raises(InvalidEvent, match="is not 'plan/pro/1'"):
        decode(
            b"plan/pro/2",
            record.value,
            [(n, b"plan/pro/2" if n == "ce_subject" else v) for n, v in record.headers],
        )


# --------------------------------------------------------------------------- replay comparison


def test_charge_lines_are_compared_by_line_id_and_amount() -> None:
    _, rated = rated_v1()
    priced = priced_invoice(rated)
    issued = IssuedInvoice(
        invoice_id="i",
        invoice_number="INV",
        revision=1,
        customer_id="c",
        currency="USD",
        subtotal=priced.subtotal,
        tax_total=Decimal(0),
        total=priced.subtotal,
        line_count=3,
        source_partition=0,
        close_offset=10,
        lines=(),
        charges=tuple(IssuedCharge(c.line_id, c.description, c.amount) for c in priced.charges),
    )
    assert not lines_differ(issued, priced.lines, priced.charges)
    assert charge_changes(issued, priced.charges) == ()
    _, dearer = rated_v1(scenario.book_text(tier2="0.06"))
    candidate = priced_invoice(dearer)
    assert lines_differ(issued, candidate.lines, candidate.charges)
    [change] = charge_changes(issued, candidate.charges)
    assert (change.description, change.issued, change.rebuilt, change.delta) == (
        "API calls",
        Decimal("12.50"),
        Decimal("15.00"),
        Decimal("2.50"),
    )
    removed = charge_changes(issued, candidate.charges[:1])
    assert [(c.description, c.rebuilt) for c in removed] == [("API calls", None), ("Storage", None)]


def test_a_subscription_event_rebuilt_from_its_columns_is_the_event() -> None:
    from streams.core.billing.store.metering import _subscription

    event = SubscriptionStarted(customer_id="c", effective_at=WHEN, plan_code="pro", plan_version=2)
    assert _subscription(event.event_type, "c", "pro", 2, WHEN, None) == event
