"""The usage view's state rules and its preview, without Kafka (streams/apps/usage_view/state.py,
preview.py): the view's answer equals ``rate()`` over the same distinct events, whatever
the resends, redeliveries and partial changelog writes."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from streams.apps.usage_view import state
from streams.apps.usage_view.preview import preview
from streams.apps.usage_view.scenario import ScenarioConfig, events
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.invoice import UsageLine
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import MeteredEvent, PriceBook, load_price_book, rate_events

BOOK = load_price_book(
    (Path(__file__).resolve().parents[3] / "examples" / "pricing" / "price-book.yaml").read_text()
)
PERIOD = BillingPeriod.parse("2024-09")
NOW = datetime(2024, 9, 30, tzinfo=UTC)


class View:
    """The three tables as dicts, fed one record at a time as the faust agent does."""

    def __init__(self, book: PriceBook = BOOK) -> None:
        self.book = book
        self.customers: dict[str, dict[str, Any]] = {}
        self.periods: dict[str, dict[str, Any]] = {}
        self.ids: dict[str, str] = {}
        self.days: dict[str, dict[str, Any]] = {}
        self.outcomes: list[state.Outcome] = []

    def feed(
        self, envelope: Envelope, offset: int, partition: int = 0, *, write: str = "all"
    ) -> state.Change:
        period = state.event_period(envelope.data)
        key = state.period_key(envelope.subject, period) if period else None
        change = state.apply(
            envelope,
            partition=partition,
            offset=offset,
            customer=self.customers.get(envelope.subject),
            period=self.periods.get(key) if key else None,
            seen=self.seen(partition, envelope.id),
            book=self.book,
            now=NOW,
            day=self.days.get(state.usage_day_key(envelope.subject, envelope.data) or ""),
        )
        # ``write`` simulates a crash after only some changelog writes reached the broker
        if change.day is not None and change.day_key and write in ("all", "day"):
            self.days[change.day_key] = change.day
        if change.period is not None and change.period_key and write in ("all", "period"):
            self.periods[change.period_key] = change.period
        if change.event_id_value is not None and change.event_id and write in ("all", "ids"):
            self.record_id(partition, change.event_id, change.event_id_value)
        if change.customer is not None and write in ("all", "customer"):
            self.customers[envelope.subject] = change.customer
        self.outcomes.append(change.outcome)
        return change

    def seen(self, partition: int, event_id: str) -> str | None:
        """The ``event_ids`` value of ``event_id`` (one key per event here)."""
        return self.ids.get(event_id)

    def record_id(self, partition: int, event_id: str, value: str) -> None:
        self.ids[event_id] = value

    def answer(self, customer: str, period: BillingPeriod = PERIOD) -> Any:
        period_state = self.periods.get(state.period_key(customer, str(period)))
        days = {
            day: self.days.get(f"{customer}|{period}|{day}", state.new_day())
            for day in (period_state or {}).get("usage_days", [])
        }
        return preview(
            self.customers[customer],
            period_state,
            period,
            days=days,
            book=self.book,
            book_label="test",
            served_by="test",
            partition=0,
        )


def usage(
    event_id: str, amount: str, customer: str = "acme", day: int = 3, currency: str = "USD"
) -> Envelope:
    return Envelope.wrap(
        UsageRecorded(
            customer_id=customer,
            billing_period="2024-09",
            amount=Decimal(amount),
            currency=currency,
            event_time=datetime(2024, 9, day, 10, tzinfo=UTC),
        ),
        id=event_id,
        source="t",
    )


def customer(customer_id: str = "acme", currency: str = "USD") -> Envelope:
    return Envelope.wrap(
        CustomerUpserted(
            customer_id=customer_id, name="A", email="a@example.com", currency=currency
        ),
        id=f"c-{customer_id}",
        source="t",
    )


def close(customer_id: str = "acme", reason: str = "period_closed") -> Envelope:
    return Envelope.wrap(
        BillingPeriodClosed(
            customer_id=customer_id,
            billing_period="2024-09",
            closed_at=datetime(2024, 10, 1, tzinfo=UTC),
            reason=reason,
        ),
        id=f"close-{customer_id}-{reason}",
        source="t",
    )


def test_duplicates_and_conflicts_by_event_id() -> None:
    view = View()
    view.feed(customer(), 0)
    view.feed(usage("u1", "1.10"), 1)
    view.feed(usage("u1", "1.10"), 2)  # the same event again (another record)
    conflict = view.feed(usage("u1", "9.99"), 3)  # the same id, other content
    view.feed(usage("u2", "0.015"), 4)
    assert view.outcomes[1:] == [
        state.Outcome.APPLIED,
        state.Outcome.DUPLICATE,
        state.Outcome.CONFLICT,
        state.Outcome.APPLIED,
    ]
    assert conflict.detail is not None and "offset 1" in conflict.detail
    answer = view.answer("acme")
    assert answer.usage.pass_through.lines == 2
    assert answer.upcoming_invoice.exact_total == Decimal("1.115")
    assert answer.upcoming_invoice.subtotal is None  # the workers would hold it
    assert answer.upcoming_invoice.rounded_total == Decimal("1.12")
    assert [h.code for h in answer.upcoming_invoice.holds] == ["conflicting_events"]


@pytest.mark.parametrize("written", ["period", "ids", "customer", "none"])
def test_a_record_handled_again_after_a_crash_counts_once(written: str) -> None:
    """faust commits offsets after the changelog writes; a crash can leave any subset of
    one record's writes on the broker. Handling the record again counts it once."""
    view = View()
    view.feed(customer(), 0)
    view.feed(usage("u1", "2"), 1)
    view.feed(usage("u2", "3"), 2, write=written)
    view.feed(usage("u2", "3"), 2)  # the redelivery, same partition and offset
    view.feed(usage("u3", "5"), 3)
    assert view.answer("acme").upcoming_invoice.subtotal == Decimal("10.00")
    assert view.answer("acme").usage.pass_through.lines == 3


def test_usage_after_the_close_is_late_and_a_hold_release_takes_it_in() -> None:
    view = View()
    view.feed(customer(), 0)
    view.feed(usage("u1", "2"), 1)
    view.feed(close(), 2)
    assert view.feed(usage("u2", "3"), 3).outcome is state.Outcome.LATE
    answer = view.answer("acme")
    assert answer.closed is not None and answer.upcoming_invoice.subtotal == Decimal("2.00")
    assert answer.usage.late.pass_through_lines == 1
    assert answer.usage.late.pass_through_amounts == {"USD": Decimal(3)}
    view.feed(close(reason="hold_released"), 4)
    released = view.answer("acme")
    assert (
        released.upcoming_invoice.subtotal == Decimal("5.00")
        and released.usage.late.pass_through_lines == 0
    )


def test_the_customer_is_written_only_when_it_changes() -> None:
    view = View()
    assert view.feed(customer(), 0).customer is not None
    assert view.feed(usage("u1", "2"), 1).customer is not None  # a new period
    assert view.feed(usage("u2", "2"), 2).customer is None  # one write per event, not two


def test_refused_records_are_noted_on_their_customer() -> None:
    change = state.refused(None, "acme", 3, "value is not JSON")
    assert change.customer is not None and change.customer["refused"] == 1
    assert state.refused(None, None, 3, "no key").customer is None


def test_unknown_customer_currency_is_a_hold() -> None:
    view = View()
    view.feed(usage("u1", "2", currency="EUR"), 1)
    answer = view.answer("acme")
    assert answer.upcoming_invoice.currency == "EUR"
    assert [h.code for h in answer.upcoming_invoice.holds] == ["no_customer"]


def _lines(view_events: list[Envelope]) -> list[UsageLine]:
    lines = []
    for offset, envelope in enumerate(view_events):
        data = envelope.data
        if isinstance(data, UsageRecorded):
            lines.append(
                UsageLine(
                    envelope.id, data.customer_id, data.billing_period, data.amount, data.currency,
                    None, None, None, None, None, None, data.event_time, "t", 0, offset,
                )
            )  # fmt: skip
    return lines


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_view_rates_as_rate_events_on_a_metered_scenario(seed: int) -> None:
    """The agreement the invoice job relies on (docs/design.md, invariant 7), at unit level: for
    every customer, the view's subtotal (per-day pass-through sums, incremental
    aggregates) equals ``rate_events`` over the same distinct events, in any arrival
    order of resends and redeliveries."""
    config = ScenarioConfig(customers=30, pass_through_lines=12, metered_events=40, seed=seed)
    stream = list(events(config))
    rng = random.Random(seed)
    view = View()
    offset = 0
    for envelope in stream:
        view.feed(envelope, offset)
        if rng.random() < 0.05:  # a resend of the same event (another record)
            offset += 1
            view.feed(envelope, offset)
        if rng.random() < 0.05:  # a redelivery of the same record
            view.feed(envelope, offset)
        offset += 1
    checked = 0
    for customer_id in {e.subject for e in stream}:
        mine = [e for e in stream if e.subject == customer_id]
        expected = rate_events(
            PERIOD,
            currency="USD",
            book=BOOK,
            subscriptions=[
                e.data
                for e in mine
                if isinstance(e.data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded)
            ],
            metered=[
                MeteredEvent.of(e.id, e.data) for e in mine if isinstance(e.data, UsageMetered)
            ],
            pass_through=_lines(mine),
        )
        answer = view.answer(customer_id).upcoming_invoice
        assert answer.exact_total == expected.exact_total, customer_id
        assert answer.rounded_total == expected.rounded_total, customer_id
        assert [h.code for h in answer.holds] == [h.code.value for h in expected.holds], customer_id
        assert answer.subtotal == expected.subtotal
        assert len([x for x in answer.lines if x.kind == "charge"]) == len(expected.lines)
        checked += expected.subtotal is not None and bool(expected.lines)
    assert checked > 5  # the scenario rates customers under plans, not only at cost


def test_a_redefined_metric_is_reported_not_mispriced() -> None:
    view = View()
    view.feed(customer(), 0)
    start = SubscriptionStarted(
        customer_id="acme",
        effective_at=datetime(2024, 9, 1, tzinfo=UTC),
        plan_code="starter",
        plan_version=1,
    )
    view.feed(Envelope.wrap(start, id="s1", source="t"), 1)
    seat = UsageMetered(
        customer_id="acme",
        metric="seats",
        event_time=datetime(2024, 9, 2, tzinfo=UTC),
        properties={"user_id": "u1"},
    )
    view.feed(Envelope.wrap(seat, id="m1", source="t"), 2)
    assert view.answer("acme").upcoming_invoice.holds == ()
    seats = next(m for m in BOOK.metrics if m.code == "seats")
    changed = BOOK.model_copy(
        update={"metrics": tuple(replace_metric(m, seats) for m in BOOK.metrics)}
    )
    view.book = changed
    codes = [h.code for h in view.answer("acme").upcoming_invoice.holds]
    assert "stale_aggregates" in codes


def replace_metric(metric: Any, target: Any) -> Any:
    return (
        metric.model_copy(update={"name": "Seats (renamed)"})
        if metric.code == target.code
        else metric
    )


def test_expiry_of_closed_and_old_open_periods() -> None:
    view = View()
    view.feed(customer(), 0)
    view.feed(usage("u1", "2"), 1)
    value = view.periods[state.period_key("acme", "2024-09")]
    from datetime import timedelta

    keep, drop = timedelta(days=35), timedelta(days=400)
    assert not state.expired(value, now=NOW, retain_closed=keep, retain_open=drop)
    assert state.expired(value, now=NOW + timedelta(days=402), retain_closed=keep, retain_open=drop)
    view.feed(close(), 2)
    closed = view.periods[state.period_key("acme", "2024-09")]
    assert not state.expired(
        closed, now=datetime(2024, 10, 30, tzinfo=UTC), retain_closed=keep, retain_open=drop
    )
    assert state.expired(
        closed, now=datetime(2024, 11, 6, tzinfo=UTC), retain_closed=keep, retain_open=drop
    )


def test_clamped_day_matches_rate() -> None:
    assert (
        state.clamped_day(datetime(2024, 8, 31, 23, tzinfo=UTC), PERIOD).isoformat() == "2024-09-01"
    )
    assert state.clamped_day(datetime(2024, 10, 1, tzinfo=UTC), PERIOD).isoformat() == "2024-09-30"
    assert (
        state.clamped_day(datetime(2024, 9, 12, 5, tzinfo=UTC), PERIOD).isoformat() == "2024-09-12"
    )


_ = replace


def test_answers_validate_against_the_committed_http_schemas() -> None:
    import json as _json

    from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

    root = Path(__file__).resolve().parents[3] / "schemas" / "http"
    usage_schema = _json.loads((root / "usage-response.schema.json").read_text())
    view = View()
    view.feed(customer(), 0)
    for offset, envelope in enumerate(events(ScenarioConfig(customers=3, seed=4)), start=1):
        view.feed(envelope, offset)
    for customer_id in ("acme", "cust-000000", "cust-000001", "cust-000002"):
        body = view.answer(customer_id).model_dump(mode="json")
        Draft202012Validator(usage_schema).validate(body)
    problem = _json.loads((root / "problem.schema.json").read_text())
    Draft202012Validator(problem).validate(
        {"type": "about:blank", "title": "Bad period", "status": 400}
    )


def _egress(event_id: str, gb: str, day: int = 4) -> Envelope:
    data = UsageMetered(
        customer_id="acme",
        metric="egress_gb",
        event_time=datetime(2024, 9, day, 12, tzinfo=UTC),
        properties={"gb": gb, "region": "eu"},
    )
    return Envelope.wrap(data, id=event_id, source="t")


@pytest.mark.parametrize("written", ["day", "period", "ids", "customer", "none"])
def test_a_metered_record_handled_again_after_a_crash_counts_once(written: str) -> None:
    """The day's aggregates and the period are separate changelog records: a crash
    after either one reached the broker, then the redelivery, still counts once."""

    def run(crash: bool) -> Any:
        view = View()
        view.feed(customer(), 0)
        start = SubscriptionStarted(
            customer_id="acme",
            effective_at=datetime(2024, 9, 1, tzinfo=UTC),
            plan_code="growth",
            plan_version=1,
        )
        view.feed(Envelope.wrap(start, id="s1", source="t"), 1)
        view.feed(_egress("m1", "10"), 2)
        if crash:
            view.feed(_egress("m2", "30"), 3, write=written)
        view.feed(_egress("m2", "30"), 3)  # the redelivery, same partition and offset
        view.feed(_egress("m3", "5", day=5), 4)
        return view, view.answer("acme")

    _, clean = run(crash=False)
    view, crashed = run(crash=True)
    assert crashed.upcoming_invoice.exact_total == clean.upcoming_invoice.exact_total
    assert crashed.upcoming_invoice.subtotal == clean.upcoming_invoice.subtotal
    assert crashed.usage == clean.usage
    day = view.days["acme|2024-09|2024-09-04"]
    assert day["usage"]["egress_gb"]["events"] == 2 and day["last_offset"] == 3


def test_a_line_in_another_currency_than_the_customers_is_held_as_the_job_would() -> None:
    """The invoice job checks the pre-priced lines with ``price_invoice`` before rating
    (``streams.core.billing.rating.rate_period``): a line in another currency is refused and
    the invoice held; the preview says so instead of promising a subtotal."""
    view = View()
    view.feed(customer(currency="USD"), 0)
    view.feed(usage("u1", "2"), 1)
    assert view.answer("acme").upcoming_invoice.holds == ()
    view.feed(usage("u2", "3", currency="EUR"), 2)
    answer = view.answer("acme").upcoming_invoice
    assert "invoice_rules" in [h.code for h in answer.holds]
    assert answer.subtotal is None


def test_sums_are_plain_decimal_strings() -> None:
    assert state.add_decimal(None, Decimal("5.862E-7")) == "0.0000005862"


def test_apply_never_mutates_the_values_it_is_given() -> None:
    """The values passed in may be kept by the caller (a table's copy, a batch of
    records): a change must be a new value (the late part and the day's sums
    included), never an edit."""
    import copy

    view = View()
    view.feed(customer(), 0)
    view.feed(usage("u1", "2", day=3), 1)
    view.feed(usage("u2", "1", day=4), 2)
    view.feed(close(), 3)
    view.feed(usage("u3", "5", day=4), 4)  # late: the late part has lines now
    metered = Envelope.wrap(
        UsageMetered(
            customer_id="acme",
            metric=BOOK.metrics[0].code,
            event_time=datetime(2024, 9, 5, 10, tzinfo=UTC),
            properties={},
        ),
        id="m1",
        source="t",
    )
    before = copy.deepcopy((view.customers, view.periods, view.days, view.ids))
    for offset, envelope in enumerate([usage("u4", "7", day=4), metered], start=5):
        view.feed(envelope, offset, write="none")
    assert (view.customers, view.periods, view.days, view.ids) == before


def test_a_grouped_metric_counts_each_event_once() -> None:
    """egress_gb groups by region: two regions give two rows, each with its own quantity
    and the metric's events, and the period's metered events count each event once."""
    view = View()
    view.feed(customer(), 0)
    start = SubscriptionStarted(
        customer_id="acme",
        effective_at=datetime(2024, 9, 1, tzinfo=UTC),
        plan_code="growth",
        plan_version=1,
    )
    view.feed(Envelope.wrap(start, id="s1", source="t"), 1)
    for offset, (event_id, gb, region) in enumerate(
        [("m1", "10", "eu"), ("m2", "30", "eu"), ("m3", "5", "us")], start=2
    ):
        data = UsageMetered(
            customer_id="acme",
            metric="egress_gb",
            event_time=datetime(2024, 9, 4, 12, tzinfo=UTC),
            values={"gb": Decimal(gb)},
            properties={"region": region},
        )
        view.feed(Envelope.wrap(data, id=event_id, source="t"), offset)
    usage_to_date = view.answer("acme").usage
    rows = [(m.metric, m.group, m.quantity, m.events) for m in usage_to_date.metered]
    assert rows == [
        ("egress_gb", "eu", Decimal("40"), 3),
        ("egress_gb", "us", Decimal("5"), 3),
    ]
    assert usage_to_date.metered_events == 3
