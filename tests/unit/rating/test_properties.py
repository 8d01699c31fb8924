"""Property tests of rating (Hypothesis; profile in tests/unit/rating/conftest.py)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.domain.events import SubscriptionChanged, SubscriptionStarted
from streams.core.domain.money import round_money
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import (
    MeteredEvent,
    Tier,
    Usage,
    load_price_book,
    rate,
    rate_events,
    segments_for,
)
from streams.core.domain.rating.pricing import graduated, volume

D = Decimal
SEPT = BillingPeriod(2024, 9)

prices = st.decimals(min_value=0, max_value=100, places=4, allow_nan=False, allow_infinity=False)
quantities = st.decimals(
    min_value=0, max_value=10**7, places=3, allow_nan=False, allow_infinity=False
)


@st.composite
def tier_tables(draw: st.DrawFn) -> list[Tier]:
    steps = draw(
        st.lists(st.decimals(min_value="0.5", max_value=10**5, places=1), min_size=0, max_size=4)
    )
    bounds: list[Decimal | None] = []
    total = D(0)
    for step in steps:
        total += step
        bounds.append(total)
    bounds.append(None)
    return [
        Tier(up_to=bound, unit_price=draw(prices), flat_amount=draw(prices)) for bound in bounds
    ]


@given(tier_tables(), quantities, quantities)
def test_a_graduated_total_never_decreases_as_quantity_grows(
    table: list[Tier], first: Decimal, second: Decimal
) -> None:
    low, high = sorted((first, second))
    assert graduated(low, table).amount <= graduated(high, table).amount


@given(tier_tables(), quantities)
def test_a_graduated_breakdown_splits_the_quantity_exactly(
    table: list[Tier], quantity: Decimal
) -> None:
    priced = graduated(quantity, table)
    assert sum((part.units for part in priced.tiers), D(0)) == quantity
    assert sum((part.amount for part in priced.tiers), D(0)) == priced.amount
    assert all(part.units > 0 for part in priced.tiers)


@given(tier_tables(), st.decimals(min_value="0.001", max_value=1, places=3))
def test_volume_totals_at_every_bound(table: list[Tier], epsilon: Decimal) -> None:
    """At a bound: every unit at that tier's price; just above: at the next one's."""
    for index, tier in enumerate(table[:-1]):
        bound = tier.up_to
        assert bound is not None
        assert volume(bound, table).amount == bound * tier.unit_price + tier.flat_amount
        following = table[index + 1]
        above = bound + epsilon
        if following.up_to is None or above <= following.up_to:
            assert (
                volume(above, table).amount == above * following.unit_price + following.flat_amount
            )


BOOK = load_price_book(
    """\
metrics:
  - {code: calls, aggregation: count, filter: {ok: ["1"]}}
  - {code: gb, aggregation: sum, property: gb, group_by: region}
  - {code: peak, aggregation: max, property: gb}
  - {code: seats, aggregation: unique_count, property: user}
  - {code: last, aggregation: latest, property: gb}
plans:
  - code: p
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: fee, model: fixed, amount: 19.99}
          - code: calls
            model: graduated
            metric: calls
            tiers: [{up_to: 5, unit_price: 0.3333, flat_amount: 1}, {up_to: null, unit_price: 0.0101}]
          - {code: gb, model: per_unit, metric: gb, unit_price: 0.017}
          - code: peak
            model: volume
            metric: peak
            tiers: [{up_to: 10, unit_price: 0.25}, {up_to: null, unit_price: 0.125, flat_amount: 3}]
          - {code: seats, model: package, metric: seats, package_size: 3, price: 7.77, free_units: 1}
          - {code: last, model: per_unit, metric: last, unit_price: 1.005}
          - {code: min, model: minimum, amount: 75}
      - version: 2
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: fee, model: fixed, amount: 29.01}
          - {code: calls, model: per_unit, metric: calls, unit_price: 0.0071}
          - {code: gb, model: per_unit, metric: gb, unit_price: 0.019}
          - {code: peak, model: per_unit, metric: peak, unit_price: 0.5}
          - {code: seats, model: per_unit, metric: seats, unit_price: 3}
          - {code: last, model: per_unit, metric: last, unit_price: 0.5}
"""
)


@st.composite
def metered_events(draw: st.DrawFn) -> list[MeteredEvent]:
    count = draw(st.integers(min_value=0, max_value=40))
    events = []
    for index in range(count):
        metric = draw(st.sampled_from(["calls", "gb", "peak", "seats", "last"]))
        minute = draw(st.integers(min_value=0, max_value=30 * 24 * 60 - 1))
        when = SEPT.start + timedelta(minutes=minute)
        value = draw(st.decimals(min_value=0, max_value=1000, places=2))
        events.append(
            MeteredEvent(
                f"e{index:03d}",
                metric,
                when,
                {
                    "ok": draw(st.sampled_from(["1", "0"])),
                    "region": draw(st.sampled_from(["eu", "us"])),
                    "user": draw(st.sampled_from(["a", "b", "c", "d", "e"])),
                },
                {"gb": value},
            )
        )
    return events


subscriptions = st.builds(
    lambda day: [
        SubscriptionStarted(
            customer_id="c",
            plan_code="p",
            plan_version=1,
            effective_at=datetime(2024, 8, 1, tzinfo=UTC),
        ),
        *(
            []
            if day is None
            else [
                SubscriptionChanged(
                    customer_id="c",
                    plan_code="p",
                    plan_version=2,
                    effective_at=datetime(2024, 9, day, 8, tzinfo=UTC),
                )
            ]
        ),
    ],
    st.one_of(st.none(), st.integers(min_value=2, max_value=30)),
)


@settings(max_examples=30)  # three ratings of up to 40 events per example
@given(subscriptions, metered_events(), st.randoms(use_true_random=False))
def test_rating_is_deterministic_and_independent_of_event_order(
    subs: list[SubscriptionStarted | SubscriptionChanged],
    events: list[MeteredEvent],
    rnd: random.Random,
) -> None:
    shuffled = list(events)
    rnd.shuffle(shuffled)
    first = rate_events(SEPT, currency="USD", book=BOOK, subscriptions=subs, metered=events)
    again = rate_events(SEPT, currency="USD", book=BOOK, subscriptions=subs, metered=shuffled)
    assert first == again
    assert first.holds == ()
    # Aggregated in two parts and merged (as a partitioned view would): the same.
    half = len(shuffled) // 2
    merged = Usage.of(SEPT, BOOK, shuffled[:half])
    merged.merge(Usage.of(SEPT, BOOK, shuffled[half:]))
    from_parts = rate(
        SEPT, currency="USD", book=BOOK, segments=segments_for(SEPT, subs), usage=merged
    )
    assert from_parts == first


@settings(max_examples=30)
@given(subscriptions, metered_events())
def test_the_subtotal_is_the_exact_sum_of_the_lines_rounded_once(
    subs: list[SubscriptionStarted | SubscriptionChanged], events: list[MeteredEvent]
) -> None:
    invoice = rate_events(SEPT, currency="USD", book=BOOK, subscriptions=subs, metered=events)
    exact = sum((line.amount for line in invoice.lines), D(0)) + sum(
        (line.amount for line in invoice.pass_through), D(0)
    )
    assert invoice.exact_total == exact
    assert invoice.subtotal == round_money(exact, "USD")
    days = sum(segment.day_count for segment in invoice.segments)
    assert days == 30
    assert all(line.amount > 0 for line in invoice.lines if line.charge_model == "minimum")
