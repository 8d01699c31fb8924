"""Aggregation of metered events: each aggregation, filters, group-by, order
independence, merging, and the JSON form a faust table stores."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from streams.core.domain.events import UsageMetered
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import (
    AggregateState,
    Aggregation,
    BillableMetric,
    MeteredEvent,
    MetricUsage,
    PriceBook,
    RatingError,
    Usage,
    new_state,
)

D = Decimal
SEPT = BillingPeriod(2024, 9)
T0 = datetime(2024, 9, 10, 12, 0, tzinfo=UTC)


def metric(aggregation: str, **fields: object) -> BillableMetric:
    return BillableMetric.model_validate({"code": "m", "aggregation": aggregation, **fields})


def event(
    event_id: str,
    *,
    at: datetime = T0,
    values: dict[str, str] | None = None,
    code: str = "m",
    **properties: str,
) -> MeteredEvent:
    return MeteredEvent(
        event_id, code, at, properties, {k: D(v) for k, v in (values or {}).items()}
    )


def usage_of(definition: BillableMetric, events: list[MeteredEvent]) -> MetricUsage:
    usage = MetricUsage(definition)
    for item in events:
        usage.add(item)
    return usage


# --------------------------------------------------------------------------- each aggregation


def test_count_counts_events() -> None:
    usage = usage_of(metric("count"), [event("a"), event("b"), event("c")])
    assert usage.quantities() == [(None, D(3))]


def test_sum_is_exact() -> None:
    values = ["0.1", "0.2", "0.000000000000000000000000000001", "1000000000000000000000"]
    usage = usage_of(metric("sum", property="gb"), [event(v, values={"gb": v}) for v in values])
    assert usage.quantities() == [
        (None, D("1000000000000000000000.300000000000000000000000000001"))
    ]


def test_max_takes_the_largest_value() -> None:
    usage = usage_of(
        metric("max", property="gb"),
        [
            event("a", values={"gb": "3"}),
            event("b", values={"gb": "12.5"}),
            event("c", values={"gb": "-1"}),
        ],
    )
    assert usage.quantities() == [(None, D("12.5"))]


def test_unique_count_counts_distinct_values_once() -> None:
    """Duplicate events and repeated values count once; text is compared exactly."""
    seats = [event(f"e{i}", user="u1") for i in range(5)]
    seats += [
        event("x", user="u2"),
        event("x", user="u2"),
        event("y", user="007"),
        event("z", user="7"),
    ]
    usage = usage_of(metric("unique_count", property="user"), seats)
    assert usage.quantities() == [(None, D(4))]


def test_latest_takes_the_latest_event_time() -> None:
    usage = usage_of(
        metric("latest", property="gb"),
        [
            event("late", at=T0 + timedelta(hours=2), values={"gb": "5"}),
            event("early", at=T0, values={"gb": "50"}),
            event("middle", at=T0 + timedelta(hours=1), values={"gb": "500"}),
        ],
    )
    assert usage.quantities() == [(None, D(5))]


def test_latest_breaks_a_time_tie_by_the_greater_event_id_in_any_order() -> None:
    definition = metric("latest", property="gb")
    tied = [
        event("b", values={"gb": "2"}),
        event("a", values={"gb": "1"}),
        event("c", values={"gb": "3"}),
    ]
    assert usage_of(definition, tied).quantities() == [(None, D(3))]
    assert usage_of(definition, tied[::-1]).quantities() == [(None, D(3))]
    same_id = [event("a", values={"gb": "1"}), event("a", values={"gb": "9"})]
    assert (
        usage_of(definition, same_id).quantities()
        == usage_of(definition, same_id[::-1]).quantities()
    )


def test_latest_compares_instants_not_offsets() -> None:
    paris = datetime(2024, 9, 10, 14, 30, tzinfo=timezone(timedelta(hours=2)))  # 12:30 UTC
    usage = usage_of(
        metric("latest", property="gb"),
        [
            event("utc", at=T0 + timedelta(hours=1), values={"gb": "1"}),  # 13:00 UTC
            event("paris", at=paris, values={"gb": "2"}),
        ],
    )
    assert usage.quantities() == [(None, D(1))]


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_no_events_is_a_zero_quantity(aggregation: Aggregation) -> None:
    assert new_state(aggregation).quantity == D(0)


@pytest.mark.parametrize(
    ("aggregation", "value"), [("max", "7"), ("unique_count", None), ("latest", "7")]
)
def test_a_repeated_event_id_is_a_no_op_where_it_is_cheap(
    aggregation: str, value: str | None
) -> None:
    prop = "user" if aggregation == "unique_count" else "gb"
    definition = metric(aggregation, property=prop)
    first = event("e", values={"gb": value} if value else None, user="u1")
    once = usage_of(definition, [first])
    twice = usage_of(definition, [first, first])
    assert once.quantities() == twice.quantities()


# --------------------------------------------------------------------------- filter, group-by, invalid


def test_group_by_gives_one_quantity_per_value_and_none_for_events_without_it() -> None:
    definition = metric("sum", property="gb", group_by="region")
    usage = usage_of(
        definition,
        [
            event("a", values={"gb": "1"}, region="us"),
            event("b", values={"gb": "2"}, region="eu"),
            event("c", values={"gb": "4"}, region="eu"),
            event("d", values={"gb": "8"}),
        ],
    )
    assert usage.quantities() == [(None, D(8)), ("eu", D(6)), ("us", D(1))]


def test_filter_keeps_listed_values_of_every_listed_property() -> None:
    definition = metric("count", filter={"region": ["eu", "us"], "billable": ["true"]})
    usage = usage_of(
        definition,
        [
            event("kept1", region="eu", billable="true"),
            event("kept2", region="us", billable="true"),
            event("other-region", region="ap", billable="true"),
            event("not-billable", region="eu", billable="false"),
            event("no-properties"),
        ],
    )
    assert usage.quantities() == [(None, D(2))]
    assert (usage.events, usage.excluded, usage.invalid) == (5, 3, 0)


def test_events_without_the_aggregated_value_are_counted_invalid_not_dropped() -> None:
    definition = metric("sum", property="gb")
    usage = usage_of(
        definition,
        [
            event("ok", values={"gb": "1"}),
            event("z-missing"),
            event("a-as-text", gb="12"),
            *[event(f"m{i}") for i in range(6)],
        ],
    )
    assert usage.quantities() == [(None, D(1))]
    assert usage.invalid == 8
    assert usage.invalid_samples == ["a-as-text", "m0", "m1", "m2", "m3"]
    assert usage.invalid_reason == "'gb' must be a decimal in values, found text in properties"
    seats = usage_of(metric("unique_count", property="user"), [event("v", values={"user": "1"})])
    assert seats.invalid_reason == "'user' must be a text in properties, found a decimal in values"


def test_an_event_of_another_metric_is_refused() -> None:
    with pytest.raises(RatingError):
        MetricUsage(metric("count")).add(event("e", code="other"))


# --------------------------------------------------------------------------- merge and JSON


def _events() -> list[MeteredEvent]:
    return [
        event(
            f"e{i}",
            at=T0 + timedelta(hours=i),
            values={"gb": str(i % 7)},
            region=["eu", "us"][i % 2],
            user=f"u{i % 5}",
        )
        for i in range(40)
    ] + [event("bad")]


@pytest.mark.parametrize(
    "definition",
    [
        metric("count", group_by="region"),
        metric("sum", property="gb", group_by="region"),
        metric("max", property="gb"),
        metric("unique_count", property="user", group_by="region"),
        metric("latest", property="gb", group_by="region"),
    ],
    ids=lambda m: m.aggregation.value,
)
def test_merging_parts_equals_adding_everything_and_json_round_trips(
    definition: BillableMetric,
) -> None:
    events = _events()
    whole = usage_of(definition, events)
    left, right = (
        usage_of(definition, events[::3]),
        usage_of(definition, [e for i, e in enumerate(events) if i % 3]),
    )
    left.merge(right)
    assert left == whole
    assert left.quantities() == whole.quantities()
    stored = json.loads(json.dumps(whole.to_json()))
    assert MetricUsage.from_json(definition, stored) == whole
    for _, state_json in stored["groups"]:
        assert AggregateState.from_json(state_json).to_json() == state_json


def test_states_of_different_aggregations_do_not_merge() -> None:
    with pytest.raises(RatingError):
        new_state(Aggregation.SUM).merge(new_state(Aggregation.MAX))
    with pytest.raises(RatingError):
        AggregateState.from_json({"aggregation": "median"})


BOOK = PriceBook.model_validate(
    {
        "metrics": [
            {"code": "api_calls", "aggregation": "count"},
            {"code": "seats", "aggregation": "unique_count", "property": "user"},
        ]
    }
)


def test_usage_buckets_by_utc_day_and_counts_unknown_metrics() -> None:
    events = [
        event("a", code="api_calls", at=datetime(2024, 9, 1, 0, 0, tzinfo=UTC)),
        event("b", code="api_calls", at=datetime(2024, 9, 30, 23, 59, 59, tzinfo=UTC)),
        event("c", code="seats", at=datetime(2024, 9, 30, 12, tzinfo=UTC), user="u1"),
        event("d", code="seats", at=datetime(2024, 9, 1, 12, tzinfo=UTC), user="u1"),
        event("e", code="mystery", at=datetime(2024, 9, 2, tzinfo=UTC)),
    ]
    usage = Usage.of(SEPT, BOOK, events)
    assert usage.event_days() == [date(2024, 9, 1), date(2024, 9, 2), date(2024, 9, 30)]
    merged = usage.collect([date(2024, 9, 1), date(2024, 9, 30)])
    assert merged["api_calls"].quantities() == [(None, D(2))]
    assert merged["seats"].quantities() == [(None, D(1))]  # one seat on both days
    assert usage.unknown_on(usage.event_days()) == {"mystery": 1}
    assert usage.collect([date(2024, 9, 15)]) == {}


def test_usage_refuses_events_outside_its_period() -> None:
    usage = Usage.for_book(SEPT, BOOK)
    with pytest.raises(RatingError):
        usage.add(event("oct", code="api_calls", at=datetime(2024, 10, 1, tzinfo=UTC)))
    with pytest.raises(RatingError):
        MeteredEvent("naive", "api_calls", datetime(2024, 9, 1))


def test_usage_merges_and_round_trips_through_json() -> None:
    events = [
        event(
            f"e{i}",
            code=["api_calls", "seats", "mystery"][i % 3],
            at=T0 + timedelta(hours=7 * i),
            user=f"u{i % 4}",
        )
        for i in range(60)
    ]
    whole = Usage.of(SEPT, BOOK, events)
    left, right = Usage.of(SEPT, BOOK, events[:25]), Usage.of(SEPT, BOOK, events[25:])
    left.merge(right)
    assert left == whole
    text = json.dumps(whole.to_json())
    assert Usage.from_json(json.loads(text)) == whole
    with pytest.raises(RatingError):
        Usage.from_json({"period": "2024-09"})
    with pytest.raises(RatingError):
        left.merge(Usage.for_book(BillingPeriod(2024, 10), BOOK))


def test_metered_event_from_a_decoded_event() -> None:
    data = UsageMetered(
        customer_id="c",
        metric="seats",
        event_time=T0,
        properties={"user": "u1"},
        values={"n": "1.0"},
    )
    item = MeteredEvent.of("id-1", data)
    assert (item.event_id, item.metric, item.properties, item.values) == (
        "id-1",
        "seats",
        {"user": "u1"},
        {"n": D(1)},
    )
    assert item.day == date(2024, 9, 10)
