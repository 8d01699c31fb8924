"""Invoice computation: round once, tax grouping, traceability and the refusals."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.core.domain.errors import InvoiceRuleViolation
from streams.core.domain.events import SourceRange, TaxAmount
from streams.core.domain.invoice import (
    TaxedLine,
    TaxLine,
    UsageLine,
    compute_invoice,
    lines_before_marker,
)
from streams.core.domain.money import InvalidAmount, UnknownCurrency

TOPIC = "billing.account-events.v1"


def line(
    event_id: str,
    amount: str,
    *,
    offset: int = 0,
    partition: int = 3,
    currency: str = "USD",
    customer_id: str = "cust-1",
    period: str = "2024-09",
    description: str | None = None,
) -> UsageLine:
    return UsageLine(
        event_id=event_id,
        customer_id=customer_id,
        billing_period=period,
        amount=Decimal(amount),
        currency=currency,
        quantity=Decimal("1"),
        unit="Hours",
        description=description if description is not None else f"line {event_id}",
        sku_id="SKU",
        region_id="us-west-2",
        charge_category="Usage",
        event_time=datetime(2024, 9, 18, 22, tzinfo=UTC),
        source_topic=TOPIC,
        source_partition=partition,
        source_offset=offset,
    )


def untaxed(lines: Sequence[UsageLine]) -> list[TaxedLine]:
    """A zero-rate answer for every line."""
    return [TaxedLine(item.event_id, "EXEMPT", Decimal("0"), Decimal("0")) for item in lines]


def at_rate(lines: Sequence[UsageLine], code: str, rate: str) -> list[TaxedLine]:
    return [
        TaxedLine(item.event_id, code, Decimal(rate), item.amount * Decimal(rate)) for item in lines
    ]


def test_subtotal_is_rounded_once_not_per_line() -> None:
    lines = [line(f"e{i}", "0.004", offset=i) for i in range(1000)]
    totals = compute_invoice(lines, untaxed(lines), currency="USD")
    assert totals.subtotal == Decimal("4.00")  # per-line rounding would give 0.00
    assert str(totals.subtotal) == "4.00"
    assert totals.line_count == 1000


def test_eleven_decimal_amounts_are_summed_exactly() -> None:
    lines = [line("a", "0.00000080000"), line("b", "0.00499919999", offset=1)]
    # exact sum 0.00499999999 → 0.00; a per-step float or early rounding could tip it.
    totals = compute_invoice(lines, untaxed(lines), currency="USD")
    assert totals.subtotal == Decimal("0.00")
    lines.append(line("c", "0.00000000001", offset=2))
    # exact sum 0.00500000000: a tie, half-even → 0.00 (not 0.01)
    assert compute_invoice(lines, untaxed(lines), currency="USD").subtotal == Decimal("0.00")
    lines.append(line("d", "0.00000000001", offset=3))
    assert compute_invoice(lines, untaxed(lines), currency="USD").subtotal == Decimal("0.01")


def test_negative_lines_reduce_the_subtotal() -> None:
    lines = [
        line("u", "10.005"),
        line("credit", "-2.50", offset=1),
        line("adj", "-0.0001", offset=2),
    ]
    totals = compute_invoice(lines, untaxed(lines), currency="USD")
    assert totals.subtotal == Decimal("7.50")  # 7.5049 → 7.50
    negative = [line("only-credit", "-3.125")]
    assert compute_invoice(negative, untaxed(negative), currency="USD").subtotal == Decimal("-3.12")


def test_jpy_and_bhd_minor_units() -> None:
    yen = [line("y1", "100.5", currency="JPY"), line("y2", "0.0", currency="JPY", offset=1)]
    assert str(compute_invoice(yen, untaxed(yen), currency="JPY").subtotal) == "100"
    dinar = [line("b1", "1.0015", currency="BHD")]
    assert str(compute_invoice(dinar, untaxed(dinar), currency="BHD").subtotal) == "1.002"


def test_zero_lines_make_a_zero_invoice() -> None:
    totals = compute_invoice([], [], currency="USD")
    assert str(totals.subtotal) == "0.00"
    assert totals.tax_total == 0
    assert totals.total == 0
    assert totals.taxes == ()
    assert totals.largest_lines == ()
    assert totals.source == ()
    assert totals.line_count == 0


def test_taxes_are_grouped_by_code_and_rate_and_rounded_once_per_group() -> None:
    standard = [line(f"s{i}", "0.05", offset=i) for i in range(3)]
    reduced = [line("r1", "10.00", offset=10), line("r2", "0.015", offset=11)]
    exempt = [line("x1", "5.00", offset=20)]
    lines = [*standard, *reduced, *exempt]
    taxed = [
        *at_rate(standard, "VAT", "0.2"),  # 3 x 0.01 = 0.03
        *at_rate(reduced, "VAT", "0.055"),  # 0.55 + 0.000825 = 0.550825 → 0.55
        *untaxed(exempt),
    ]
    totals = compute_invoice(lines, taxed, currency="USD")
    assert totals.taxes == (
        TaxAmount(
            tax_code="EXEMPT",
            rate=Decimal("0"),
            taxable_amount=Decimal("5.00"),
            amount=Decimal("0.00"),
        ),
        TaxAmount(
            tax_code="VAT",
            rate=Decimal("0.055"),
            taxable_amount=Decimal("10.015"),
            amount=Decimal("0.55"),
        ),
        TaxAmount(
            tax_code="VAT",
            rate=Decimal("0.2"),
            taxable_amount=Decimal("0.15"),
            amount=Decimal("0.03"),
        ),
    )
    assert str(totals.taxes[1].taxable_amount) == "10.015"  # exact, not rounded
    assert totals.subtotal == Decimal("15.16")  # 15.165 → half-even 15.16
    assert totals.tax_total == Decimal("0.58")
    assert totals.total == Decimal("15.74")


def test_tax_is_rounded_once_per_group_not_per_line() -> None:
    lines = [line(f"t{i}", "0.02", offset=i) for i in range(10)]
    # each line's tax is 0.004 (would round to 0.00 per line); the group's is 0.04
    totals = compute_invoice(lines, at_rate(lines, "VAT", "0.2"), currency="USD")
    assert totals.taxes[0].amount == Decimal("0.04")
    assert totals.tax_total == Decimal("0.04")


def test_equal_rates_written_differently_are_one_group() -> None:
    lines = [line("a", "1.00"), line("b", "1.00", offset=1)]
    taxed = [
        TaxedLine("a", "VAT", Decimal("0.20"), Decimal("0.2")),
        TaxedLine("b", "VAT", Decimal("0.2"), Decimal("0.2")),
    ]
    assert len(compute_invoice(lines, taxed, currency="USD").taxes) == 1


def test_largest_lines_by_absolute_amount_ties_by_event_id() -> None:
    lines = [
        line("e", "1.00", offset=0),
        line("d", "-9.00", offset=1, description="credit"),
        line("c", "5.00", offset=2),
        line("b", "5.00", offset=3),
        line("a", "0.10", offset=4),
        line("f", "5.00", offset=5, description=""),
    ]
    totals = compute_invoice(lines, untaxed(lines), currency="USD", largest=4)
    assert [(s.description, s.amount) for s in totals.largest_lines] == [
        ("credit", Decimal("-9.00")),
        ("line b", Decimal("5.00")),
        ("line c", Decimal("5.00")),
        ("SKU", Decimal("5.00")),  # no description: falls back to the SKU
    ]
    shuffled = list(reversed(lines))
    again = compute_invoice(shuffled, untaxed(shuffled), currency="USD", largest=4)
    assert again.largest_lines == totals.largest_lines
    assert totals.largest_lines[0].quantity == Decimal("1")
    assert totals.largest_lines[0].unit == "Hours"
    assert (
        compute_invoice(lines, untaxed(lines), currency="USD").largest_lines[-1].description
        == "line e"
    )
    assert compute_invoice(lines, untaxed(lines), currency="USD", largest=0).largest_lines == ()


def test_source_ranges_per_topic_and_partition() -> None:
    lines = [
        line("a", "1", offset=17),
        line("b", "1", offset=5),
        line("c", "1", offset=40),
        replace(line("d", "1", offset=2), source_topic="billing.other.v1"),
    ]
    totals = compute_invoice(lines, untaxed(lines), currency="USD")
    assert totals.source == (
        SourceRange(topic=TOPIC, partition=3, first_offset=5, last_offset=40),
        SourceRange(topic="billing.other.v1", partition=3, first_offset=2, last_offset=2),
    )
    more = [*lines, line("e", "1", offset=7, partition=0)]
    assert [
        (r.topic, r.partition) for r in compute_invoice(more, untaxed(more), currency="USD").source
    ] == [
        (TOPIC, 0),
        (TOPIC, 3),
        ("billing.other.v1", 3),
    ]


# ----------------------------------------------------------------------------- refusals


def test_mixed_currencies_are_refused() -> None:
    lines = [line("a", "1"), line("b", "1", currency="EUR", offset=1)]
    with pytest.raises(InvoiceRuleViolation, match="currency"):
        compute_invoice(lines, untaxed(lines), currency="USD")


def test_lines_in_another_currency_than_the_invoice_are_refused() -> None:
    lines = [line("a", "1", currency="EUR")]
    with pytest.raises(InvoiceRuleViolation, match="currency"):
        compute_invoice(lines, untaxed(lines), currency="USD")


def test_unknown_invoice_currency_is_refused_even_without_lines() -> None:
    with pytest.raises(UnknownCurrency):
        compute_invoice([], [], currency="XXX")


def test_mixed_customers_or_periods_are_refused() -> None:
    customers = [line("a", "1"), line("b", "1", customer_id="cust-2", offset=1)]
    with pytest.raises(InvoiceRuleViolation, match="customer_id"):
        compute_invoice(customers, untaxed(customers), currency="USD")
    periods = [line("a", "1"), line("b", "1", period="2024-10", offset=1)]
    with pytest.raises(InvoiceRuleViolation, match="billing_period"):
        compute_invoice(periods, untaxed(periods), currency="USD")


def test_a_line_without_tax_is_refused() -> None:
    lines = [line("a", "1"), line("b", "1", offset=1)]
    with pytest.raises(InvoiceRuleViolation, match="without a tax answer: 'b'"):
        compute_invoice(lines, untaxed(lines[:1]), currency="USD")


def test_a_line_with_two_tax_answers_is_refused() -> None:
    lines = [line("a", "1")]
    with pytest.raises(InvoiceRuleViolation, match="more than one tax answer"):
        compute_invoice(lines, [*untaxed(lines), *at_rate(lines, "VAT", "0.2")], currency="USD")


def test_a_tax_answer_for_an_unknown_line_is_refused() -> None:
    lines = [line("a", "1")]
    stray = TaxedLine("zzz", "VAT", Decimal("0.2"), Decimal("1"))
    with pytest.raises(InvoiceRuleViolation, match="unknown line 'zzz'"):
        compute_invoice(lines, [*untaxed(lines), stray], currency="USD")


def test_duplicate_event_ids_are_refused() -> None:
    lines = [line("a", "1", offset=1), line("a", "1", offset=9)]
    with pytest.raises(InvoiceRuleViolation, match="duplicate"):
        compute_invoice(lines, untaxed(lines[:1]), currency="USD")


def test_negative_largest_is_refused() -> None:
    with pytest.raises(InvoiceRuleViolation):
        compute_invoice([], [], currency="USD", largest=-1)


def test_float_amounts_and_naive_times_are_refused_at_construction() -> None:
    with pytest.raises(InvalidAmount):
        replace(line("a", "1"), amount=0.1)  # type: ignore[arg-type]
    with pytest.raises(InvalidAmount):
        TaxedLine("a", "VAT", 0.2, Decimal("0"))  # type: ignore[arg-type]
    with pytest.raises(InvoiceRuleViolation, match="naive"):
        replace(line("a", "1"), event_time=datetime(2024, 9, 1))


def test_tax_line_carries_the_exact_amount_and_region() -> None:
    assert line("a", "0.00000080000").tax_line() == TaxLine(
        line_id="a", amount=Decimal("0.00000080000"), region_id="us-west-2", tax_code=None
    )


# ----------------------------------------------------------------------------- close marker


def test_lines_before_marker_keeps_lower_offsets_only() -> None:
    lines = [line("a", "1", offset=10), line("b", "1", offset=15), line("c", "1", offset=11)]
    kept = lines_before_marker(lines, marker_partition=3, marker_offset=15)
    assert [item.event_id for item in kept] == ["a", "c"]  # 15 is not before 15
    assert lines_before_marker(lines, 3, 10) == []
    assert lines_before_marker(lines, 3, 16) == lines


def test_lines_before_marker_refuses_another_partition() -> None:
    lines = [line("a", "1", offset=1), line("b", "1", offset=2, partition=4)]
    with pytest.raises(InvoiceRuleViolation, match="partition 4"):
        lines_before_marker(lines, marker_partition=3, marker_offset=100)
