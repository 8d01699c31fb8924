"""The replay's rebuild of a period from re-read records: the worker's dedup rules (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from streams.apps.replay.rebuild import Coordinates, PeriodRebuild, fast_usage_line, usage_line
from streams.core.domain.codec import encode
from streams.core.domain.errors import InvalidPeriod
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    UsageRecorded,
)
from streams.core.domain.fastcodec import FastUsage, decode_usage, usage_data
from tests.unit.test_fastcodec import usage_records

TOPIC = "t.billing.account-events.v1"
WHEN = datetime(2024, 9, 3, tzinfo=UTC)


def usage(event_id: str, amount: str, *, customer: str = "c1", period: str = "2024-09") -> Envelope:
    data = UsageRecorded(
        customer_id=customer,
        billing_period=period,
        amount=Decimal(amount),
        currency="USD",
        event_time=WHEN,
        region_id="us-east-1",
    )
    return Envelope.wrap(data, id=event_id, source="/tests", time=WHEN)


def customer(name: str, *, customer_id: str = "c1") -> Envelope:
    data = CustomerUpserted(customer_id=customer_id, name=name, email="a@b.c", currency="USD")
    return Envelope.wrap(data, id=f"cu-{name}", source="/tests", time=WHEN)


def closed(period: str = "2024-09", customer_id: str = "c1") -> Envelope:
    data = BillingPeriodClosed(customer_id=customer_id, billing_period=period, closed_at=WHEN)
    return Envelope.wrap(data, id=f"close-{customer_id}-{period}", source="/tests", time=WHEN)


def at(offset: int, partition: int = 0) -> Coordinates:
    return Coordinates(TOPIC, partition, offset)


def test_distinct_usage_of_the_period_sorted_with_coordinates() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add(usage("e2", "2.5"), at(7))
    rb.add(usage("e1", "1.25"), at(3))
    rb.add(usage("other", "9", period="2024-08"), at(4))
    lines = rb.usage_by_customer()
    assert list(lines) == ["c1"]
    assert [(x.event_id, x.amount, x.source_offset) for x in lines["c1"]] == [
        ("e1", Decimal("1.25"), 3),
        ("e2", Decimal("2.5"), 7),
    ]
    assert lines["c1"][0].source_topic == TOPIC
    assert rb.usage_events == 2 and rb.records == 3


def test_same_id_same_payload_is_a_duplicate_not_a_conflict() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add(usage("e1", "1.00"), at(1))
    rb.add(usage("e1", "1.00"), at(9))
    assert rb.duplicates == 1 and rb.conflicts == []
    assert [x.source_offset for x in rb.usage_by_customer()["c1"]] == [1]


def test_same_id_other_payload_first_wins_and_is_reported() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add(usage("e1", "1.00"), at(1))
    rb.add(usage("e1", "5.00"), at(9))
    [conflict] = rb.conflicts
    assert (conflict.kept.offset, conflict.dropped.offset) == (1, 9)
    assert conflict.kept_sha256 != conflict.dropped_sha256
    assert [x.amount for x in rb.usage_by_customer()["c1"]] == [Decimal("1.00")]


def test_first_wins_by_coordinates_whatever_the_consumption_order() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add(usage("e1", "5.00"), at(2, partition=4))
    rb.add(usage("e1", "1.00"), at(8, partition=1))  # lower partition: first
    [conflict] = rb.conflicts
    assert conflict.kept == at(8, partition=1)
    assert [x.amount for x in rb.usage_by_customer()["c1"]] == [Decimal("1.00")]


def test_dedup_spans_periods_like_the_usage_lines_table() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add(usage("e1", "3", period="2024-08"), at(1))
    rb.add(usage("e1", "3", period="2024-09"), at(2))  # same id, other payload, our period
    assert rb.usage_by_customer() == {}
    [conflict] = rb.conflicts
    assert conflict.billing_period == "2024-09"


def test_latest_customer_and_the_period_close_markers() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add(customer("new"), at(5))
    rb.add(customer("old"), at(2))
    rb.add(closed("2024-08"), at(6))
    assert rb.closed_at("c1") is None
    rb.add(closed("2024-09"), at(11))
    rb.add(closed("2024-09"), at(10))
    found = rb.customer("c1")
    assert found is not None and found.name == "new"
    assert rb.closed_at("c1") == at(10)
    assert rb.closed_customers == frozenset({"c1"})


def test_invalid_records_are_counted_with_their_key() -> None:
    rb = PeriodRebuild("2024-09")
    rb.add_invalid(at(1), b"c9", "value is not JSON")
    rb.add_invalid(at(2), b"\xff", "bad key")
    assert [(r.customer_id, r.reason) for r in rb.invalid] == [
        ("c9", "value is not JSON"),
        (None, "bad key"),
    ]
    assert rb.records == 2


def test_invalid_period_is_refused() -> None:
    with pytest.raises(InvalidPeriod):
        PeriodRebuild("2024-13")


def _fast(envelope: Envelope, value: bytes | None = None) -> tuple[FastUsage, bytes]:
    record = encode(envelope)
    raw = record.value if value is None else value
    fast = decode_usage(record.key, raw, record.headers)
    assert fast is not None
    return fast, raw


def test_records_read_by_the_fast_decoder_rebuild_the_same_period() -> None:
    by_model, by_fast = PeriodRebuild("2024-09"), PeriodRebuild("2024-09")
    records = [
        (usage("e1", "1.25"), at(3)),
        (usage("e2", "2.50"), at(4)),
        (usage("other", "9", period="2024-08"), at(5)),
        (usage("e1", "1.25"), at(6)),  # a duplicate
        (usage("e2", "2.6"), at(7)),  # a conflict
    ]
    for envelope, where in records:
        by_model.add(envelope, where)
        by_fast.add_fast_usage(*_fast(envelope), where)
    assert by_fast.usage_by_customer() == by_model.usage_by_customer()
    assert by_fast.conflicts == by_model.conflicts
    assert (by_fast.duplicates, by_fast.usage_events) == (by_model.duplicates, 2)


def test_other_bytes_of_the_same_fact_are_a_duplicate_not_a_conflict() -> None:
    rb = PeriodRebuild("2024-09")
    first = usage("e1", "1.5")
    fast, raw = _fast(first)
    rb.add_fast_usage(fast, raw, at(1))
    written_again = raw.replace(b'"1.5"', b'"1.50"')
    rb.add_fast_usage(*_fast(usage("e1", "1.50"), written_again), at(2))
    assert rb.conflicts == [] and rb.duplicates == 1
    assert [line.amount for line in rb.usage_by_customer()["c1"]] == [Decimal("1.5")]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(usage_records())
def test_a_fast_records_line_equals_the_line_of_its_model(
    drawn: tuple[bytes | None, bytes | None, list[Any], bool],
) -> None:
    """The rebuild builds the usage line of a fast-decoded record straight from its values;
    it is the line built from the model the reference gives for the same values."""
    key, value, headers, _ = drawn
    fast = decode_usage(key, value, headers)
    if fast is None:
        return
    at = Coordinates("t", 3, 17)
    assert fast_usage_line(fast, at) == usage_line(fast.event_id, usage_data(fast), at)


def test_usage_by_customer_is_the_same_through_the_fast_path() -> None:
    """The same records taken fast and taken as models give the same lines per customer."""
    fast_rebuild, model_rebuild = PeriodRebuild("2024-09"), PeriodRebuild("2024-09")
    for i in range(6):
        enc = encode(usage(f"u{i}", f"{i}.25", customer=f"c{i % 2}"))
        at = Coordinates("t", i % 2, i)
        found = decode_usage(enc.key, enc.value, list(enc.headers))
        assert found is not None
        fast_rebuild.add_fast_usage(found, enc.value, at)
        model_rebuild.add(usage(f"u{i}", f"{i}.25", customer=f"c{i % 2}"), at)
    assert fast_rebuild.usage_by_customer() == model_rebuild.usage_by_customer()
    assert sum(len(v) for v in fast_rebuild.usage_by_customer().values()) == 6
