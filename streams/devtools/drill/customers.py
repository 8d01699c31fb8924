"""The drill's customers: a deterministic set per seed, and their usage events.

``generate_customers(config, run_tag)`` draws everything from
``random.Random(config.seed)``: which customers are large (exactly
``config.large_count`` of them), how many lines each has, and every line's
amount (``Decimal``, 4 decimals, 0.0001-50.0000 USD) and region. The same
seed gives the same sizes and amounts in both modes; the customer ids carry
``run_tag`` as well (``drill-s<seed>-<tag>-<nnnn>``) so that two runs never
share invoice ids, and with them the tax service's idempotency keys and the
Redis tax cache (a second run would otherwise answer tax from the cache and
never be slow).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    UsageRecorded,
    deterministic_id,
)
from streams.core.domain.periods import BillingPeriod
from streams.devtools.drill.config import DrillConfig

REGIONS = ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-2")
SKUS = ("compute", "storage", "egress", "database", "support")
CURRENCY = "USD"
#: CloudEvents ``source`` of the drill's events.
SOURCE = "/drill"


@dataclass(frozen=True)
class DrillLine:
    """One usage line: its id (unique within the customer), amount (USD), region, SKU."""

    line_id: str
    amount: Decimal
    region_id: str
    sku: str


@dataclass(frozen=True)
class DrillCustomer:
    customer_id: str
    name: str
    email: str
    large: bool
    lines: tuple[DrillLine, ...]

    @property
    def subtotal(self) -> Decimal:
        """Exact sum of the line amounts (USD, not rounded)."""
        return sum((line.amount for line in self.lines), Decimal(0))


def customer_id(seed: int, run_tag: str, index: int) -> str:
    return f"drill-s{seed}-{run_tag}-{index:04d}"


def generate_customers(config: DrillConfig, run_tag: str) -> list[DrillCustomer]:
    """The customer set of ``config.seed`` (see the module docstring).

    Raises:
        ValueError: sizes out of range (no customers, a min above its max, lines < 1).
    """
    if config.customers < 1:
        raise ValueError("a drill needs at least one customer")
    for low, high in (config.large_lines, config.small_lines):
        if not 1 <= low <= high:
            raise ValueError(f"line range ({low}, {high}) must satisfy 1 <= min <= max")
    rng = random.Random(config.seed)
    large = set(rng.sample(range(config.customers), min(config.large_count, config.customers)))
    customers = []
    for index in range(config.customers):
        is_large = index in large
        low, high = config.large_lines if is_large else config.small_lines
        count = rng.randint(low, high)
        lines = tuple(
            DrillLine(
                line_id=f"l{n:05d}",
                amount=Decimal(rng.randint(1, 500_000)).scaleb(-4),
                region_id=rng.choice(REGIONS),
                sku=rng.choice(SKUS),
            )
            for n in range(count)
        )
        cid = customer_id(config.seed, run_tag, index)
        customers.append(
            DrillCustomer(
                customer_id=cid,
                name=f"Drill customer {index:04d}" + (" (large)" if is_large else ""),
                email=f"{cid}@drill.example",
                large=is_large,
                lines=lines,
            )
        )
    return customers


def usage_events(customer: DrillCustomer, period: str) -> Iterator[Envelope]:
    """``customer.upserted`` then one ``usage.recorded`` per line, with deterministic ids
    (a resend deduplicates), event times inside ``period`` (UTC)."""
    when = BillingPeriod.parse(period).start
    yield Envelope.wrap(
        CustomerUpserted(
            customer_id=customer.customer_id,
            name=customer.name,
            email=customer.email,
            currency=CURRENCY,
        ),
        id=deterministic_id("drill", "customer", customer.customer_id),
        source=SOURCE,
        time=datetime.now(UTC),
    )
    for line in customer.lines:
        yield Envelope.wrap(
            UsageRecorded(
                customer_id=customer.customer_id,
                billing_period=period,
                amount=line.amount,
                currency=CURRENCY,
                sku_id=line.sku,
                description=f"{line.sku} {line.line_id}",
                region_id=line.region_id,
                event_time=when,
            ),
            id=deterministic_id("drill", "usage", customer.customer_id, period, line.line_id),
            source=SOURCE,
            time=datetime.now(UTC),
        )
