"""The independent answer of the pricing demo (streams/devtools/demo/pricing/expected.py), on
hand-computed cases: the vendors' published examples (docs/rating.md "What vendors
publish"), the bounds, proration, segments.

It must not use the rating core: the last tests check its imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from streams.devtools.demo.pricing import expected as checker
from streams.devtools.demo.pricing.expected import (
    ExpectedInvoice,
    expected_invoices,
    month_days,
    parse_events,
    plan_of_each_day,
    subscription_changes,
)

D = Decimal
CUSTOMER = "c1"


def book(charges: str, metrics: str = "", *, extra_plans: str = "") -> str:
    """A book with plan ``p`` v1 (and optional more plans), USD, the given charges."""
    base_metrics = """
  - {code: calls, aggregation: sum, property: n}
  - {code: hits, aggregation: count}
"""
    return (
        "schema_version: 1\nmetrics:"
        + base_metrics
        + metrics
        + "plans:\n  - code: p\n    versions:\n      - version: 1\n"
        + "        effective_from: 2024-01-01\n        currency: USD\n        charges:\n"
        + "".join(f"          - {line}\n" for line in charges.strip().splitlines())
        + extra_plans
    )


class Events:
    """CloudEvents JSON lines for one customer, as the generator writes them."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.add("customer.upserted", {"name": "C", "email": "c@x.example", "currency": "USD"})

    def add(self, event_type: str, data: dict[str, Any], event_id: str | None = None) -> Events:
        event_id = event_id or f"e{len(self.lines)}"
        self.lines.append(
            json.dumps(
                {
                    "specversion": "1.0",
                    "id": event_id,
                    "source": "/t",
                    "type": event_type,
                    "time": "2024-09-01T00:00:00Z",
                    "subject": CUSTOMER,
                    "data": {"schema_version": 1, "customer_id": CUSTOMER, **data},
                }
            )
        )
        return self

    def start(self, at: str, plan: str = "p", version: int = 1) -> Events:
        data = {"effective_at": at, "plan_code": plan, "plan_version": version}
        return self.add("subscription.started", data)

    def change(self, at: str, plan: str, version: int = 1) -> Events:
        data = {"effective_at": at, "plan_code": plan, "plan_version": version}
        return self.add("subscription.changed", data)

    def end(self, at: str) -> Events:
        return self.add("subscription.ended", {"effective_at": at})

    def metered(
        self,
        metric: str,
        at: str = "2024-09-10T12:00:00Z",
        event_id: str | None = None,
        properties: dict[str, str] | None = None,
        **values: str,
    ) -> Events:
        data = {
            "metric": metric,
            "event_time": at,
            "properties": properties or {},
            "values": values,
        }
        return self.add("usage.metered", data, event_id)

    def priced(
        self, amount: str, at: str = "2024-09-10T00:00:00Z", period: str = "2024-09"
    ) -> Events:
        data = {"billing_period": period, "amount": amount, "currency": "USD", "event_time": at}
        return self.add("usage.recorded", data)

    def rate(self, book_text: str, period: str = "2024-09") -> ExpectedInvoice:
        return expected_invoices(book_text, parse_events(self.lines), period)[CUSTOMER]


def whole_month(period: str = "2024-09") -> Events:
    return Events().start(f"{int(period[:4]) - 1}-12-01T00:00:00Z")


def amounts(invoice: ExpectedInvoice) -> list[Decimal]:
    return [line.amount for line in invoice.lines]


# ----------------------------------- the vendors' published figures (docs/rating.md)

ZUPLO = "[{up_to: 1000, unit_price: 0.10}, {up_to: 10000, unit_price: 0.05}, {up_to: null, unit_price: 0.01}]"
AUTUMN = "[{up_to: 1000, unit_price: 0.01}, {up_to: 10000, unit_price: 0.008}, {up_to: inf, unit_price: 0.005}]"
LAGO_GRADUATED = (
    "[{up_to: 100, unit_price: 1}, {up_to: 200, unit_price: 0.5}, {up_to: null, unit_price: 0.1}]"
)
LAGO_VOLUME = (
    "[{up_to: 10000, unit_price: 0.0010, flat_amount: 10}, {up_to: 50000, unit_price: 0.0008, flat_amount: 10},"
    " {up_to: 100000, unit_price: 0.0006, flat_amount: 10}, {up_to: null, unit_price: 0.0004, flat_amount: 10}]"
)
FLEXPRICE_VOLUME = (
    "[{up_to: 10000, unit_price: 0.0010}, {up_to: 50000, unit_price: 0.0008},"
    " {up_to: 100000, unit_price: 0.0006}, {up_to: null, unit_price: 0.0004}]"
)  # fmt: skip


@pytest.mark.parametrize(
    ("model", "tiers", "quantity", "total"),
    [
        ("graduated", ZUPLO, "15000", "600.00"),  # Zuplo docs
        ("volume", ZUPLO, "15000", "150.00"),  # Zuplo docs
        ("graduated", AUTUMN, "15000", "107.00"),  # Autumn docs
        ("graduated", LAGO_GRADUATED, "250", "155.00"),  # Lago docs, by the rule
        ("volume", LAGO_VOLUME, "65000", "49.00"),  # Lago docs
        ("volume", FLEXPRICE_VOLUME, "65000", "39.00"),  # Flexprice docs
    ],
)
def test_the_published_tier_examples(model: str, tiers: str, quantity: str, total: str) -> None:
    text = book(f"{{code: c, model: {model}, metric: calls, tiers: {tiers}}}")
    invoice = whole_month().metered("calls", n=quantity).rate(text)
    assert invoice.subtotal == D(total)
    [line] = invoice.lines
    assert line.quantity == D(quantity) and line.metric == "calls" and line.days == 30


@pytest.mark.parametrize(
    ("quantity", "total"),
    [("201", "10.00"), ("0", "0.00"), ("100", "0.00"), ("101", "5.00"), ("200", "5.00")],
)
def test_lago_package_first_100_free_then_5_per_started_100(quantity: str, total: str) -> None:
    text = book(
        "{code: c, model: package, metric: calls, package_size: 100, price: 5, free_units: 100}"
    )
    assert whole_month().metered("calls", n=quantity).rate(text).subtotal == D(total)


@pytest.mark.parametrize(
    ("quantity", "graduated", "volume"),
    [
        ("0", "0", "0"),  # nothing falls in a tier: no flat amount either
        ("1000", "100", "100"),  # exactly up_to: still the first tier
        ("1001", "100.05", "50.05"),  # just over
        ("1000.5", "100.025", "50.025"),  # a fraction split across the bound
    ],
)
def test_tier_bounds(quantity: str, graduated: str, volume: str) -> None:
    for model, total in (("graduated", graduated), ("volume", volume)):
        text = book(f"{{code: c, model: {model}, metric: calls, tiers: {ZUPLO}}}")
        invoice = whole_month().metered("calls", n=quantity).rate(text)
        assert amounts(invoice) == [D(total)], model


def test_flat_amounts_are_due_for_each_graduated_tier_touched() -> None:
    tiers = "[{up_to: 10, unit_price: 1, flat_amount: 5}, {up_to: null, unit_price: 0.5, flat_amount: 7}]"
    text = book(f"{{code: c, model: graduated, metric: calls, tiers: {tiers}}}")
    assert amounts(whole_month().metered("calls", n="10").rate(text)) == [D(15)]
    assert amounts(whole_month().metered("calls", n="12").rate(text)) == [D(23)]


# ------------------------------------------------------------------ proration and segments


@pytest.mark.parametrize(
    ("period", "days_used", "expected"),
    [
        ("2023-02", 10, "10.714285714286"),  # 30 * 10 / 28 = 10.7142857142857…
        ("2024-02", 1, "1.034482758621"),  # 30 / 29 = 1.03448275862068…: up at the 12th place
        ("2024-09", 10, "10"),  # 30 * 10 / 30
        ("2024-10", 30, "29.032258064516"),  # 30 * 30 / 31 = 29.0322580645161…
    ],
)
def test_a_fixed_fee_is_prorated_by_day_to_12_places(
    period: str, days_used: int, expected: str
) -> None:
    last = month_days(period)[-1]
    first = month_days(period)[len(month_days(period)) - days_used]
    text = book("{code: fee, model: fixed, amount: 30}")
    invoice = Events().start(f"{first.isoformat()}T09:30:00Z").rate(text, period)
    [line] = invoice.lines
    assert line.days == days_used and line.amount == D(expected)
    assert last.month == first.month


def test_a_whole_month_is_the_fee_itself_and_a_start_on_the_last_day_bills_one_day() -> None:
    text = book("{code: fee, model: fixed, amount: 30}")
    assert amounts(whole_month().rate(text)) == [D(30)]
    last_day = Events().start("2024-09-30T23:00:00Z").rate(text)
    assert last_day.segments == (("p", 1, 1),) and amounts(last_day) == [D(1)]


def test_lagos_january_15th_change_bills_14_days_of_the_old_plan() -> None:
    plans = """
  - code: q
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: fee, model: fixed, amount: 62}
"""
    text = book("{code: fee, model: fixed, amount: 31}", extra_plans=plans)
    events = Events().start("2024-12-20T00:00:00Z").change("2025-01-15T10:00:00Z", "q")
    invoice = events.rate(text, "2025-01")
    assert invoice.segments == (("p", 1, 14), ("q", 1, 17))
    assert amounts(invoice) == [D(14), D(34)]  # 31 * 14 / 31, 62 * 17 / 31
    assert invoice.subtotal == D("48.00")


def test_the_day_rule_at_the_edges() -> None:
    changes = subscription_changes(
        parse_events(
            Events()
            .start("2024-09-03T23:00:00Z")  # a late start bills its day
            .end("2024-09-10T13:00:00Z")  # an end at 13:00 bills its day
            .start("2024-09-20T00:00:00Z", "p")
            .end("2024-09-25T00:00:00Z")  # an end at midnight does not
            .lines
        )
    )
    days = sorted(day.day for day in plan_of_each_day("2024-09", changes))
    assert days == [3, 4, 5, 6, 7, 8, 9, 10, 20, 21, 22, 23, 24]


def test_two_events_at_one_instant_the_later_in_the_file_wins() -> None:
    at = "2024-09-10T12:00:00Z"
    changes = subscription_changes(
        parse_events(Events().start(at, "p").change(at, "q").change(at, "p").lines)
    )
    plans = plan_of_each_day("2024-09", changes)
    assert set(plans.values()) == {("p", 1)} and min(plans).day == 10


def test_back_and_forth_gives_one_segment_per_version_and_the_free_tier_once() -> None:
    plans = """
  - code: q
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: c, model: per_unit, metric: calls, unit_price: 1}
"""
    tiers = "[{up_to: 100, unit_price: 0}, {up_to: null, unit_price: 1}]"
    text = book(f"{{code: c, model: graduated, metric: calls, tiers: {tiers}}}", extra_plans=plans)
    events = (
        whole_month()
        .change("2024-09-11T00:00:00Z", "q")
        .change("2024-09-21T00:00:00Z", "p")
        .metered("calls", "2024-09-05T00:00:00Z", n="80")
        .metered("calls", "2024-09-15T00:00:00Z", n="7")
        .metered("calls", "2024-09-25T00:00:00Z", n="80")
    )
    invoice = events.rate(text)
    assert invoice.segments == (("p", 1, 20), ("q", 1, 10))
    assert amounts(invoice) == [D(60), D(7)]  # 160 under p: 100 free once, then 60


# ------------------------------------------------------------------ aggregations


def test_unique_count_ignores_repeated_values_and_count_a_filter() -> None:
    metrics = """
  - {code: seats, aggregation: unique_count, property: user}
  - {code: api, aggregation: count, filter: {billable: ["true"]}}
"""
    text = book(
        "{code: s, model: per_unit, metric: seats, unit_price: 8}\n"
        "{code: a, model: per_unit, metric: api, unit_price: 0.5}",
        metrics,
    )
    events = whole_month()
    for user in ("ann", "bob", "ann", "ann"):
        events.metered("seats", properties={"user": user})
    for billable in ("true", "true", "false"):
        events.metered("api", properties={"billable": billable})
    events.metered("api", properties={})  # no billable property: excluded as well
    invoice = events.rate(text)
    assert [(line.quantity, line.amount) for line in invoice.lines] == [(D(2), D(16)), (D(2), D(1))]


def test_max_latest_and_a_tie_on_time_goes_to_the_greater_event_id() -> None:
    metrics = """
  - {code: peak, aggregation: max, property: gb}
  - {code: last, aggregation: latest, property: gb}
"""
    text = book(
        "{code: m, model: per_unit, metric: peak, unit_price: 1}\n"
        "{code: l, model: per_unit, metric: last, unit_price: 1}",
        metrics,
    )
    events = whole_month()
    events.metered("peak", "2024-09-02T00:00:00Z", gb="10")
    events.metered("peak", "2024-09-03T00:00:00Z", gb="12.5")
    events.metered("peak", "2024-09-04T00:00:00Z", gb="11")
    events.metered("last", "2024-09-20T00:00:00Z", "z-late", gb="4")
    events.metered("last", "2024-09-29T10:00:00Z", "a", gb="7")
    events.metered("last", "2024-09-29T10:00:00Z", "b", gb="6")  # same time, greater id
    assert amounts(events.rate(text)) == [D("12.5"), D(6)]


def test_group_by_gives_a_line_per_value_and_none_for_events_without_it() -> None:
    metrics = "  - {code: egress, aggregation: sum, property: gb, group_by: region}\n"
    tiers = "[{up_to: 10, unit_price: 0}, {up_to: null, unit_price: 1}]"
    text = book(f"{{code: e, model: graduated, metric: egress, tiers: {tiers}}}", metrics)
    events = whole_month()
    events.metered("egress", gb="12", properties={"region": "us"})
    events.metered("egress", gb="5", properties={"region": "eu"})
    events.metered("egress", gb="9", properties={"region": "eu"})
    events.metered("egress", gb="11", properties={})
    invoice = events.rate(text)
    assert [(line.group, line.quantity, line.amount) for line in invoice.lines] == [
        (None, D(11), D(1)),
        ("eu", D(14), D(4)),  # each group priced on its own tiers
        ("us", D(12), D(2)),
    ]


def test_no_usage_shows_one_line_at_quantity_zero() -> None:
    text = book("{code: c, model: per_unit, metric: calls, unit_price: 1}")
    invoice = whole_month().rate(text)
    [line] = invoice.lines
    assert (line.quantity, line.amount, line.group) == (D(0), D(0), None)


def test_a_duplicate_event_id_counts_once() -> None:
    text = book("{code: h, model: per_unit, metric: hits, unit_price: 1}")
    events = whole_month().metered("hits", event_id="same").metered("hits", event_id="same")
    assert amounts(events.rate(text)) == [D(1)]


# ------------------------------------------------------------------ minimum, pass-through, rounding


@pytest.mark.parametrize(
    ("calls", "true_up"), [("30", "20"), ("50", None), ("80", None)]
)  # fmt: skip
def test_a_minimum_tops_the_segment_up_only_when_short(calls: str, true_up: str | None) -> None:
    text = book(
        "{code: c, model: per_unit, metric: calls, unit_price: 1}\n"
        "{code: min, model: minimum, amount: 50}"
    )
    invoice = whole_month().metered("calls", n=calls).rate(text)
    lines = {line.charge: line.amount for line in invoice.lines}
    assert lines.get("min") == (None if true_up is None else D(true_up))
    assert invoice.subtotal == max(D(calls), D(50))


def test_a_minimum_is_prorated_and_counts_the_segments_fee_and_pass_through() -> None:
    text = book(
        "{code: fee, model: fixed, amount: 30}\n"
        "{code: min, model: minimum, amount: 300}\n"
        "{code: cloud, model: pass_through, markup_percent: 5}"
    )
    invoice = Events().start("2024-09-21T00:00:00Z").priced("40", "2024-09-25T00:00:00Z").rate(text)
    # 10 days: fee 10, minimum 100; the pre-priced 40 on the 25th + 5%
    assert {line.charge: line.amount for line in invoice.lines} == {
        "fee": D(10),
        "cloud": D(42),
        "min": D(48),
    }


def test_a_pre_priced_line_of_the_month_before_belongs_to_the_first_day() -> None:
    text = book("{code: cloud, model: pass_through, markup_percent: -10}")
    invoice = whole_month().priced("10", "2024-08-31T22:00:00Z").rate(text)
    assert amounts(invoice) == [D(9)]  # a discount
    late = Events().start("2024-09-02T00:00:00Z").priced("10", "2024-08-31T22:00:00Z")
    assert late.rate(text).subtotal is None  # the 1st has no plan: nobody prices it


def test_pass_through_at_cost_without_a_subscription_and_rounded_once_half_even() -> None:
    text = book("{code: fee, model: fixed, amount: 1}")
    invoice = Events().priced("0.005").priced("0.0000001").priced("0.12").rate(text)
    assert invoice.segments == () and invoice.exact_total == D("0.1250001")
    assert invoice.subtotal == D("0.13")
    half = Events().priced("0.125").rate(text)
    assert half.subtotal == D("0.12")  # half to even
    assert Events().priced("0.135").rate(text).subtotal == D("0.14")


# ------------------------------------------------------------------ gaps are holds


def test_gaps_hold_the_invoice() -> None:
    text = book("{code: c, model: per_unit, metric: calls, unit_price: 1}")
    no_plan = Events().metered("calls", n="1").rate(text)
    assert no_plan.subtotal is None and "without a subscription" in no_plan.gaps[0]
    unpriced = whole_month().metered("hits").rate(text)
    assert unpriced.subtotal is None and "not priced" in unpriced.gaps[0]
    unknown = Events().start("2024-01-01T00:00:00Z", "nope").rate(text)
    assert unknown.subtotal is None and "not in the price book" in unknown.gaps[0]
    missing_value = whole_month().metered("calls").rate(text)
    assert missing_value.subtotal is None and "no decimal" in missing_value.gaps[0]
    no_pass_through = whole_month().priced("1").rate(text)
    assert no_pass_through.subtotal is None and "pass_through" in no_pass_through.gaps[0]


# ------------------------------------------------------------------ independence


CHECKER = Path(checker.__file__)


def test_the_checker_imports_nothing_of_the_project() -> None:
    modules: list[str] = []
    for node in ast.walk(ast.parse(CHECKER.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            modules.append(node.module or "")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            raise AssertionError("no dynamic imports")
    assert modules, "the walk found the imports"
    assert [m for m in modules if m.split(".")[0] == "streams"] == []
    assert {m.split(".")[0] for m in modules} <= {
        "__future__", "collections", "dataclasses", "datetime", "decimal", "fractions",
        "itertools", "json", "math", "pathlib", "typing", "yaml",
    }  # fmt: skip


def test_importing_and_running_the_checker_loads_no_rating_code() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "pricing" / "price-book.yaml"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from streams.devtools.demo.pricing.expected import expected_invoices\n"
        f"expected_invoices(Path({str(example)!r}).read_text(), [], '2024-11')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('streams.'))\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = result.stdout.strip().split(",")
    assert "streams.devtools.demo.pricing.expected" in loaded
    assert [m for m in loaded if m.startswith("streams.core.domain")] == []
