"""``invoicing status``: one view of what the pipeline is doing and what needs an operator.

Reads PostgreSQL (invoices, emails, holds — a dead-lettered record's or a rating
gap's, late usage and late metered usage, fences, outbox), Kafka
(consumer-group lag, dead-letter topic size) and Connect (the outbox
connector's state). Each part degrades to "unavailable: <reason>" rather than
failing the whole view.

The view opens what it reads through :class:`StatusSources`, which the
composition root builds (:func:`streams.bootstrap.status_sources`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg.rows import dict_row

from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS, ACCOUNT_EVENTS_DLQ, INVOICES, INVOICES_DLQ

#: Consumer group whose (never committed) offsets the topic-size probe uses.
PROBE_GROUP = "status-probe"


@dataclass(frozen=True)
class StatusSources:
    """Where the status view reads from; each call opens something the view closes.

    Attributes:
        database: a new autocommit connection of the read-only operator role (5 s connect timeout).
        consumer: group id → a consumer that reads that group's committed offsets
            and the watermarks, and never joins or commits
            (:func:`streams.adapters.kafka.make_reader`).
        connector: the outbox connector's status from Connect's REST API
            (:func:`streams.adapters.connect.connector_status`), None when absent.
    """

    database: Callable[[], psycopg.Connection[Any]]
    consumer: Callable[[str], Consumer]
    connector: Callable[[], dict[str, Any] | None]


@dataclass
class StatusView:
    """Everything ``invoicing status`` shows; each section is rows of (label, value) or a table."""

    periods: list[dict[str, Any]] = field(default_factory=list)
    holds: list[dict[str, Any]] = field(default_factory=list)
    #: open drafts (invoices in their grace period: no number, no event, no email yet)
    drafts: list[dict[str, Any]] = field(default_factory=list)
    late_usage: list[dict[str, Any]] = field(default_factory=list)
    #: metered events read after the close point of an issued revision (per customer, period)
    late_metered: list[dict[str, Any]] = field(default_factory=list)
    fences: list[dict[str, Any]] = field(default_factory=list)
    lag: dict[str, Any] = field(default_factory=dict)
    dead_letters: int | str = 0
    #: records of billing.invoices.v1 the email sender dead-lettered
    invoice_dead_letters: int | str = 0
    outbox: dict[str, Any] = field(default_factory=dict)
    connector: str = "unknown"
    problems: list[str] = field(default_factory=list)


def late_usage_summary(
    conn: psycopg.Connection[Any], period: str | None = None
) -> list[dict[str, Any]]:
    """Late usage per (customer, period): lines stored for an invoiced period that its
    issued revision lacks (:func:`streams.core.billing.store.usage.late_usage`); the next replay
    --apply invoices them."""
    from streams.core.billing.store.usage import late_usage

    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for line in late_usage(conn, period):
        row = groups.setdefault(
            (line.customer_id, line.billing_period),
            {
                "customer_id": line.customer_id,
                "billing_period": line.billing_period,
                "invoice": line.invoice_number,
                "lines": 0,
                "amount": 0,
                "after_close": 0,
            },
        )
        row["lines"] += 1
        row["amount"] += line.amount
        row["after_close"] += int(line.after_close)
    return list(groups.values())


def late_metered_summary(
    conn: psycopg.Connection[Any], period: str | None = None
) -> list[dict[str, Any]]:
    """Late metered usage per (customer, period): ``usage.metered`` events read after the
    close point of the issued revision (:func:`streams.core.billing.store.metering.late_metered`);
    the next replay --apply rates them."""
    from streams.core.billing.store.metering import late_metered

    return [
        {
            "customer_id": row.customer_id,
            "billing_period": row.billing_period,
            "invoice": row.invoice_number,
            "metered_events": row.events,
        }
        for row in late_metered(conn, period)
    ]


def _periods(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    rows = conn.execute(
        """
        WITH u AS (SELECT billing_period, count(*) AS lines FROM usage_lines GROUP BY billing_period),
             m AS (SELECT billing_period, count(*) AS events FROM metered_usage GROUP BY billing_period),
             k AS (SELECT billing_period, count(DISTINCT customer_id) AS customers
                     FROM (SELECT billing_period, customer_id FROM usage_lines
                           UNION ALL SELECT billing_period, customer_id FROM metered_usage) b
                    GROUP BY billing_period),
             i AS (SELECT billing_period,
                          count(*) FILTER (WHERE status = 'issued') AS issued,
                          count(*) FILTER (WHERE status = 'superseded') AS superseded,
                          count(*) FILTER (WHERE status = 'voided') AS voided,
                          sum(total) FILTER (WHERE status = 'issued') AS total
                     FROM invoices GROUP BY billing_period),
             c AS (SELECT billing_period, count(*) AS credit_notes FROM credit_notes GROUP BY billing_period),
             e AS (SELECT i.billing_period,
                          count(*) FILTER (WHERE d.status = 'sent') AS sent,
                          count(*) FILTER (WHERE d.status = 'skipped') AS skipped,
                          count(*) FILTER (WHERE d.status = 'sending') AS sending
                     FROM email_deliveries d JOIN invoices i ON i.invoice_id = d.document_id
                    GROUP BY i.billing_period)
        SELECT p.billing_period, coalesce(k.customers, 0), coalesce(u.lines, 0), coalesce(m.events, 0),
               coalesce(i.issued, 0), coalesce(i.superseded, 0), coalesce(i.voided, 0),
               coalesce(c.credit_notes, 0),
               coalesce(i.total, 0), coalesce(e.sent, 0), coalesce(e.skipped, 0), coalesce(e.sending, 0)
          FROM (SELECT billing_period FROM u UNION SELECT billing_period FROM m
                UNION SELECT billing_period FROM i) p
          LEFT JOIN u USING (billing_period) LEFT JOIN m USING (billing_period)
          LEFT JOIN k USING (billing_period) LEFT JOIN i USING (billing_period)
          LEFT JOIN c USING (billing_period) LEFT JOIN e USING (billing_period)
         ORDER BY 1
        """
    ).fetchall()
    keys = (
        "period",
        "customers",
        "usage_lines",
        "metered_events",
        "invoices",
        "superseded",
        "voided",
        "credit_notes",
        "total_issued",
        "emails_sent",
        "not_emailed_zero",
        "emails_in_flight",
    )
    return [dict(zip(keys, r, strict=True)) for r in rows]


def _open_holds(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [
            {
                **hold,
                "billing_period": hold["billing_period"] or "*",
                "reason": hold["reason"][:120],
            }
            for hold in cur.execute(
                "SELECT hold_id AS hold, customer_id, billing_period, reason, created_at AS since "
                "FROM invoice_holds WHERE released_at IS NULL ORDER BY hold_id"
            )
        ]


def open_drafts(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """The open drafts (docs/invoices.md "Drafts and finalisation"), soonest grace end
    first: invoice id, customer, period, total (``Decimal``), re-ratings, grace end (UTC)."""
    with conn.cursor(row_factory=dict_row) as cur:
        return list(
            cur.execute(
                "SELECT invoice_id::text AS draft, customer_id, billing_period, trim(currency) "
                "AS currency, total, rerated, grace_hours, grace_source, grace_ends_at "
                "FROM invoice_drafts WHERE status = 'draft' ORDER BY grace_ends_at, invoice_id"
            )
        )


def _fences(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return [
            {
                "group": fence["group"],
                "topic": fence["topic"],
                "partitions": fence["partitions"],
                "generations": f"{fence['lowest']}..{fence['highest']}",
                "members": fence["members"],
                "updated": fence["updated"],
            }
            for fence in cur.execute(
                'SELECT group_id AS "group", topic, count(*) AS partitions, '
                "min(generation) AS lowest, max(generation) AS highest, "
                "count(DISTINCT member_id) AS members, max(updated_at) AS updated "
                "FROM partition_fences GROUP BY 1, 2 ORDER BY 1, 2"
            )
        ]


def _outbox(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(
            "SELECT count(*) AS rows, min(created_at) AS oldest FROM outbox"
        ).fetchone()
    return found if found is not None else {"rows": 0, "oldest": None}


def group_lag(consumer: Consumer, topic: str) -> int:
    """Records of ``topic`` not yet committed by the group of ``consumer`` (its
    ``group.id``; a partition without a commit counts from its low watermark).

    Raises:
        KafkaException: the cluster did not answer within 5 s.
        KeyError: the topic does not exist.
    """
    parts = consumer.list_topics(topic, timeout=5).topics[topic].partitions
    committed = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=5)
    lag = 0
    for tp in committed:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=5)
        lag += max(0, high - (tp.offset if tp.offset >= 0 else low))
    return lag


def topic_size(consumer: Consumer, topic: str) -> int:
    """Records in ``topic`` (high minus low watermark, summed over its partitions).

    Raises:
        KafkaException: the cluster did not answer within 5 s.
        KeyError: the topic does not exist.
    """
    parts = consumer.list_topics(topic, timeout=5).topics[topic].partitions
    total = 0
    for p in parts:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
        total += high - low
    return total


def _lag(sources: StatusSources, group: str, topic: str) -> int:
    with contextlib.closing(sources.consumer(group)) as consumer:
        return group_lag(consumer, topic)


def _size(sources: StatusSources, topic: str) -> int:
    with contextlib.closing(sources.consumer(PROBE_GROUP)) as consumer:
        return topic_size(consumer, topic)


def collect(settings: Settings, sources: StatusSources) -> StatusView:
    """Gather the status view of ``settings``' groups and topics from ``sources``;
    failures of one source become a ``problems`` line."""
    view = StatusView()
    prefix = settings.kafka.topic_prefix
    try:
        with sources.database() as conn:
            view.periods = _periods(conn)
            view.holds = _open_holds(conn)
            view.drafts = open_drafts(conn)
            view.late_usage = late_usage_summary(conn)
            view.late_metered = late_metered_summary(conn)
            view.fences = _fences(conn)
            view.outbox = _outbox(conn)
    except psycopg.Error as exc:
        view.problems.append(f"database unavailable: {exc}")
    try:
        view.lag = {
            settings.worker.invoicing_group: _lag(
                sources, settings.worker.invoicing_group, ACCOUNT_EVENTS.with_prefix(prefix).name
            ),
            settings.worker.email_group: _lag(
                sources, settings.worker.email_group, INVOICES.with_prefix(prefix).name
            ),
        }
        view.dead_letters = _size(sources, ACCOUNT_EVENTS_DLQ.with_prefix(prefix).name)
        view.invoice_dead_letters = _size(sources, INVOICES_DLQ.with_prefix(prefix).name)
    except (KafkaException, KeyError) as exc:
        view.problems.append(f"kafka unavailable: {exc}")
    try:
        status = sources.connector()
        view.connector = (
            "absent"
            if status is None
            else status["connector"]["state"]
            + " / tasks "
            + ",".join(t["state"] for t in status.get("tasks", []))
        )
    except Exception as exc:  # httpx errors, JSON shape: the view shows the reason
        view.problems.append(f"connect unavailable: {exc}")
    if view.holds:
        view.problems.append(f"{len(view.holds)} open hold(s): invoices not built until released")
    if view.late_usage:
        view.problems.append(
            f"{len(view.late_usage)} (customer, period) with late usage: run replay"
        )
    if view.late_metered:
        view.problems.append(
            f"{len(view.late_metered)} (customer, period) with late metered usage: run replay"
        )
    if isinstance(view.dead_letters, int) and view.dead_letters:
        view.problems.append(f"{view.dead_letters} record(s) in the dead-letter topic")
    if isinstance(view.invoice_dead_letters, int) and view.invoice_dead_letters:
        view.problems.append(
            f"{view.invoice_dead_letters} invoice event(s) the email sender dead-lettered "
            "(billing.invoices.dlq.v1): no email was sent for them"
        )
    return view
