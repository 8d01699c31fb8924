"""``metered_usage`` and ``subscription_events``: what rating reads besides ``usage_lines``.

Both are keyed by event id like ``usage_lines`` (docs/design.md, invariant 3): the
same id with the same payload is a duplicate (a no-op), with another payload a
conflict (returned; the stored row is never overwritten; the worker dead-letters
the record and holds the customer). Payloads are compared by the SHA-256 of the
event data's canonical JSON (:func:`streams.core.billing.rows.payload_hash`); the
decimals of ``usage.metered`` are canonical, so ``"10"`` and ``"10.0"`` are one
payload.

The invoice job reads, for a close marker, the customer's metered events of the
period and all its subscription events that precede the marker on its partition
(:func:`metered_before`, :func:`subscriptions_before`); the replay and
close-period read a customer's whole subscription history
(:func:`subscription_history`).

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
Shapes: decimals ``Decimal``, periods ``YYYY-MM``, times UTC.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import args_row, class_row, scalar_row

from streams.core.billing.rows import (
    MeteredRecord,
    RecordConflict,
    SourceCoordinates,
    SubscriptionRecord,
)
from streams.core.domain.events import (
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
)
from streams.core.domain.rating import MeteredEvent

__all__ = [
    "LateMetered",
    "MeteredRead",
    "StoredSubscription",
    "customers_with_metered",
    "insert_metered",
    "insert_subscriptions",
    "late_metered",
    "metered_before",
    "metered_below",
    "metered_elsewhere",
    "stored_metered_ids",
    "subscription_history",
    "subscriptions_before",
]


@dataclass(frozen=True)
class _Stored:
    event_id: str
    payload_sha256: str
    source_topic: str
    source_partition: int
    source_offset: int


def _conflicts(
    conn: psycopg.Connection[Any],
    table: str,
    records: Sequence[MeteredRecord] | Sequence[SubscriptionRecord],
) -> list[RecordConflict]:
    """Records whose id is stored (first occurrence: an earlier batch, or the first of
    this batch, ``executemany`` inserts in order) with another payload."""
    with conn.cursor(row_factory=class_row(_Stored)) as cur:
        stored = {
            found.event_id: found
            for found in cur.execute(
                f"SELECT event_id, payload_sha256, source_topic, source_partition, source_offset "
                f"FROM {table} WHERE event_id = ANY(%s)",
                ([r.event_id for r in records],),
            )
        }
    conflicts: list[RecordConflict] = []
    for record in records:
        first = stored[record.event_id]
        if record.payload_sha256 != first.payload_sha256:
            conflicts.append(
                RecordConflict(
                    record,
                    first.payload_sha256,
                    SourceCoordinates(
                        first.source_topic, first.source_partition, first.source_offset
                    ),
                )
            )
    return conflicts


def insert_metered(
    conn: psycopg.Connection[Any], records: Sequence[MeteredRecord]
) -> list[RecordConflict]:
    """Store metered events, deduplicated by event id. Returns the conflicts: ids already
    stored with a different payload (the stored row is kept as it is)."""
    if not records:
        return []
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO metered_usage (event_id, customer_id, billing_period, metric, event_time,
                properties, decimals, payload_sha256, source_topic, source_partition, source_offset,
                key_id)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (event_id) DO NOTHING
            """,
            [
                (
                    r.event_id,
                    r.data.customer_id,
                    r.billing_period,
                    r.data.metric,
                    r.data.event_time,
                    json.dumps(dict(r.data.properties), sort_keys=True),
                    json.dumps(
                        {k: format(v, "f") for k, v in r.data.values.items()}, sort_keys=True
                    ),
                    r.payload_sha256,
                    r.source.topic,
                    r.source.partition,
                    r.source.offset,
                    r.key_id,
                )
                for r in records
            ],
        )
    return _conflicts(conn, "metered_usage", records)


def insert_subscriptions(
    conn: psycopg.Connection[Any], records: Sequence[SubscriptionRecord]
) -> list[RecordConflict]:
    """Store subscription events, deduplicated by event id. Returns the conflicts."""
    if not records:
        return []
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO subscription_events (event_id, customer_id, event_type, plan_code,
                plan_version, effective_at, reason, payload_sha256, source_topic,
                source_partition, source_offset)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (event_id) DO NOTHING
            """,
            [
                (
                    r.event_id,
                    r.data.customer_id,
                    r.data.event_type,
                    *r.plan,
                    r.data.effective_at,
                    r.data.reason if isinstance(r.data, SubscriptionEnded) else None,
                    r.payload_sha256,
                    r.source.topic,
                    r.source.partition,
                    r.source.offset,
                )
                for r in records
            ],
        )
    return _conflicts(conn, "subscription_events", records)


# --------------------------------------------------------------------------- reads


_EMPTY: Mapping[str, str] = {}


def _text_map(text: str) -> Mapping[str, str]:
    # Most events carry empty maps: skip the JSON parser for them (measured: parsing two
    # jsonb columns was 60 % of reading a customer's month of metered events).
    if text == "{}":
        return _EMPTY
    loaded: dict[str, str] = json.loads(text)
    return loaded


def _metered(
    event_id: str,
    metric: str,
    event_time: datetime,
    properties: str,
    decimals: str,
    source_offset: int,
) -> tuple[MeteredEvent, int]:
    return (
        MeteredEvent(
            event_id,
            metric,
            event_time,
            _text_map(properties),
            {name: Decimal(text) for name, text in _text_map(decimals).items()},
        ),
        int(source_offset),
    )


@dataclass(frozen=True)
class MeteredRead:
    """A customer's distinct metered events of a period (any order) and the lowest and
    highest offset they were read at (None, None without events)."""

    events: list[MeteredEvent]
    first_offset: int | None
    last_offset: int | None


def metered_before(
    conn: psycopg.Connection[Any],
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
    before_offset: int,
) -> MeteredRead:
    """The customer's metered events of the period read from ``topic[partition]`` before
    ``before_offset`` (the close marker): what its invoice rates (invariant 3)."""
    with conn.cursor(row_factory=args_row(_metered)) as cur:
        found = cur.execute(
            """
            SELECT event_id, metric, event_time, properties::text, decimals::text, source_offset
              FROM metered_usage
             WHERE customer_id = %s AND billing_period = %s
               AND source_topic = %s AND source_partition = %s AND source_offset < %s
            """,
            (customer_id, billing_period, topic, partition, before_offset),
        ).fetchall()
    offsets = [offset for _, offset in found]
    return MeteredRead(
        [event for event, _ in found],
        min(offsets) if offsets else None,
        max(offsets) if offsets else None,
    )


def metered_elsewhere(
    conn: psycopg.Connection[Any],
    customer_id: str,
    billing_period: str,
    topic: str,
    partition: int,
) -> MeteredRead:
    """The customer's metered events of the period read from ``topic`` on any partition but
    ``partition`` (offsets of those partitions in ``first_offset``/``last_offset`` mean nothing
    together: only whether there are events). Non-empty only after the topic gained partitions and
    moved the customer (docs/design.md "Scaling"; docs/operations.md)."""
    with conn.cursor(row_factory=args_row(_metered)) as cur:
        found = cur.execute(
            """
            SELECT event_id, metric, event_time, properties::text, decimals::text, source_offset
              FROM metered_usage
             WHERE customer_id = %s AND billing_period = %s
               AND source_topic = %s AND source_partition <> %s
            """,
            (customer_id, billing_period, topic, partition),
        ).fetchall()
    offsets = [offset for _, offset in found]
    return MeteredRead(
        [event for event, _ in found],
        min(offsets) if offsets else None,
        max(offsets) if offsets else None,
    )


def _subscription(
    event_type: str,
    customer_id: str,
    plan_code: str | None,
    plan_version: int | None,
    effective_at: datetime,
    reason: str | None,
) -> SubscriptionEvent:
    if event_type == SubscriptionEnded.event_type:
        return SubscriptionEnded(customer_id=customer_id, effective_at=effective_at, reason=reason)
    model = (
        SubscriptionStarted if event_type == SubscriptionStarted.event_type else SubscriptionChanged
    )
    return model(
        customer_id=customer_id,
        effective_at=effective_at,
        plan_code=plan_code,
        plan_version=plan_version,
    )


def subscriptions_before(
    conn: psycopg.Connection[Any], customer_id: str, topic: str, partition: int, before_offset: int
) -> list[SubscriptionEvent]:
    """The customer's subscription events read from ``topic[partition]`` before
    ``before_offset``, in partition order (any effective dates: segments order them)."""
    with conn.cursor(row_factory=args_row(_subscription)) as cur:
        return cur.execute(
            """
            SELECT event_type, customer_id, plan_code, plan_version, effective_at, reason
              FROM subscription_events
             WHERE customer_id = %s AND source_topic = %s AND source_partition = %s
               AND source_offset < %s
             ORDER BY source_offset
            """,
            (customer_id, topic, partition, before_offset),
        ).fetchall()


@dataclass(frozen=True)
class StoredSubscription:
    """A stored subscription event: its id, data and where it was read."""

    event_id: str
    data: SubscriptionEvent
    source: SourceCoordinates


def _stored_subscription(
    event_id: str,
    event_type: str,
    customer_id: str,
    plan_code: str | None,
    plan_version: int | None,
    effective_at: datetime,
    reason: str | None,
    source_topic: str,
    source_partition: int,
    source_offset: int,
) -> StoredSubscription:
    return StoredSubscription(
        event_id,
        _subscription(event_type, customer_id, plan_code, plan_version, effective_at, reason),
        SourceCoordinates(source_topic, source_partition, source_offset),
    )


def subscription_history(
    conn: psycopg.Connection[Any], topic: str, customer_ids: Sequence[str] | None = None
) -> dict[str, list[StoredSubscription]]:
    """customer → its subscription events read from ``topic`` (only ``customer_ids``'
    when given), in (partition, offset) order."""
    with conn.cursor(row_factory=args_row(_stored_subscription)) as cur:
        rows = cur.execute(
            """
            SELECT event_id, event_type, customer_id, plan_code, plan_version, effective_at,
                   reason, source_topic, source_partition, source_offset
              FROM subscription_events
             WHERE source_topic = %(topic)s
               AND (%(ids)s::text[] IS NULL OR customer_id = ANY(%(ids)s::text[]))
             ORDER BY customer_id, source_partition, source_offset
            """,
            {"topic": topic, "ids": None if customer_ids is None else list(customer_ids)},
        ).fetchall()
    history: dict[str, list[StoredSubscription]] = defaultdict(list)
    for row in rows:
        history[row.data.customer_id].append(row)
    return dict(history)


def customers_with_metered(
    conn: psycopg.Connection[Any], billing_period: str, topic: str
) -> set[str]:
    """Customers with a metered event of the period read from ``topic``."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return {
            str(customer)
            for customer in cur.execute(
                "SELECT DISTINCT customer_id FROM metered_usage "
                "WHERE billing_period = %s AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        }


def stored_metered_ids(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Event ids of the period in ``metered_usage`` read from ``topic``."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                "SELECT event_id FROM metered_usage WHERE billing_period = %s AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        )


def metered_below(
    conn: psycopg.Connection[Any], billing_period: str, topic: str, starts: Mapping[int, int]
) -> dict[str, int]:
    """customer → how many of its metered events of the period were read below
    ``starts[partition]`` (before a replay's window: the window cannot judge them)."""
    if not starts:
        return {}
    with conn.cursor() as cur:
        rows = cur.execute(
            """
            SELECT m.customer_id, count(*)
              FROM metered_usage m
              JOIN unnest(%s::int[], %s::bigint[]) AS w(partition, start)
                ON w.partition = m.source_partition
             WHERE m.billing_period = %s AND m.source_topic = %s AND m.source_offset < w.start
             GROUP BY m.customer_id
            """,
            (list(starts), list(starts.values()), billing_period, topic),
        ).fetchall()
    return {str(customer): int(count) for customer, count in rows}


@dataclass(frozen=True)
class LateMetered:
    """Metered events of a (customer, period) read at or after the close point of its
    issued revision: not rated into it; the next replay --apply rates them."""

    customer_id: str
    billing_period: str
    invoice_number: str
    events: int


def late_metered(conn: psycopg.Connection[Any], period: str | None = None) -> list[LateMetered]:
    """Per (customer, period) with an issued invoice, the metered events read on its
    partition at or after the revision's ``close_offset`` (late metered usage; the
    policy of late usage, docs/replay.md "Late usage")."""
    with conn.cursor(row_factory=class_row(LateMetered)) as cur:
        return cur.execute(
            """
            SELECT m.customer_id, m.billing_period, i.invoice_number, count(*)::int AS events
              FROM metered_usage m
              JOIN invoices i ON i.customer_id = m.customer_id
                             AND i.billing_period = m.billing_period
                             AND i.status = 'issued'
             WHERE (%(period)s::text IS NULL OR m.billing_period = %(period)s::text)
               AND m.source_topic = i.source_topic AND m.source_partition = i.source_partition
               AND m.source_offset >= i.close_offset
             GROUP BY m.customer_id, m.billing_period, i.invoice_number
             ORDER BY m.billing_period, m.customer_id
            """,
            {"period": period},
        ).fetchall()
