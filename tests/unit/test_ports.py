"""The PostgreSQL stores, the fences, the dead-letter sink, the Kafka clients and their
in-memory twins implement the kernel's ports (streams/core/billing/ports.py,
streams/apps/email/store.py ``Deliveries``): mypy checks each against its Protocol (the
assignments below), and the test checks that every member of a port exists."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from psycopg_pool import ConnectionPool

from streams.adapters.memory import fencing as memory_fencing
from streams.adapters.memory import store as memory_store
from streams.adapters.memory.database import InMemoryDatabase, MemoryConnection
from streams.adapters.memory.dead_letters import InMemoryDeadLetterSink
from streams.adapters.memory.kafka import InMemoryConsumer, InMemoryProducer
from streams.apps.email.store import Deliveries, DeliveryStore
from streams.apps.email.twin import InMemoryDeliveryStore
from streams.core.billing import fencing, ports, store
from streams.core.billing.dead_letters import DeadLetters

Conn = psycopg.Connection[Any]

USAGE: ports.UsageStore[Conn] = store.usage
INVOICES: ports.InvoiceStore[Conn] = store.invoices
HOLDS: ports.HoldStore[Conn] = store.holds
CLOSES: ports.CloseStore[Conn] = store.closes
FENCES: ports.FenceStore[Conn] = fencing

# the twins implement the same ports (over their own connection)
MEMORY_USAGE: ports.UsageStore[MemoryConnection] = memory_store.usage
MEMORY_INVOICES: ports.InvoiceStore[MemoryConnection] = memory_store.invoices
MEMORY_HOLDS: ports.HoldStore[MemoryConnection] = memory_store.holds
MEMORY_CLOSES: ports.CloseStore[MemoryConnection] = memory_store.closes
MEMORY_FENCES: ports.FenceStore[MemoryConnection] = memory_fencing


def _typed(
    pool: ConnectionPool[Conn],
    memory: InMemoryDatabase,
    consumer: Consumer,
    twin_consumer: InMemoryConsumer,
    producer: Producer,
    twin_producer: InMemoryProducer,
    deliveries: DeliveryStore,
    twin_deliveries: InMemoryDeliveryStore,
    dead_letters: DeadLetters,
    twin_dead_letters: InMemoryDeadLetterSink,
) -> None:
    """Never called: mypy checks that each real client and each twin implements its port."""
    databases: list[ports.Database[Any]] = [pool, memory]
    sources: list[ports.KafkaSource] = [consumer, twin_consumer]
    sinks: list[ports.KafkaSink] = [producer, twin_producer]
    stores: list[Deliveries] = [deliveries, twin_deliveries]
    letters: list[ports.DeadLetterSink] = [dead_letters, twin_dead_letters]
    assert databases and sources and sinks and stores and letters


def _members(protocol: type) -> set[str]:
    return {
        name
        for name, value in vars(protocol).items()
        if callable(value) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    ("protocol", "implementation"),
    [
        (ports.UsageStore, USAGE),
        (ports.InvoiceStore, INVOICES),
        (ports.HoldStore, HOLDS),
        (ports.CloseStore, CLOSES),
        (ports.FenceStore, FENCES),
        (ports.DeadLetterSink, DeadLetters),
        (ports.UsageStore, MEMORY_USAGE),
        (ports.InvoiceStore, MEMORY_INVOICES),
        (ports.HoldStore, MEMORY_HOLDS),
        (ports.CloseStore, MEMORY_CLOSES),
        (ports.FenceStore, MEMORY_FENCES),
        (ports.DeadLetterSink, InMemoryDeadLetterSink),
        (ports.KafkaSource, Consumer),
        (ports.KafkaSource, InMemoryConsumer),
        (ports.KafkaSink, Producer),
        (ports.KafkaSink, InMemoryProducer),
        (ports.Database, InMemoryDatabase),
        (Deliveries, DeliveryStore),
        (Deliveries, InMemoryDeliveryStore),
    ],
    ids=[
        "usage",
        "invoices",
        "holds",
        "closes",
        "fences",
        "dead-letters",
        "memory-usage",
        "memory-invoices",
        "memory-holds",
        "memory-closes",
        "memory-fences",
        "memory-dead-letters",
        "kafka-source",
        "memory-kafka-source",
        "kafka-sink",
        "memory-kafka-sink",
        "memory-database",
        "deliveries",
        "memory-deliveries",
    ],
)
def test_every_member_of_a_port_is_implemented(protocol: type, implementation: object) -> None:
    members = _members(protocol)
    assert members, f"{protocol.__name__} declares no member"
    missing = sorted(name for name in members if not callable(getattr(implementation, name, None)))
    assert not missing, f"{implementation!r} lacks {missing} of {protocol.__name__}"
