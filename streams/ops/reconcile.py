"""Outbox retention and reconciliation (DESIGN "Outbox retention and reconciliation").

Debezium delivers at least once, and a lost or recreated replication slot can
drop events without an error. So:

- outbox rows are kept for a retention period (default 30 days) and then
  deleted by :func:`prune_outbox` (``invoicing outbox prune``); the EventRouter
  ignores deletes, so pruning publishes nothing;
- :func:`reconcile` (``invoicing reconcile``) reads ``billing.invoices.v1`` from
  the beginning and reports every issued document (invoice revision or credit
  note) whose event never reached the topic, and every invoice revision with a
  non-zero total whose email was never sent (after a grace period); with
  ``republish=True`` it writes a **new** outbox row for each (new event id, same
  ``document_id`` and payload), which Debezium publishes; subscribers and the
  email sender deduplicate by document, so a republish sends no second email.

A republish needs the original payload: within retention it is copied from the
outbox; after pruning, an invoice's event is rebuilt from its stored rows
(:func:`streams.invoicing.jobs.invoice_issued` over the invoice and its lines).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from streams.adapters.kafka import record_of

#: CloudEvents ``source`` of republished events.
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
    """Delete outbox rows older than ``older_than``; returns how many."""
    cur = conn.execute("DELETE FROM outbox WHERE created_at < now() - %s", (older_than,))
    return cur.rowcount


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
    docs = conn.execute(
        """
        SELECT 'invoice.issued', invoice_id::text, invoice_number, customer_id FROM invoices
        UNION ALL
        SELECT 'credit_note.issued', credit_note_id::text, credit_note_number, customer_id FROM credit_notes
        """
    ).fetchall()
    report.documents = len(docs)
    for event_type, doc_id, number, _customer in docs:
        if doc_id not in seen:
            report.missing_events.append((event_type, doc_id, number))
    unsent = conn.execute(
        """
        SELECT i.invoice_id::text, i.invoice_number FROM invoices i
         WHERE i.total <> 0 AND i.issued_at < now() - %s
           AND NOT EXISTS (SELECT 1 FROM email_deliveries d
                            WHERE d.document_id = i.invoice_id AND d.status IN ('sent', 'skipped'))
        """,
        (email_grace,),
    ).fetchall()
    report.emails_not_sent = [(r[0], r[1]) for r in unsent]
    if republish:
        wanted = {doc_id for _, doc_id, _ in report.missing_events} | {
            doc for doc, _ in report.emails_not_sent
        }
        for doc_id in sorted(wanted):
            if _republish(conn, doc_id, topic):
                report.republished.append(doc_id)
            else:
                report.not_republishable.append(doc_id)
    return report


def _republish(conn: psycopg.Connection[Any], document_id: str, topic: str) -> bool:
    row = conn.execute(
        "SELECT aggregateid, type, payload FROM outbox WHERE document_id = %s ORDER BY created_at DESC LIMIT 1",
        (document_id,),
    ).fetchone()
    if row is None:
        rebuilt = _rebuild_invoice_event(conn, document_id)
        if rebuilt is None:
            return False
        row = rebuilt
    customer_id, event_type, payload = row
    now = datetime.now(UTC)
    conn.execute(
        """
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, ce_time, document_id)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            uuid.uuid4(),
            topic,
            customer_id,
            event_type,
            json.dumps(payload) if not isinstance(payload, str) else payload,
            SOURCE,
            now.isoformat().replace("+00:00", "Z"),
            document_id,
        ),
    )
    return True


def _rebuild_invoice_event(
    conn: psycopg.Connection[Any], invoice_id: str
) -> tuple[str, str, Any] | None:
    """The ``invoice.issued`` payload of a stored invoice, rebuilt from its rows (after pruning)."""
    from streams.domain.invoice import TaxedLine, UsageLine, compute_invoice
    from streams.invoicing import store
    from streams.invoicing.jobs import invoice_issued

    head = conn.execute(
        """
        SELECT customer_id, billing_period, revision, invoice_number, customer_name, email, currency,
               issued_at, supersedes_invoice_id::text, close_event_id, source_topic, source_partition,
               close_offset
          FROM invoices WHERE invoice_id = %s
        """,
        (invoice_id,),
    ).fetchone()
    if head is None:
        return None
    rows = conn.execute(
        """
        SELECT event_id, amount, quantity, unit, description, sku_id, region_id, tax_code, tax_rate, tax,
               source_topic, source_partition, source_offset
          FROM invoice_lines WHERE invoice_id = %s ORDER BY line_no
        """,
        (invoice_id,),
    ).fetchall()
    currency = head[6].strip()
    lines = [
        UsageLine(
            event_id=r[0],
            customer_id=head[0],
            billing_period=head[1],
            amount=r[1],
            currency=currency,
            quantity=r[2],
            unit=r[3],
            description=r[4],
            sku_id=r[5],
            region_id=r[6],
            charge_category=None,
            event_time=head[7],
            source_topic=r[10],
            source_partition=r[11],
            source_offset=r[12],
        )
        for r in rows
    ]
    taxed = [TaxedLine(line_id=r[0], tax_code=r[7], rate=r[8], tax=r[9]) for r in rows]
    totals = compute_invoice(lines, taxed, currency=currency)
    marker = store.CloseMarker(
        head[9],
        head[0],
        head[1],
        "period_closed",
        store.SourceCoordinates(head[10], head[11], head[12]),
    )
    draft = store.InvoiceDraft(
        invoice_id=invoice_id,
        revision=head[2],
        customer=store.Customer(head[0], head[4], head[5], currency),
        billing_period=head[1],
        totals=totals,
        lines=tuple(lines),
        taxed=tuple(taxed),
        marker=marker,
        supersedes_invoice_id=head[8],
    )
    event = invoice_issued(draft, head[3], head[7])
    return head[0], event.event_type, event.model_dump(mode="json")
