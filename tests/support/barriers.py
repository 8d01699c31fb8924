"""Barriers for tests that must show that *nothing else* happens (no new invoice, event or
email), without a fixed sleep: a sentinel customer sent through the whole pipeline.

:func:`sentinel_invoice` produces one fresh customer, one usage line of 1.00 USD and its
close marker to the sandbox's account-events topic, then waits until that invoice's
email is in the SMTP sink's Maildir and neither consumer group lags. Why that is a
barrier: the worker commits the offsets of a partition only after its database commit;
Debezium publishes the outbox in commit order (one task), so once the sentinel's
``invoice.issued`` reached the topic every outbox row committed before it did; and the
email group's lag 0 means the sender has handled every record of every partition up to
then. Whatever an earlier action would still cause has therefore happened, and the test
compares counts with :data:`SENTINEL_ROWS` added (a literal: one row per table, so the
oracle does not come from the code under test).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

from streams.adapters.kafka import make_producer
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    EventData,
    UsageRecorded,
)
from streams.devtools.stack.maildir import list_messages
from tests.support.kafka import wait_for_no_lag
from tests.support.pipeline import Pipeline

#: Rows one sentinel adds to each table (one customer, one usage line, one invoice of one
#: line, its outbox row, its email delivery, its period close; no credit note).
SENTINEL_ROWS: dict[str, int] = {
    "invoices": 1,
    "invoice_lines": 1,
    "outbox": 1,
    "email_deliveries": 1,
    "usage_lines": 1,
    "period_closes": 1,
    "credit_notes": 0,
}
#: Prefix of every sentinel customer id.
SENTINEL_PREFIX = "sentinel-"


def plus_sentinel(counts: dict[str, int], sentinels: int = 1) -> dict[str, int]:
    """``counts`` (table → rows) as they must be after ``sentinels`` sentinel invoices."""
    return {table: n + sentinels * SENTINEL_ROWS[table] for table, n in counts.items()}


def sentinel_invoice(p: Pipeline, period: str = "2023-01", *, timeout_s: float = 120.0) -> str:
    """Send a sentinel customer through the pipeline and wait for its email and for both
    groups to have no lag (module docstring). Needs running invoicing and email workers.

    Returns the sentinel's customer id (``sentinel-<hex>``).

    Raises:
        AssertionError: the sentinel's email did not arrive, or a group still lags,
            after ``timeout_s`` seconds (with the workers' logs).
    """
    customer = f"{SENTINEL_PREFIX}{uuid.uuid4().hex[:12]}"
    month = datetime.strptime(period, "%Y-%m").replace(day=2, tzinfo=UTC)
    events: list[tuple[str, EventData]] = [
        (
            f"cu-{customer}",
            CustomerUpserted(
                customer_id=customer,
                name="Sentinel",
                email=f"{customer}@example.test",
                currency="USD",
            ),
        ),
        (
            f"u-{customer}",
            UsageRecorded(
                customer_id=customer,
                billing_period=period,
                amount=Decimal("1.00"),
                currency="USD",
                description="sentinel",
                event_time=month,
            ),
        ),
        (
            f"close-{customer}",
            BillingPeriodClosed(
                customer_id=customer, billing_period=period, closed_at=datetime.now(UTC)
            ),
        ),
    ]
    producer = make_producer(p.settings.kafka)
    for event_id, data in events:
        enc = encode(Envelope.wrap(data, id=event_id, source="/tests/sentinel"))
        producer.produce(p.topic, key=enc.key, value=enc.value, headers=list(enc.headers))
    assert producer.flush(30) == 0, "the sentinel's records were not delivered"
    deadline = time.monotonic() + timeout_s
    while not any(customer in str(m.get("To", "")) for m in list_messages(p.maildir)):
        dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
        assert not dead, f"workers died before the sentinel's email: {dead}\n{p.worker_logs()}"
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the sentinel {customer}'s email did not arrive in {timeout_s:.0f}s\n"
                f"{p.worker_logs()}"
            )
        time.sleep(0.2)
    remaining = max(10.0, deadline - time.monotonic())
    wait_for_no_lag(p.settings.kafka, p.settings.worker.invoicing_group, p.topic, remaining)
    wait_for_no_lag(p.settings.kafka, p.settings.worker.email_group, p.invoices_topic, remaining)
    return customer
