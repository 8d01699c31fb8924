"""Rating a billing period: lines, proration, minimums, pass-through, holds, rounding."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from streams.core.domain.events import (
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
)
from streams.core.domain.focus import FocusUsage, iter_focus_rows
from streams.core.domain.invoice import UsageLine, price_invoice
from streams.core.domain.money import UnknownCurrency
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import (
    HoldCode,
    MeteredEvent,
    PriceBook,
    RatedInvoice,
    RatingError,
    Segment,
    Usage,
    load_price_book,
    rate,
    rate_events,
    segments_for,
)

D = Decimal
ROOT = Path(__file__).resolve().parents[3]
SEPT = BillingPeriod(2024, 9)

BOOK = load_price_book(
    """\
metrics:
  - {code: api_calls, name: API calls, unit: calls, aggregation: count}
  - {code: storage, aggregation: max, property: gb, unit: GB}
  - {code: seats, aggregation: unique_count, property: user}
  - {code: egress, aggregation: sum, property: gb, group_by: region}
  - {code: unpriced, aggregation: count}
plans:
  - code: basic
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: platform, name: Platform fee, model: fixed, amount: 30}
          - code: api
            model: graduated
            metric: api_calls
            tiers:
              - {up_to: 1000, unit_price: 0.10}
              - {up_to: 10000, unit_price: 0.05}
              - {up_to: null, unit_price: 0.01}
          - code: storage
            model: volume
            metric: storage
            tiers: [{up_to: 100, unit_price: 0.2}, {up_to: null, unit_price: 0.1, flat_amount: 5}]
          - {code: seats, model: package, metric: seats, package_size: 5, price: 20, free_units: 5}
          - {code: egress, model: per_unit, metric: egress, unit_price: 0.01}
          - {code: min, model: minimum, amount: 100}
          - {code: cloud, model: pass_through, markup_percent: 10}
      - version: 2
        effective_from: 2024-09-15
        currency: USD
        charges:
          - {code: platform, model: fixed, amount: 60}
          - {code: api, model: per_unit, metric: api_calls, unit_price: 0.001}
  - code: euro
    versions:
      - {version: 1, effective_from: 2024-01-01, currency: EUR, charges: []}
  - code: bare
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: platform, model: fixed, amount: 10}
"""
)


def at(day: int, hour: int = 12) -> datetime:
    return datetime(2024, 9, day, hour, tzinfo=UTC)


def subscribed(
    plan: str = "basic", version: int = 1, *, day: int | None = None
) -> SubscriptionStarted:
    when = at(day, 0) if day is not None else datetime(2024, 8, 1, tzinfo=UTC)
    return SubscriptionStarted(
        customer_id="c", plan_code=plan, plan_version=version, effective_at=when
    )


def calls(n: int, *, day: int = 5, prefix: str = "call") -> list[MeteredEvent]:
    return [MeteredEvent(f"{prefix}-{i}", "api_calls", at(day)) for i in range(n)]


def usage_line(event_id: str, amount: str, *, currency: str = "USD", day: int = 3) -> UsageLine:
    return UsageLine(
        event_id=event_id,
        customer_id="c",
        billing_period="2024-09",
        amount=D(amount),
        currency=currency,
        quantity=None,
        unit=None,
        description=f"cloud {event_id}",
        sku_id=None,
        region_id=None,
        charge_category="Usage",
        event_time=at(day),
        source_topic="billing.account-events.v1",
        source_partition=3,
        source_offset=int(event_id.split("-")[-1]) if event_id[-1].isdigit() else 0,
    )


def rated(
    subscriptions: Sequence[SubscriptionEvent] | None = None,
    metered: Sequence[MeteredEvent] | None = None,
    pass_through: Sequence[UsageLine] | None = None,
    *,
    book: PriceBook = BOOK,
    currency: str = "USD",
) -> RatedInvoice:
    return rate_events(
        SEPT,
        currency=currency,
        book=book,
        subscriptions=subscriptions or [],
        metered=metered or [],
        pass_through=pass_through or [],
    )


def amounts(invoice: RatedInvoice) -> dict[str, Decimal]:
    return {
        line.charge_code + (f"[{line.group_value}]" if line.group_value else ""): line.amount
        for line in invoice.lines
    }


def codes(invoice: RatedInvoice) -> list[HoldCode]:
    return [hold.code for hold in invoice.holds]


# --------------------------------------------------------------------------- a full period


def test_a_full_period_prices_every_charge_and_rounds_the_subtotal_once() -> None:
    metered = calls(15000)
    metered += [
        MeteredEvent(f"s{i}", "storage", at(2 + i), values={"gb": D(v)})
        for i, v in enumerate(["40", "150.5", "90"])
    ]
    metered += [MeteredEvent(f"u{i}", "seats", at(3), {"user": f"u{i % 11}"}) for i in range(30)]
    metered += [
        MeteredEvent("g1", "egress", at(4), {"region": "eu"}, {"gb": D("0.333")}),
        MeteredEvent("g2", "egress", at(5), {"region": "us"}, {"gb": D("1.5")}),
        MeteredEvent("g3", "egress", at(6), {"region": "eu"}, {"gb": D("0.001")}),
    ]
    invoice = rated([subscribed()], metered, [usage_line("cloud-1", "10.004")])
    assert invoice.holds == ()
    assert amounts(invoice) == {
        "platform": D(30),
        "api": D("600.00"),  # Zuplo's tiers, 15,000 calls
        "storage": D("150.5") * D("0.1") + D(5),  # volume: 150.5 GB all in tier 2, + flat
        "seats": D(40),  # 11 seats, 5 free: 2 started packs of 5
        "egress[eu]": D("0.00334"),
        "egress[us]": D("0.015"),
    }
    assert [line.amount for line in invoice.pass_through] == [D("11.0044")]
    exact = sum(amounts(invoice).values(), D(0)) + D("11.0044")
    assert invoice.exact_total == exact == D("701.07274")
    assert invoice.subtotal == D("701.07")
    api = next(line for line in invoice.lines if line.charge_code == "api")
    assert (api.plan_code, api.plan_version, api.charge_model, api.metric, api.unit) == (
        "basic",
        1,
        "graduated",
        "api_calls",
        "calls",
    )
    assert api.quantity == D(15000) and api.description == "API calls"
    assert [(t.tier, t.units, t.unit_price, t.amount) for t in api.tiers] == [
        (1, D(1000), D("0.10"), D("100.00")),
        (2, D(9000), D("0.05"), D("450.00")),
        (3, D(5000), D("0.01"), D("50.00")),
    ]
    seats = next(line for line in invoice.lines if line.charge_code == "seats")
    assert seats.quantity == D(11) and seats.package is not None and seats.package.packages == 2
    egress = [line for line in invoice.lines if line.charge_code == "egress"]
    assert [(line.group_value, line.quantity, line.unit_price) for line in egress] == [
        ("eu", D("0.334"), D("0.01")),
        ("us", D("1.5"), D("0.01")),
    ]
    assert egress[0].description == "egress (region=eu)"
    assert len({line.line_id for line in invoice.lines}) == len(invoice.lines)
    assert invoice.line_count == 7


def test_rating_is_deterministic_line_ids_included() -> None:
    first = rated([subscribed()], calls(10))
    second = rated([subscribed()], calls(10)[::-1])
    assert first == second
    assert [line.line_id for line in first.lines] == [line.line_id for line in second.lines]


def test_a_charge_without_usage_is_a_zero_line_not_a_missing_one() -> None:
    invoice = rated([subscribed()])
    egress = [line for line in invoice.lines if line.charge_code == "egress"]
    assert [
        (line.group_value, line.quantity, line.amount, line.description) for line in egress
    ] == [(None, D(0), D(0), "egress")]
    # and the minimum tops the fixed fee up to 100
    assert amounts(invoice)["min"] == D(70)


# --------------------------------------------------------------------------- proration, segments


@pytest.mark.parametrize(
    ("year", "month", "days"), [(2025, 2, 28), (2024, 2, 29), (2024, 9, 30), (2024, 10, 31)]
)
def test_a_fixed_fee_for_one_day_is_the_fee_over_the_days_of_the_month(
    year: int, month: int, days: int
) -> None:
    period = BillingPeriod(year, month)
    last_day = (period.end - timedelta(days=1)).day
    start = SubscriptionStarted(
        customer_id="c",
        plan_code="bare",
        plan_version=1,
        effective_at=datetime(year, month, last_day, 20, tzinfo=UTC),
    )
    invoice = rate_events(period, currency="USD", book=BOOK, subscriptions=[start])
    [line] = invoice.lines
    assert line.proration is not None
    assert (line.proration.days, line.proration.days_in_period) == (1, days)
    assert line.amount == (D(10) / D(days)).quantize(D("1E-12"))
    assert invoice.subtotal == (D(10) / D(days)).quantize(D("0.01"))


def test_a_plan_change_mid_period_rates_each_segment_under_its_version() -> None:
    change = SubscriptionChanged(
        customer_id="c", plan_code="basic", plan_version=2, effective_at=at(16, 9)
    )
    metered = calls(1500, day=10, prefix="before") + calls(4000, day=16, prefix="after")
    invoice = rated([subscribed(), change], metered)
    assert [(s.plan_version, s.describe()) for s in invoice.segments] == [
        (1, "2024-09-01..2024-09-15"),
        (2, "2024-09-16..2024-09-30"),
    ]
    by_version: dict[int, dict[str, Decimal]] = defaultdict(dict)
    for line in invoice.lines:
        by_version[line.plan_version][line.charge_code] = line.amount
    assert by_version[1]["platform"] == D(15)  # 30 * 15 / 30
    assert by_version[1]["api"] == D("125.00")  # 1,000 * 0.10 + 500 * 0.05
    assert "min" not in by_version[1]  # 140 >= the prorated minimum 100 * 15 / 30
    assert by_version[2] == {"platform": D(30), "api": D("4.000")}  # tiers restart per version
    assert invoice.holds == ()


def test_the_minimum_is_prorated_and_trues_up_only_when_not_met() -> None:
    # Ten days of "basic": a minimum of 100 * 10 / 30; the fixed fee 30 * 10 / 30 = 10.
    ten_days = [subscribed(day=21)]
    short = rated(ten_days, calls(50, day=25))
    line = next(line for line in short.lines if line.charge_code == "min")
    assert line.true_up is not None
    assert line.true_up.minimum == D("33.333333333333")
    assert line.true_up.charged == D(10) + D("5.00")
    assert line.amount == D("33.333333333333") - D(15)
    assert line.proration is not None and line.proration.days == 10
    assert short.subtotal == D("33.33")
    met = rated(ten_days, calls(400, day=25))  # 10 + 40 > 33.33
    assert "min" not in amounts(met)
    assert met.subtotal == D("50.00")


def test_a_minimum_met_exactly_needs_no_true_up() -> None:
    exactly = rated([subscribed()], calls(700))  # 30 + 700 * 0.10 = 100
    assert "min" not in amounts(exactly)
    one_short = rated([subscribed()], calls(699))
    assert amounts(one_short)["min"] == D("0.10")
    assert exactly.subtotal == one_short.subtotal == D("100.00")


def test_pass_through_counts_towards_the_minimum() -> None:
    invoice = rated([subscribed()], [], [usage_line("cloud-1", "80")])
    assert "min" not in amounts(invoice)  # 30 + 80 * 1.1 = 118 >= 100
    assert invoice.subtotal == D("118.00")


# --------------------------------------------------------------------------- pass-through


def _focus_lines() -> dict[tuple[str, str], list[UsageLine]]:
    groups: dict[tuple[str, str], list[UsageLine]] = defaultdict(list)
    with (ROOT / "examples" / "focus" / "focus_sample.csv").open(
        encoding="utf-8", newline=""
    ) as handle:
        for offset, row in enumerate(iter_focus_rows(handle)):
            assert isinstance(row, FocusUsage)
            data = row.usage
            groups[(data.customer_id, data.billing_period)].append(
                UsageLine(
                    event_id=row.event_id,
                    customer_id=data.customer_id,
                    billing_period=data.billing_period,
                    amount=data.amount,
                    currency=data.currency,
                    quantity=data.quantity,
                    unit=data.unit,
                    description=data.description,
                    sku_id=data.sku_id,
                    region_id=data.region_id,
                    charge_category=data.charge_category,
                    event_time=data.event_time,
                    source_topic="billing.account-events.v1",
                    source_partition=0,
                    source_offset=offset,
                )
            )
    return groups


def test_pure_pass_through_customers_rate_to_exactly_todays_subtotal() -> None:
    """The FOCUS demo: no subscription, only usage.recorded. Every one of the 73
    (customer, month) invoices equals what price_invoice computes today."""
    groups = _focus_lines()
    assert len(groups) == 73
    empty = PriceBook()
    for (customer, period), lines in sorted(groups.items()):
        currency = lines[0].currency
        invoice = rate(period, currency=currency, book=empty, pass_through=lines)
        today = price_invoice(lines, currency=currency)
        assert invoice.holds == (), customer
        assert invoice.subtotal == today.subtotal, (customer, period)
        assert invoice.exact_total == sum((line.amount for line in lines), D(0))
        assert [p.amount for p in invoice.pass_through] == [line.amount for line in lines]
        assert all(p.markup_percent is None and p.plan_code is None for p in invoice.pass_through)
        assert invoice.lines == ()


def test_markup_and_discount_apply_exactly_per_line() -> None:
    book = load_price_book(
        """\
plans:
  - code: resell
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges: [{code: cloud, model: pass_through, markup_percent: 7.5}]
      - version: 2
        effective_from: 2024-01-01
        currency: USD
        charges: [{code: cloud, model: pass_through, markup_percent: -12.345}]
"""
    )
    lines = [usage_line("l-1", "0.00000080000"), usage_line("l-2", "-3.5")]
    up = rated([subscribed("resell")], [], lines, book=book)
    assert [(p.amount, p.markup_percent, p.plan_code) for p in up.pass_through] == [
        (D("0.00000080000") * D("1.075"), D("7.5"), "resell"),
        (D("-3.7625"), D("7.5"), "resell"),
    ]
    down = rated([subscribed("resell", 2)], [], lines, book=book)
    assert [p.amount for p in down.pass_through] == [
        D("0.00000080000") * D("0.87655"),
        D("-3.067925"),
    ]


def test_a_pre_priced_line_before_the_period_belongs_to_its_first_day() -> None:
    line = usage_line("cloud-1", "10")
    early = UsageLine(**{**line.__dict__, "event_time": datetime(2024, 8, 31, 22, tzinfo=UTC)})
    invoice = rated([subscribed()], [], [early])
    assert [p.plan_code for p in invoice.pass_through] == ["basic"]


# --------------------------------------------------------------------------- gaps are holds


def test_metered_usage_without_any_subscription_is_held() -> None:
    invoice = rated([], calls(3))
    assert codes(invoice) == [HoldCode.NO_SUBSCRIPTION]
    assert (
        "3 metered event(s) on 1 day(s) without a subscription (2024-09-05)"
        in invoice.holds[0].message
    )
    assert invoice.subtotal is None
    assert invoice.rounded_total == D(0)


def test_usage_before_the_first_subscription_is_held() -> None:
    invoice = rated([subscribed(day=10)], calls(2, day=9) + calls(5, day=10, prefix="in"))
    assert codes(invoice) == [HoldCode.NO_SUBSCRIPTION]
    assert "2 metered event(s)" in invoice.holds[0].message
    assert next(line for line in invoice.lines if line.charge_code == "api").quantity == D(5)


def test_usage_after_an_end_is_held() -> None:
    ended = SubscriptionEnded(customer_id="c", effective_at=at(20, 0))
    assert codes(rated([subscribed(), ended], calls(1, day=25))) == [HoldCode.NO_SUBSCRIPTION]
    assert codes(rated([subscribed(), ended], calls(1, day=19))) == []


def test_unknown_plans_and_versions_are_held() -> None:
    for plan, version in (("enterprise", 1), ("basic", 9)):
        invoice = rated([subscribed(plan, version)], calls(1))
        assert codes(invoice) == [HoldCode.UNKNOWN_PLAN]
        assert invoice.holds[0].plan_code == plan and invoice.holds[0].plan_version == version
        assert invoice.subtotal is None


def test_a_version_used_before_its_effective_date_is_held() -> None:
    invoice = rated([subscribed("basic", 2)])  # effective from 2024-09-15, used from 09-01
    assert codes(invoice) == [HoldCode.VERSION_NOT_EFFECTIVE]


def test_currency_mismatches_are_held() -> None:
    assert codes(rated([subscribed("euro")])) == [HoldCode.CURRENCY_MISMATCH]
    pre_priced = rated([], [], [usage_line("l-1", "1", currency="EUR"), usage_line("l-2", "1")])
    assert codes(pre_priced) == [HoldCode.CURRENCY_MISMATCH]
    assert "1 pre-priced usage line(s) in EUR" in pre_priced.holds[0].message


def test_metrics_the_plan_or_the_book_does_not_price_are_held() -> None:
    unpriced = [MeteredEvent("x", "unpriced", at(3))]
    assert codes(rated([subscribed("bare")], calls(1) + unpriced)) == [
        HoldCode.UNPRICED_METRIC,
        HoldCode.UNPRICED_METRIC,
    ]
    unknown = [MeteredEvent("y", "teleportation", at(3))]
    invoice = rated([subscribed()], unknown)
    assert codes(invoice) == [HoldCode.UNKNOWN_METRIC]
    assert invoice.holds[0].metric == "teleportation"


def test_invalid_usage_and_negative_tier_quantities_are_held() -> None:
    missing = [MeteredEvent("s1", "storage", at(3))]
    invoice = rated([subscribed()], missing)
    assert codes(invoice) == [HoldCode.INVALID_USAGE]
    assert "no decimal value 'gb'" in invoice.holds[0].message
    book = load_price_book(
        """\
metrics: [{code: delta, aggregation: sum, property: n}]
plans:
  - code: p
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges: [{code: d, model: graduated, metric: delta, tiers: [{up_to: null, unit_price: 1}]}]
"""
    )
    negative = [MeteredEvent("n1", "delta", at(3), values={"n": D(-2)})]
    assert codes(rated([subscribed("p")], negative, book=book)) == [HoldCode.INVALID_QUANTITY]


def test_pre_priced_usage_a_plan_does_not_price_is_held() -> None:
    assert codes(rated([subscribed("bare")], [], [usage_line("l-1", "1")])) == [
        HoldCode.PASS_THROUGH_NOT_PRICED
    ]
    late_start = rated([subscribed(day=10)], [], [usage_line("l-1", "1", day=3)])
    assert codes(late_start) == [HoldCode.PASS_THROUGH_NOT_PRICED]


# --------------------------------------------------------------------------- caller mistakes raise


def test_inconsistent_input_raises_instead_of_rating() -> None:
    with pytest.raises(RatingError, match="duplicate usage event id"):
        rated([], [], [usage_line("l-1", "1"), usage_line("l-1", "1")])
    other = UsageLine(**{**usage_line("l-2", "1").__dict__, "billing_period": "2024-10"})
    with pytest.raises(RatingError, match="is of 2024-10"):
        rated([], [], [other])
    with pytest.raises(RatingError, match="other definitions"):
        rate(SEPT, currency="USD", book=BOOK, usage=Usage.for_book(SEPT, PriceBook()))
    with pytest.raises(RatingError, match="not in 2024-09"):
        rated([], [MeteredEvent("oct", "api_calls", datetime(2024, 10, 1, tzinfo=UTC))])
    overlapping = [
        Segment("basic", 1, (date(2024, 9, 1),), 30),
        Segment("bare", 1, (date(2024, 9, 1),), 30),
    ]
    with pytest.raises(RatingError, match="two segments"):
        rate(SEPT, currency="USD", book=BOOK, segments=overlapping)
    with pytest.raises(UnknownCurrency):
        rate(SEPT, currency="XXX", book=BOOK)


def test_rate_takes_stored_usage_as_the_view_keeps_it() -> None:
    """The usage view stores Usage as JSON per (customer, period); rating it gives
    the same invoice as rating the events."""
    events = [*calls(1200), MeteredEvent("u1", "seats", at(4), {"user": "a"})]
    stored = Usage.from_json(Usage.of(SEPT, BOOK, events).to_json())
    segments = segments_for(SEPT, [subscribed()])
    assert rate(SEPT, currency="USD", book=BOOK, segments=segments, usage=stored) == rated(
        [subscribed()], events
    )
