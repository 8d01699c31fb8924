"""Segments of a billing period from subscription events (streams/core/domain/rating/segments.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime

import pytest

from streams.core.domain.events import (
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
)
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import Segment, segments_for
from streams.core.domain.rating.segments import uncovered_days

SEPT = BillingPeriod(2024, 9)  # 30 days


def at(day: int, hour: int = 0, minute: int = 0, *, month: int = 9, year: int = 2024) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def start(when: datetime, plan: str = "a", version: int = 1) -> SubscriptionStarted:
    return SubscriptionStarted(
        customer_id="c", plan_code=plan, plan_version=version, effective_at=when
    )


def change(when: datetime, plan: str, version: int = 1) -> SubscriptionChanged:
    return SubscriptionChanged(
        customer_id="c", plan_code=plan, plan_version=version, effective_at=when
    )


def end(when: datetime) -> SubscriptionEnded:
    return SubscriptionEnded(customer_id="c", effective_at=when)


def shape(
    period: BillingPeriod, events: Sequence[SubscriptionEvent]
) -> list[tuple[str, int, str, int]]:
    return [
        (s.plan_code, s.plan_version, s.describe(), s.day_count)
        for s in segments_for(period, events)
    ]


@pytest.mark.parametrize(
    ("period", "days"),
    [
        (BillingPeriod(2023, 2), 28),
        (BillingPeriod(2024, 2), 29),
        (BillingPeriod(2024, 9), 30),
        (BillingPeriod(2024, 10), 31),
    ],
)
def test_a_subscription_from_before_the_period_covers_every_day(
    period: BillingPeriod, days: int
) -> None:
    [segment] = segments_for(period, [start(at(15, month=6, year=2022))])
    assert segment.day_count == segment.days_in_period == days
    assert segment.full_period


def test_no_subscription_no_segment() -> None:
    assert segments_for(SEPT, []) == ()
    assert segments_for(SEPT, [start(at(1, month=10))]) == ()  # starts after the period
    assert segments_for(SEPT, [start(at(1, month=7)), end(at(31, 12, month=8))]) == ()


def test_a_start_mid_period_counts_its_own_day() -> None:
    assert shape(SEPT, [start(at(10, 23, 59))]) == [("a", 1, "2024-09-10..2024-09-30", 21)]


def test_a_start_on_the_last_day_is_one_day() -> None:
    assert shape(SEPT, [start(at(30, 18))]) == [("a", 1, "2024-09-30", 1)]
    assert shape(BillingPeriod(2024, 2), [start(at(29, 23, 59, month=2))]) == [
        ("a", 1, "2024-02-29", 1)
    ]


def test_the_day_of_a_change_belongs_to_the_new_version() -> None:
    """Lago's upgrade example: a change on the 15th bills 14 days of the old plan."""
    events: list[SubscriptionEvent] = [start(at(1, month=1)), change(at(15, 10, month=1), "b")]
    assert shape(BillingPeriod(2024, 1), events) == [
        ("a", 1, "2024-01-01..2024-01-14", 14),
        ("b", 1, "2024-01-15..2024-01-31", 17),
    ]


def test_a_version_change_is_a_new_segment() -> None:
    events: list[SubscriptionEvent] = [start(at(1, month=8)), change(at(20), "a", 2)]
    assert shape(SEPT, events) == [
        ("a", 1, "2024-09-01..2024-09-19", 19),
        ("a", 2, "2024-09-20..2024-09-30", 11),
    ]


def test_an_end_bills_its_day_unless_it_falls_at_midnight() -> None:
    assert shape(SEPT, [start(at(1, month=8)), end(at(12, 13))]) == [
        ("a", 1, "2024-09-01..2024-09-12", 12)
    ]
    assert shape(SEPT, [start(at(1, month=8)), end(at(13))]) == [
        ("a", 1, "2024-09-01..2024-09-12", 12)
    ]


def test_a_change_back_and_forth_gives_one_segment_per_version() -> None:
    events: list[SubscriptionEvent] = [start(at(1)), change(at(10), "b"), change(at(20, 8), "a")]
    segments = segments_for(SEPT, events)
    assert shape(SEPT, events) == [
        ("a", 1, "2024-09-01..2024-09-09, 2024-09-20..2024-09-30", 20),
        ("b", 1, "2024-09-10..2024-09-19", 10),
    ]
    assert segments[0].ranges == (
        (date(2024, 9, 1), date(2024, 9, 9)),
        (date(2024, 9, 20), date(2024, 9, 30)),
    )


def test_several_changes_in_one_day_the_last_in_effect_wins() -> None:
    events: list[SubscriptionEvent] = [
        start(at(1)),
        change(at(10, 9), "b"),
        change(at(10, 17), "c"),
    ]
    assert shape(SEPT, events) == [
        ("a", 1, "2024-09-01..2024-09-09", 9),
        ("c", 1, "2024-09-10..2024-09-30", 21),
    ]
    # Started and ended on one day: that day is billed.
    assert shape(SEPT, [start(at(5, 9)), end(at(5, 11))]) == [("a", 1, "2024-09-05", 1)]
    # Ended in the evening of a day that had a change: the new version's day.
    assert shape(SEPT, [start(at(1)), change(at(5, 9), "b"), end(at(5, 20))]) == [
        ("a", 1, "2024-09-01..2024-09-04", 4),
        ("b", 1, "2024-09-05", 1),
    ]


def test_a_version_in_effect_for_no_time_gets_no_day() -> None:
    """Two events at one instant: the later in partition order wins."""
    same = at(10, 12)
    assert shape(SEPT, [start(at(1)), change(same, "b"), change(same, "c")]) == [
        ("a", 1, "2024-09-01..2024-09-09", 9),
        ("c", 1, "2024-09-10..2024-09-30", 21),
    ]
    assert shape(SEPT, [start(at(1)), change(same, "b"), end(same)]) == [
        ("a", 1, "2024-09-01..2024-09-10", 10),
    ]


def test_events_are_ordered_by_effective_time_not_arrival() -> None:
    """A backdated change that arrives after a later one still takes effect at its time."""
    arrived: list[SubscriptionEvent] = [
        start(at(1, month=8)),
        change(at(20), "c"),
        change(at(10), "b"),
    ]
    assert shape(SEPT, arrived) == [
        ("a", 1, "2024-09-01..2024-09-09", 9),
        ("b", 1, "2024-09-10..2024-09-19", 10),
        ("c", 1, "2024-09-20..2024-09-30", 11),
    ]


def test_start_while_subscribed_is_a_change_and_change_while_not_is_a_start() -> None:
    assert shape(SEPT, [start(at(1)), start(at(16), "b")]) == [
        ("a", 1, "2024-09-01..2024-09-15", 15),
        ("b", 1, "2024-09-16..2024-09-30", 15),
    ]
    assert shape(SEPT, [change(at(16), "b")]) == [("b", 1, "2024-09-16..2024-09-30", 15)]


def test_resubscribing_after_an_end_leaves_a_gap() -> None:
    events: list[SubscriptionEvent] = [start(at(1)), end(at(10)), start(at(20))]
    [segment] = segments_for(SEPT, events)
    assert segment.describe() == "2024-09-01..2024-09-09, 2024-09-20..2024-09-30"
    assert uncovered_days(SEPT, [segment]) == [date(2024, 9, d) for d in range(10, 20)]


def test_a_segment_is_a_value() -> None:
    segment = Segment("a", 1, (date(2024, 9, 1),), 30)
    assert segment == Segment("a", 1, (date(2024, 9, 1),), 30)
    assert segment.describe() == "2024-09-01"
