"""Twin of :mod:`streams.core.billing.store.metering`: ``metered_usage`` and
``subscription_events`` in memory (the :class:`~streams.core.billing.ports.MeteringStore`
port over a :class:`~streams.adapters.memory.database.MemoryConnection`).

Kept as PostgreSQL has it: both keyed by event id with ``ON CONFLICT DO NOTHING`` (the
first stored occurrence wins, in batch order); an id stored with another payload hash
is returned as a :class:`~streams.core.billing.rows.RecordConflict` and never overwritten;
reads select by customer, period (metered), source topic and partition, and offsets
strictly below the marker's; subscriptions come back in partition order.
"""

from __future__ import annotations

from collections.abc import Sequence

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import (
    METERED_USAGE,
    SUBSCRIPTION_EVENTS,
    check_period,
)
from streams.core.billing.rows import (
    MeteredRecord,
    RecordConflict,
    SourceCoordinates,
    SubscriptionRecord,
)
from streams.core.billing.store.metering import MeteredRead
from streams.core.domain.events import SubscriptionEvent
from streams.core.domain.rating import MeteredEvent

__all__ = [
    "insert_metered",
    "insert_subscriptions",
    "metered_before",
    "metered_elsewhere",
    "subscriptions_before",
]


def _insert(
    conn: MemoryConnection,
    name: str,
    table_name: str,
    records: Sequence[MeteredRecord] | Sequence[SubscriptionRecord],
) -> list[RecordConflict]:
    if not records:
        return []
    with conn.statement(name) as stmt:
        table = stmt.table(table_name)
        for r in records:
            if isinstance(r, MeteredRecord):
                check_period(stmt, table_name, r.billing_period)
        for r in records:  # in order: the first occurrence of an id is the stored one
            table.setdefault(r.event_id, r)
        conflicts: list[RecordConflict] = []
        for r in records:
            first: MeteredRecord | SubscriptionRecord = table[r.event_id]
            if r.payload_sha256 != first.payload_sha256:
                conflicts.append(RecordConflict(r, first.payload_sha256, first.source))
        return conflicts


def insert_metered(
    conn: MemoryConnection, records: Sequence[MeteredRecord]
) -> list[RecordConflict]:
    """Store metered events, deduplicated by event id; returns the conflicts (see
    :func:`streams.core.billing.store.metering.insert_metered`)."""
    return _insert(conn, "metering.insert_metered", METERED_USAGE, records)


def insert_subscriptions(
    conn: MemoryConnection, records: Sequence[SubscriptionRecord]
) -> list[RecordConflict]:
    """Store subscription events, deduplicated by event id; returns the conflicts."""
    return _insert(conn, "metering.insert_subscriptions", SUBSCRIPTION_EVENTS, records)


def _before(source: SourceCoordinates, topic: str, partition: int, before_offset: int) -> bool:
    return source.topic == topic and source.partition == partition and source.offset < before_offset


def _read(found: list[MeteredRecord]) -> MeteredRead:
    offsets = [r.source.offset for r in found]
    return MeteredRead(
        [
            MeteredEvent(
                r.event_id,
                r.data.metric,
                r.data.event_time,
                dict(r.data.properties),
                dict(r.data.values),
            )
            for r in found
        ],
        min(offsets) if offsets else None,
        max(offsets) if offsets else None,
    )


def metered_elsewhere(
    conn: MemoryConnection, customer_id: str, billing_period: str, topic: str, partition: int
) -> MeteredRead:
    """The customer's metered events of the period read from ``topic`` on any other
    partition (see :func:`streams.core.billing.store.metering.metered_elsewhere`)."""
    with conn.statement("metering.metered_elsewhere") as stmt:
        found: list[MeteredRecord] = [
            r
            for r in stmt.table(METERED_USAGE).values()
            if r.data.customer_id == customer_id
            and r.billing_period == billing_period
            and r.source.topic == topic
            and r.source.partition != partition
        ]
    return _read(found)


def metered_before(
    conn: MemoryConnection,
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
    before_offset: int,
) -> MeteredRead:
    """The customer's metered events of the period read from ``topic[partition]`` before
    ``before_offset`` (see :func:`streams.core.billing.store.metering.metered_before`)."""
    with conn.statement("metering.metered_before") as stmt:
        found: list[MeteredRecord] = [
            r
            for r in stmt.table(METERED_USAGE).values()
            if r.data.customer_id == customer_id
            and r.billing_period == billing_period
            and _before(r.source, topic, partition, before_offset)
        ]
    return _read(found)


def subscriptions_before(
    conn: MemoryConnection, customer_id: str, topic: str, partition: int, before_offset: int
) -> list[SubscriptionEvent]:
    """The customer's subscription events read from ``topic[partition]`` before
    ``before_offset``, in partition order."""
    with conn.statement("metering.subscriptions_before") as stmt:
        found: list[SubscriptionRecord] = [
            r
            for r in stmt.table(SUBSCRIPTION_EVENTS).values()
            if r.data.customer_id == customer_id
            and _before(r.source, topic, partition, before_offset)
        ]
    return [r.data for r in sorted(found, key=lambda r: r.source.offset)]
