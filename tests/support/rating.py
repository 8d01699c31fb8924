"""A small price book and metered scenario for the rating tests (figures worked by hand).

Plan ``pro`` version 1 (USD): a platform fee of 30.00, API calls graduated (the
first 100 free, up to 1,000 at 0.05, above at 0.01), storage at 0.25 per GB
(the period's ``max``). Version 2 (effective 2024-09-01): platform fee 45.00,
the rest the same.

The scenario of September 2024 (30 days): 200 API calls on 09-05 and 150 on
09-20 (350), storage 12.5 GB on 09-03 and 8 GB on 09-25.

* Under v1 all month: 30 + (100 x 0 + 250 x 0.05 = 12.50) + 12.5 x 0.25 =
  **45.625** exact → subtotal **45.62** (rounded once, half-even).
* Shadow re-rating with tier 2 at 0.06: + 250 x 0.01 = **+2.50** → 48.125 → 48.12.
* A change to v2 from 09-16 (days 1-15 v1, 16-30 v2): v1 15 + 5.00 + 3.125,
  v2 22.50 + 2.50 + 2.00 → **50.125** → 50.12.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from confluent_kafka import Producer

from streams.core.domain.codec import encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    EventData,
    SubscriptionChanged,
    SubscriptionStarted,
    UsageMetered,
    deterministic_id,
)
from streams.settings import Settings

PERIOD = "2024-09"

BOOK_V1 = """\
schema_version: 1
metrics:
  - {code: api_calls, name: API calls, unit: calls, aggregation: count}
  - {code: storage_gb, name: Storage, unit: GB, aggregation: max, property: gb}
plans:
  - code: pro
    name: Pro
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
              - {up_to: 100, unit_price: 0}
              - {up_to: 1000, unit_price: TIER2}
              - {up_to: null, unit_price: 0.01}
          - {code: storage, model: per_unit, metric: storage_gb, unit_price: 0.25}
"""

VERSION_2 = """\
      - version: 2
        effective_from: 2024-09-01
        currency: USD
        charges:
          - {code: platform, name: Platform fee, model: fixed, amount: 45}
          - code: api
            model: graduated
            metric: api_calls
            tiers:
              - {up_to: 100, unit_price: 0}
              - {up_to: 1000, unit_price: 0.05}
              - {up_to: null, unit_price: 0.01}
          - {code: storage, model: per_unit, metric: storage_gb, unit_price: 0.25}
"""

#: Under v1 all month, and its subtotal (rounded once, half-even).
EXACT_V1 = Decimal("45.625")
SUBTOTAL_V1 = Decimal("45.62")
#: Tier 2 at 0.06 instead of 0.05 (a candidate book): 250 calls in tier 2.
EXACT_TIER2_006 = Decimal("48.125")
SUBTOTAL_TIER2_006 = Decimal("48.12")
#: v1 for 09-01..09-15, v2 for 09-16..09-30.
EXACT_CHANGED = Decimal("50.125")
SUBTOTAL_CHANGED = Decimal("50.12")


def book_text(*, tier2: str = "0.05", with_v2: bool = False) -> str:
    """The test price book (tier 2's unit price as given; with version 2 or not)."""
    text = BOOK_V1.replace("TIER2", tier2)
    return text + VERSION_2 if with_v2 else text


def write_book(path: Path, **kwargs: object) -> Path:
    path.write_text(book_text(**kwargs), encoding="utf-8")  # type: ignore[arg-type]
    return path


def utc(day: int, hour: int = 12) -> datetime:
    return datetime(2024, 9, day, hour, tzinfo=UTC)


def customer(customer_id: str) -> CustomerUpserted:
    return CustomerUpserted(
        customer_id=customer_id,
        name=f"Customer {customer_id}",
        email=f"{customer_id}@customers.invalid",
        currency="USD",
    )


def started(customer_id: str, version: int = 1) -> SubscriptionStarted:
    return SubscriptionStarted(
        customer_id=customer_id,
        effective_at=datetime(2024, 8, 15, tzinfo=UTC),
        plan_code="pro",
        plan_version=version,
    )


def changed_to_v2(customer_id: str) -> SubscriptionChanged:
    return SubscriptionChanged(
        customer_id=customer_id,
        effective_at=datetime(2024, 9, 16, tzinfo=UTC),
        plan_code="pro",
        plan_version=2,
    )


def metered(customer_id: str) -> Iterator[tuple[str, UsageMetered]]:
    """The scenario's metered events: (event id, data)."""
    for i in range(350):
        day = 5 if i < 200 else 20
        yield (
            f"{customer_id}-call-{i}",
            UsageMetered(customer_id=customer_id, metric="api_calls", event_time=utc(day)),
        )
    for event_id, day, gb in (("gb-1", 3, "12.5"), ("gb-2", 25, "8")):
        yield (
            f"{customer_id}-{event_id}",
            UsageMetered(
                customer_id=customer_id,
                metric="storage_gb",
                event_time=utc(day),
                values={"gb": Decimal(gb)},
            ),
        )


def produce(settings: Settings, topic: str, events: list[tuple[str, EventData]]) -> None:
    """Produce ``events`` (event id, data) in order, keyed by customer; flushed."""
    producer = Producer(
        {"bootstrap.servers": settings.kafka.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    errors: list[str] = []
    for event_id, data in events:
        record = encode(Envelope.wrap(data, id=event_id, source="/tests/rating", time=utc(1)))
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
            on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
        )
    assert producer.flush(30) == 0 and not errors, errors


def event_id(*parts: str) -> str:
    return deterministic_id("tests-rating", *parts)
