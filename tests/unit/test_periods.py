"""Billing periods: UTC calendar months, ``YYYY-MM``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from streams.core.domain.errors import InvalidPeriod
from streams.core.domain.periods import BillingPeriod


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_month_edges() -> None:
    assert str(BillingPeriod.of(_at("2024-09-30T23:59:59.999Z"))) == "2024-09"
    assert str(BillingPeriod.of(_at("2024-10-01T00:00:00Z"))) == "2024-10"
    assert str(BillingPeriod.of(_at("2024-09-01T00:00:00Z"))) == "2024-09"


def test_other_offsets_are_converted_to_utc_first() -> None:
    # 2024-10-01 01:30 in UTC+02:00 is 2024-09-30 23:30 UTC.
    plus_two = timezone(timedelta(hours=2))
    assert str(BillingPeriod.of(datetime(2024, 10, 1, 1, 30, tzinfo=plus_two))) == "2024-09"
    minus_five = timezone(timedelta(hours=-5))
    assert str(BillingPeriod.of(datetime(2024, 9, 30, 20, 0, tzinfo=minus_five))) == "2024-10"


def test_naive_datetime_is_refused() -> None:
    with pytest.raises(InvalidPeriod):
        BillingPeriod.of(datetime(2024, 9, 30, 23, 59))


@pytest.mark.parametrize(
    "text", ["2024-13", "2024-00", "2024-9", "24-09", "2024/09", "", "2024-09-01", "abcd-ef"]
)
def test_parse_errors(text: str) -> None:
    with pytest.raises(InvalidPeriod):
        BillingPeriod.parse(text)


def test_parse_and_str_round_trip() -> None:
    period = BillingPeriod.parse("2024-09")
    assert period == BillingPeriod(2024, 9)
    assert str(period) == "2024-09"


def test_december_to_january() -> None:
    december = BillingPeriod.parse("2024-12")
    assert december.next() == BillingPeriod(2025, 1)
    assert december.start == datetime(2024, 12, 1, tzinfo=UTC)
    assert december.end == datetime(2025, 1, 1, tzinfo=UTC)
    assert december.contains(_at("2024-12-31T23:59:59.999999Z"))
    assert not december.contains(_at("2025-01-01T00:00:00Z"))


def test_start_is_inclusive_end_is_exclusive() -> None:
    september = BillingPeriod(2024, 9)
    assert september.contains(september.start)
    assert not september.contains(september.end)
    assert september.end == datetime(2024, 10, 1, tzinfo=UTC)


def test_periods_order_chronologically() -> None:
    assert BillingPeriod(2024, 12) < BillingPeriod(2025, 1) < BillingPeriod(2025, 2)


@pytest.mark.parametrize(("year", "month"), [(2024, 13), (2024, 0), (1969, 12)])
def test_invalid_construction(year: int, month: int) -> None:
    with pytest.raises(InvalidPeriod):
        BillingPeriod(year, month)
