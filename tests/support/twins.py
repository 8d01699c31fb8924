"""A pipeline on the twins, for unit tests of the loops: the in-memory Kafka (the registry's
topics), the in-memory database with the twin stores, the in-memory tax service and mail transport —
no service, no mock (docs/conventions.md "Ports with two implementations").

:class:`Twins` builds workers and senders on them, writes events the way producers do
(CloudEvents binary mode, key = customer id, murmur2 partition) and reads back what the
pipeline did (rows, committed offsets, dead letters). :func:`drive` steps a worker's
poll loop (``poll_once``) until a condition holds, on the test's thread, as
:meth:`~streams.apps.invoicing.worker.InvoicingWorker.run` would.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Message
from prometheus_client import REGISTRY

from streams.adapters.kafka import topic_specs
from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.kafka import InMemoryConsumer, InMemoryKafka, partition_for
from streams.adapters.memory.mail import InMemoryMailTransport
from streams.adapters.memory.store import tables
from streams.adapters.memory.stores import MEMORY
from streams.adapters.memory.tax import InMemoryTaxService
from streams.apps.email.sender import EmailSender
from streams.apps.email.twin import InMemoryDeliveryStore
from streams.apps.invoicing.worker import InvoicingWorker
from streams.core.billing.dead_letters import DeadLetters
from streams.core.billing.ports import TaxService
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    EventData,
    UsageRecorded,
)
from streams.core.domain.invoice import TaxedLine, TaxLine
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS, ACCOUNT_EVENTS_DLQ, INVOICES, INVOICES_DLQ

PERIOD = "2026-01"


def metric(name: str, **labels: str) -> float:
    """A Prometheus sample of the default registry (0 when never set)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Twins:
    """The twins of one test, and the names the pipeline uses on them."""

    settings: Settings
    kafka: InMemoryKafka = field(default_factory=InMemoryKafka)
    db: InMemoryDatabase = field(default_factory=InMemoryDatabase)
    tax: InMemoryTaxService = field(default_factory=InMemoryTaxService)
    mail: InMemoryMailTransport = field(default_factory=InMemoryMailTransport)

    def __post_init__(self) -> None:
        self.kafka.create_topics(topic_specs(self.settings.kafka))

    @classmethod
    def create(cls, base: Settings) -> Twins:
        """Twins under a topic prefix and groups of their own (the settings are copied)."""
        run = uuid.uuid4().hex[:8]
        settings = base.model_copy(
            update={
                "kafka": base.kafka.model_copy(update={"topic_prefix": f"unit.{run}."}),
                "worker": base.worker.model_copy(
                    update={
                        "invoicing_group": f"invoicing-{run}",
                        "email_group": f"email-{run}",
                        "metrics_port": 0,
                        "max_jobs": 2,
                    }
                ),
            }
        )
        return cls(settings)

    # ------------------------------------------------------------------ names

    @property
    def prefix(self) -> str:
        return self.settings.kafka.topic_prefix

    @property
    def topic(self) -> str:
        return ACCOUNT_EVENTS.with_prefix(self.prefix).name

    @property
    def dlq_topic(self) -> str:
        return ACCOUNT_EVENTS_DLQ.with_prefix(self.prefix).name

    @property
    def invoices_topic(self) -> str:
        return INVOICES.with_prefix(self.prefix).name

    @property
    def invoices_dlq_topic(self) -> str:
        return INVOICES_DLQ.with_prefix(self.prefix).name

    @property
    def group(self) -> str:
        return self.settings.worker.invoicing_group

    def partition_of(self, customer: str) -> int:
        return partition_for(customer.encode(), self.kafka.partitions(self.topic))

    def customer_on(self, partition: int, prefix: str = "cust") -> str:
        """A customer id whose records land on ``partition``."""
        for n in range(10_000):
            candidate = f"{prefix}-{n}"
            if self.partition_of(candidate) == partition:
                return candidate
        raise AssertionError(f"no customer on partition {partition}")

    # ------------------------------------------------------------------ builders

    def worker(
        self,
        *,
        tax: TaxService | None = None,
        stop: threading.Event | None = None,
        retry_backoff_s: float = 0.05,
    ) -> InvoicingWorker:
        """An invoicing worker on the twins (its own consumer of the group)."""
        return InvoicingWorker(
            self.settings,
            pool=self.db,
            stores=MEMORY,
            tax=tax or self.tax,
            consumer=self.kafka.consumer(self.group),
            producer=self.kafka.producer(),
            stop=stop,
            retry_backoff_s=retry_backoff_s,
        )

    def sender(self, *, stop: threading.Event | None = None) -> EmailSender:
        """An email sender on the twins, subscribed to the invoices topic."""
        consumer = self.kafka.consumer(self.settings.worker.email_group)
        consumer.subscribe([self.invoices_topic])
        return EmailSender(
            self.settings,
            deliveries=InMemoryDeliveryStore(self.db, lock_timeout_s=2.0),
            consumer=consumer,
            transport=self.mail,
            stop=stop,
            dead_letters=DeadLetters(
                self.kafka.producer(),
                self.invoices_dlq_topic,
                self.settings.worker.email_group,
                timeout_s=1.0,
            ),
        )

    # ------------------------------------------------------------------ writing events

    def send(
        self, data: EventData, *, event_id: str | None = None, topic: str | None = None
    ) -> Message:
        """Write ``data`` as a producer does (key = customer id); returns the record."""
        record = encode(Envelope.wrap(data, id=event_id or str(uuid.uuid4()), source="/test/unit"))
        return self.kafka.append(
            topic or self.topic,
            key=record.key,
            value=record.value,
            headers=list(record.headers),
        )

    def customer(self, customer_id: str, *, currency: str = "USD") -> Message:
        return self.send(
            CustomerUpserted(
                customer_id=customer_id,
                name=f"Customer {customer_id}",
                email=f"ap@{customer_id}.example",
                currency=currency,
            ),
            event_id=f"customer-{customer_id}-{uuid.uuid4().hex[:6]}",
        )

    def usage(
        self,
        customer_id: str,
        amount: str,
        *,
        event_id: str | None = None,
        currency: str = "USD",
        period: str = PERIOD,
    ) -> Message:
        return self.send(
            UsageRecorded(
                customer_id=customer_id,
                billing_period=period,
                amount=Decimal(amount),
                currency=currency,
                region_id="us-west-2",
                description="Compute",
                event_time=datetime(2026, 1, 5, tzinfo=UTC),
            ),
            event_id=event_id,
        )

    def close(self, customer_id: str, *, period: str = PERIOD) -> Message:
        return self.send(
            BillingPeriodClosed(
                customer_id=customer_id,
                billing_period=period,
                closed_at=datetime(2026, 2, 1, tzinfo=UTC),
            ),
            event_id=f"close-{customer_id}-{period}",
        )

    # ------------------------------------------------------------------ reading state

    def rows(self, table: str) -> list[Any]:
        """The committed rows of a twin table (names in :mod:`streams.adapters.memory.store.tables`)."""
        return list(self.db.table(table).values())

    def invoices(self, customer_id: str | None = None) -> list[tables.InvoiceRow]:
        return [r for r in self.rows(tables.INVOICES) if customer_id in (None, r.customer_id)]

    def committed(self, topic: str | None = None, group: str | None = None) -> dict[int, int]:
        return self.kafka.committed(group or self.group, topic or self.topic)

    def dead_letters(self, topic: str | None = None) -> list[Message]:
        return self.kafka.records(topic or self.dlq_topic)


def subscribe(worker: InvoicingWorker) -> None:
    """Subscribe ``worker``'s consumer with its callbacks, as :meth:`InvoicingWorker.run` does."""
    worker.consumer.subscribe(
        [worker.topic],
        on_assign=worker._on_assign,
        on_revoke=worker._on_revoke,
        on_lost=worker._on_lost,
    )


def drive(
    workers: InvoicingWorker | Sequence[InvoicingWorker],
    until: Callable[[], bool],
    *,
    timeout_s: float = 5.0,
    what: str = "",
) -> None:
    """Call ``poll_once`` of ``workers`` in turn until ``until()`` holds."""
    group = [workers] if isinstance(workers, InvoicingWorker) else list(workers)
    deadline = time.monotonic() + timeout_s
    while not until():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what or until}")
        for worker in group:
            worker.poll_once(timeout_s=0.01)


def spin(workers: InvoicingWorker | Sequence[InvoicingWorker], seconds: float) -> None:
    """Keep ``workers`` polling for ``seconds`` (to show that something does not happen)."""
    deadline = time.monotonic() + seconds
    drive(workers, lambda: time.monotonic() > deadline, timeout_s=seconds + 5)


class GatedTax:
    """A :class:`~streams.core.billing.ports.TaxService` that holds each call until released,
    and records the thread it ran on; the answers are the in-memory service's."""

    def __init__(self, inner: InMemoryTaxService) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []
        #: called inside each call, after ``entered`` is set (e.g. to cancel the job)
        self.during: Callable[[], None] = lambda: None

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        self.threads.append(threading.current_thread().name)
        self.entered.set()
        self.during()
        assert self.release.wait(10), "the test never released the tax call"
        return self.inner.calculate(
            idempotency_key=idempotency_key,
            customer_id=customer_id,
            currency=currency,
            lines=lines,
            commit=commit,
        )


def consumer_of(worker: InvoicingWorker) -> InMemoryConsumer:
    consumer = worker.consumer
    assert isinstance(consumer, InMemoryConsumer)
    return consumer
