"""Outbox retention and reconciliation (docs/design.md "Outbox retention and reconciliation").

Debezium delivers at least once, and a lost or recreated replication slot can
drop events without an error. So:

- outbox rows are kept for a retention period (default 30 days, at least 7) and
  then deleted by :func:`prune_outbox` (``invoicing outbox prune``, through the
  owner's ``prune_outbox()`` function: no runtime role may delete outbox rows); the
  EventRouter ignores deletes, so pruning publishes nothing;
- :func:`reconcile` (``invoicing reconcile``) reads ``billing.invoices.v1`` from
  the beginning and reports every issued document (invoice revision or credit
  note) whose event never reached the topic, and every invoice revision with a
  non-zero total whose email was never sent (after a grace period); with
  ``republish=True`` it writes a **new** outbox row for each (new event id, same
  ``document_id``, topic and payload), which Debezium publishes; subscribers and the
  email sender deduplicate by document, so a republish sends no second email.

A republish copies the document's newest kept outbox row through the owner's
``republish_document()`` function (migration 0022; the admin role may not insert outbox
rows): within retention it succeeds; a document whose rows were all pruned is reported
as not republishable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition
from psycopg.rows import scalar_row

from streams.adapters.kafka import record_of
from streams.core.billing import store

#: CloudEvents ``source`` of republished events (set by ``republish_document()``, migration 0022).
SOURCE = "/ops/reconcile"


@dataclass
class ReconcileReport:
    """What reconciliation found (and republished)."""

    documents: int = 0
    events_on_topic: int = 0
    missing_events: list[tuple[str, str, str]] = field(
        default_factory=list
    )  # (type, document id, number)
    emails_not_sent: list[tuple[str, str]] = field(default_factory=list)  # (invoice id, number)
    republished: list[str] = field(default_factory=list)
    not_republishable: list[str] = field(default_factory=list)


def prune_outbox(conn: psycopg.Connection[Any], older_than: timedelta) -> int:
    """Delete outbox rows older than ``older_than``; returns how many.

    Through ``prune_outbox(interval)`` (migration 0006): a ``SECURITY DEFINER`` function
    of the owner, so the caller (the admin role) needs ``EXECUTE`` on it and no
    ``DELETE`` on the outbox.

    Raises:
        psycopg.errors.InsufficientPrivilege: ``older_than`` is below the floor
            (:data:`streams.adapters.postgres.grants.OUTBOX_PRUNE_FLOOR_DAYS`), or the role may not prune.
    """
    with conn.cursor(row_factory=scalar_row) as cur:
        deleted = cur.execute("SELECT prune_outbox(%s)", (older_than,)).fetchone()
    return int(deleted or 0)


def documents_on_topic(consumer: Consumer, topic: str, timeout_s: float = 60.0) -> dict[str, int]:
    """``document_id`` header → number of events on ``topic`` (read to the end offsets at start).

    ``consumer`` joins no group (it assigns the partitions itself; ``read_committed``:
    :func:`streams.bootstrap.topic_reader`); it is closed at the end.

    Raises:
        TimeoutError: the topic was not read to its end offsets within ``timeout_s``.
    """
    counts: dict[str, int] = {}
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends: dict[int, int] = {}
        assign = []
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
                assign.append(TopicPartition(topic, p, low))
        consumer.assign(assign)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            partition, offset = msg.partition(), msg.offset()
            for name, value in record_of(msg).headers:
                if name == "document_id" and value:
                    doc = value.decode()
                    counts[doc] = counts.get(doc, 0) + 1
            if (
                partition is not None
                and offset is not None
                and offset + 1 >= ends.get(partition, 0)
            ):
                ends.pop(partition, None)
        if ends:
            raise TimeoutError(f"{topic} not read to its end within {timeout_s}s: {ends}")
    finally:
        consumer.close()
    return counts


def reconcile(
    conn: psycopg.Connection[Any],
    reader: Callable[[], Consumer],
    topic: str,
    *,
    republish: bool = False,
    email_grace: timedelta = timedelta(minutes=10),
) -> ReconcileReport:
    """Find issued documents without an event on ``topic`` (the invoices topic) and invoices
    without an email; with ``republish``, write a new outbox row for each.

    ``reader`` builds the consumer that reads ``topic`` (:func:`documents_on_topic`);
    ``conn`` is in autocommit mode.
    """
    seen = documents_on_topic(reader(), topic)
    report = ReconcileReport(events_on_topic=sum(seen.values()))
    docs = store.invoices.documents(conn)
    report.documents = len(docs)
    for doc in docs:
        if doc.document_id not in seen:
            report.missing_events.append((doc.event_type, doc.document_id, doc.number))
    report.emails_not_sent = [
        (unsent.invoice_id, unsent.invoice_number)
        for unsent in store.invoices.invoices_without_email(conn, email_grace)
    ]
    if republish:
        wanted = {doc_id for _, doc_id, _ in report.missing_events} | {
            doc for doc, _ in report.emails_not_sent
        }
        for doc_id in sorted(wanted):
            if _republish(conn, doc_id):
                report.republished.append(doc_id)
            else:
                report.not_republishable.append(doc_id)
    return report


def _republish(conn: psycopg.Connection[Any], document_id: str) -> bool:
    """Copy ``document_id``'s newest kept outbox row into a new one (fresh id, same topic,
    key, type and payload) through ``republish_document(uuid)`` (migration 0022), a
    ``SECURITY DEFINER`` function of the owner: the admin role has no ``INSERT`` on the
    outbox, and the payload is what the database holds, never the caller's. False when no
    row of the document is kept (pruned).

    Raises:
        psycopg.errors.InsufficientPrivilege: the role may not republish.
    """
    with conn.cursor(row_factory=scalar_row) as cur:
        new_id = cur.execute("SELECT republish_document(%s)", (document_id,)).fetchone()
    return new_id is not None
