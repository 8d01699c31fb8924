"""A seeded generator of account events for the view's tests and benchmarks (pure).

N customers of one billing period, each with a ``customer.upserted``; a share
subscribes (``subscription.started`` on a plan of ``examples/pricing/price-book.yaml``,
some mid-period, some changing plan version mid-period) and sends ``usage.metered``
events of the book's metrics; every customer sends pre-priced ``usage.recorded``
lines (pass-through). Same seed, same events, same ids.

Not the pricing demo (``examples/pricing/``, with its independent
answer): this one exists to exercise the view's tables at any size.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    SubscriptionChanged,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
    deterministic_id,
)
from streams.core.domain.periods import BillingPeriod

REGIONS = ("eu", "us", "ap")


@dataclass(frozen=True)
class ScenarioConfig:
    customers: int = 20
    period: str = "2024-09"
    #: usage.recorded lines per customer
    pass_through_lines: int = 10
    #: usage.metered events per subscribed customer
    metered_events: int = 50
    #: share of customers with a subscription (they rate under a plan)
    subscribed_share: float = 0.5
    seed: int = 1
    prefix: str = "cust"


def customer_ids(config: ScenarioConfig) -> list[str]:
    return [f"{config.prefix}-{i:06d}" for i in range(config.customers)]


def events(config: ScenarioConfig) -> Iterator[Envelope]:
    """The scenario's events, customer by customer, in the order a producer sends them
    (each customer's subscription before its usage). Every customer is billable (no
    hold) under ``examples/pricing/price-book.yaml``: growth subscribers have metered and
    pass-through usage, starter subscribers metered usage only, the others pass-through."""
    rng = random.Random(config.seed)
    period = BillingPeriod.parse(config.period)
    days = (period.end - period.start).days
    source = "scenario"
    for customer in customer_ids(config):
        yield Envelope.wrap(
            CustomerUpserted(
                customer_id=customer, name=customer, email=f"{customer}@example.com", currency="USD"
            ),
            id=deterministic_id("customer", customer),
            source=source,
        )
        subscribed = rng.random() < config.subscribed_share
        first = period.start
        plan = None
        if subscribed:
            start_day = 0 if rng.random() < 0.7 else rng.randrange(days)
            first = period.start + timedelta(days=start_day, hours=rng.randrange(24))
            plan = "growth" if rng.random() < 0.6 else "starter"
            yield Envelope.wrap(
                SubscriptionStarted(
                    customer_id=customer, effective_at=first, plan_code=plan, plan_version=1
                ),
                id=deterministic_id("sub", customer, "start"),
                source=source,
            )
            if plan == "growth" and rng.random() < 0.3:
                change = first + timedelta(days=rng.randrange(1, max(2, days - start_day)))
                if change < period.end:
                    yield Envelope.wrap(
                        SubscriptionChanged(
                            customer_id=customer,
                            effective_at=change,
                            plan_code="growth",
                            plan_version=2,
                        ),
                        id=deterministic_id("sub", customer, "change"),
                        source=source,
                    )
            for n in range(config.metered_events):
                at = first + timedelta(
                    seconds=rng.randrange(int((period.end - first).total_seconds()))
                )
                yield Envelope.wrap(
                    _metered(rng, customer, at, plan),
                    id=deterministic_id("m", customer, str(n)),
                    source=source,
                )
        if plan == "starter":
            continue  # the starter plan prices no pass-through usage: its invoices would be held
        # a subscriber's pre-priced lines fall on its subscribed days (else: held, not priced)
        span = int((period.end - first).total_seconds())
        for n in range(config.pass_through_lines):
            at = first + timedelta(seconds=rng.randrange(span))
            amount = Decimal(rng.randrange(-50, 5_000)) / Decimal(10_000)
            yield Envelope.wrap(
                UsageRecorded(
                    customer_id=customer,
                    billing_period=config.period,
                    amount=amount,
                    currency="USD",
                    event_time=at,
                    description="cloud usage",
                ),
                id=deterministic_id("u", customer, str(n)),
                source=source,
            )


def _metered(rng: random.Random, customer: str, at: datetime, plan: str | None) -> UsageMetered:
    """A metered event of a metric ``plan`` prices (growth: peak storage and egress;
    starter: end-of-period storage, no egress)."""
    kind = rng.random() * (0.85 if plan == "starter" else 1.0)
    at = at.astimezone(UTC)
    if kind < 0.55:
        return UsageMetered(
            customer_id=customer,
            metric="api_calls",
            event_time=at,
            properties={"billable": "true" if rng.random() < 0.9 else "false"},
            # the gateway reports calls in batches (the book sums values.calls)
            values={"calls": Decimal(rng.randrange(1, 5_000))},
        )
    if kind < 0.7:
        gb = Decimal(rng.randrange(1, 2_000)) / 10
        metric = "storage_gb_end" if plan == "starter" else "storage_gb"
        return UsageMetered(customer_id=customer, metric=metric, event_time=at, values={"gb": gb})
    if kind < 0.85:
        return UsageMetered(
            customer_id=customer,
            metric="seats",
            event_time=at,
            properties={"user_id": f"u{rng.randrange(30)}"},
        )
    return UsageMetered(
        customer_id=customer,
        metric="egress_gb",
        event_time=at,
        properties={"region": rng.choice(REGIONS)},
        values={"gb": Decimal(rng.randrange(1, 500)) / 100},
    )
