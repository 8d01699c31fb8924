"""The replay's comparison of an issued invoice with the recomputed one (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from streams.apps.replay.diff import CustomerDiff, IssuedInvoice, IssuedLine, compare, lines_differ
from streams.core.domain.invoice import TaxedLine, UsageLine, compute_invoice

TOPIC = "billing.account-events.v1"
RATE = Decimal("0.1")


def line(event_id: str, amount: str, offset: int, partition: int = 2) -> UsageLine:
    return UsageLine(
        event_id=event_id,
        customer_id="c1",
        billing_period="2024-09",
        amount=Decimal(amount),
        currency="USD",
        quantity=None,
        unit=None,
        description=None,
        sku_id=None,
        region_id="us-east-1",
        charge_category="Usage",
        event_time=datetime(2024, 9, 3, tzinfo=UTC),
        source_topic=TOPIC,
        source_partition=partition,
        source_offset=offset,
    )


def taxed(lines: list[UsageLine], rate: Decimal = RATE) -> list[TaxedLine]:
    return [TaxedLine(x.event_id, "STD", rate, x.amount * rate) for x in lines]


def issued_from(
    lines: list[UsageLine], *, close_offset: int, rate: Decimal = RATE
) -> IssuedInvoice:
    totals = compute_invoice(lines, taxed(lines, rate), currency="USD")
    return IssuedInvoice(
        invoice_id="00000000-0000-0000-0000-000000000001",
        invoice_number="INV-2024-09-000001",
        revision=1,
        customer_id="c1",
        currency="USD",
        subtotal=totals.subtotal,
        tax_total=totals.tax_total,
        total=totals.total,
        line_count=totals.line_count,
        source_partition=2,
        close_offset=close_offset,
        lines=tuple(
            IssuedLine(x.event_id, x.amount, x.source_partition, x.source_offset) for x in lines
        ),
    )


def diff_of(
    issued: IssuedInvoice | None,
    lines: list[UsageLine],
    *,
    window: dict[int, tuple[int, int]] | None = None,
    stored: set[str] | None = None,
) -> CustomerDiff:
    return compare(
        customer_id="c1",
        billing_period="2024-09",
        issued=issued,
        lines=lines,
        totals=compute_invoice(lines, taxed(lines), currency="USD"),
        window=window if window is not None else {2: (0, 100)},
        stored_event_ids=stored if stored is not None else {x.event_id for x in lines},
    )


BASE = [line("a", "10.005", 1), line("b", "2.10", 4)]


def test_the_same_invoice_is_no_difference() -> None:
    issued = issued_from(BASE, close_offset=5)
    diff = diff_of(issued, BASE)
    assert not diff.has_difference and diff.judgeable and not lines_differ(issued, BASE)
    assert diff.delta.total == 0


def test_late_usage_is_usage_not_invoiced_and_changes_totals() -> None:
    issued = issued_from(BASE, close_offset=5)
    late = line("c", "1.00", 9)
    diff = diff_of(issued, [*BASE, late])
    assert diff.has_difference and diff.totals_changed
    [ref] = diff.usage_not_invoiced
    assert (ref.event_id, ref.amount, ref.late, ref.stored) == ("c", Decimal("1.00"), True, True)
    assert diff.recomputed.subtotal == Decimal("13.10")  # 13.105 rounded once, half-even
    assert diff.delta.subtotal == Decimal("1.00") and diff.delta.line_count == 1
    assert "1 usage line(s) not invoiced (1 late)" in diff.reason()


def test_a_lost_write_before_the_close_is_not_late_and_not_stored() -> None:
    issued = issued_from(BASE[:1], close_offset=5)
    diff = diff_of(issued, BASE, stored={"a"})
    [ref] = diff.usage_not_invoiced
    assert (ref.event_id, ref.late, ref.stored) == ("b", False, False)
    assert diff.to_json()["usage_not_invoiced"][0]["amount"] == "2.10"


def test_invoiced_line_missing_inside_the_window_is_absent() -> None:
    issued = issued_from(BASE, close_offset=5)
    diff = diff_of(issued, BASE[:1])
    assert [x.event_id for x in diff.invoiced_not_in_usage] == ["b"]
    assert diff.judgeable and diff.has_difference


def test_invoiced_line_outside_the_window_cannot_be_judged() -> None:
    issued = issued_from(BASE, close_offset=5)
    diff = diff_of(issued, BASE[1:], window={2: (3, 100)})  # line "a" at offset 1 < start 3
    assert [x.event_id for x in diff.outside_window] == ["a"]
    assert diff.invoiced_not_in_usage == () and not diff.judgeable


def test_changed_amount_and_changed_rate() -> None:
    issued = issued_from(BASE, close_offset=5)
    changed = [BASE[0], line("b", "2.20", 4)]
    diff = diff_of(issued, changed)
    assert [(c.event_id, c.issued, c.rebuilt) for c in diff.amount_changed] == [
        ("b", Decimal("2.10"), Decimal("2.20"))
    ]
    other_rate = issued_from(BASE, close_offset=5, rate=Decimal("0.2"))
    diff = diff_of(other_rate, BASE)
    assert not diff.lines_changed and diff.totals_changed and diff.has_difference
    assert diff.reason() == "totals changed"


def test_missing_invoice() -> None:
    diff = diff_of(None, BASE)
    assert diff.kind == "missing_invoice" and diff.has_difference and diff.issued_figures is None
    assert [x.late for x in diff.usage_not_invoiced] == [None, None]
    assert diff.to_json()["issued"] is None
    assert diff.delta.subtotal == diff.recomputed.subtotal
