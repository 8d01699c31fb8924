"""Outbox retention and reconciliation (DESIGN "Outbox retention and reconciliation").

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
  ``document_id`` and payload), which Debezium publishes; subscribers and the
  email sender deduplicate by document, so a republish sends no second email.

A republish needs the original payload: within retention it is copied from the
outbox; after pruning, an invoice's event is rebuilt from its stored rows
(:func:`streams.billing.issuance.invoice_issued` over the invoice and its lines;
a rated invoice's charge lines from ``invoice_charges`` and its rating summary
from ``invoices.rating``).
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
from psycopg.rows import scalar_row

from streams.adapters.kafka import record_of
from streams.billing import rows, store
from streams.billing.issuance import invoice_issued
from streams.domain.events import SourceRange
from streams.domain.invoice import PricedInvoice, TaxedLine, UsageLine, apply_tax, compute_invoice
from streams.domain.money import round_money
from streams.domain.rating.priced import largest_lines

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
    """Delete outbox rows older than ``older_than``; returns how many.

    Through ``prune_outbox(interval)`` (migration 0006): a ``SECURITY DEFINER`` function
    of the owner, so the caller (the admin role) needs ``EXECUTE`` on it and no
    ``DELETE`` on the outbox.

    Raises:
        psycopg.errors.InsufficientPrivilege: ``older_than`` is below the floor
            (:data:`streams.grants.OUTBOX_PRUNE_FLOOR_DAYS`), or the role may not prune.
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
            if _republish(conn, doc_id, topic):
                report.republished.append(doc_id)
            else:
                report.not_republishable.append(doc_id)
    return report


def _republish(conn: psycopg.Connection[Any], document_id: str, topic: str) -> bool:
    found = store.invoices.latest_outbox_event(conn, document_id)
    if found is None:
        found = _rebuild_invoice_event(conn, document_id)
        if found is None:
            return False
    payload = found.payload
    store.invoices.insert_outbox_row(
        conn,
        event_id=str(uuid.uuid4()),
        topic=topic,
        customer_id=found.customer_id,
        event_type=found.event_type,
        payload=json.dumps(payload) if not isinstance(payload, str) else payload,
        source=SOURCE,
        time=datetime.now(UTC),
        document_id=document_id,
    )
    return True


def _rebuild_invoice_event(
    conn: psycopg.Connection[Any], invoice_id: str
) -> store.invoices.OutboxEvent | None:
    """The ``invoice.issued`` payload of a stored invoice, rebuilt from its rows (after pruning)."""
    head = store.invoices.stored_invoice(conn, invoice_id)
    if head is None:
        return None
    stored = store.invoices.stored_invoice_lines(conn, invoice_id)
    currency = head.currency
    lines = [
        UsageLine(
            event_id=line.event_id,
            customer_id=head.customer_id,
            billing_period=head.billing_period,
            amount=line.amount,
            currency=currency,
            quantity=line.quantity,
            unit=line.unit,
            description=line.description,
            sku_id=line.sku_id,
            region_id=line.region_id,
            charge_category=None,
            event_time=head.issued_at,
            source_topic=line.source_topic,
            source_partition=line.source_partition,
            source_offset=line.source_offset,
        )
        for line in stored
    ]
    taxed = [
        TaxedLine(line_id=line.event_id, tax_code=line.tax_code, rate=line.tax_rate, tax=line.tax)
        for line in stored
    ]
    rating = store.invoices.stored_rating(conn, invoice_id)
    if rating is None:
        totals = compute_invoice(lines, taxed, currency=currency)
    else:  # a rated invoice: its charge lines and rating summary too
        charges = store.invoices.stored_charges(conn, invoice_id)
        taxed += [
            TaxedLine(line_id=c.detail.line_id, tax_code=c.tax_code, rate=c.tax_rate, tax=c.tax)
            for c in charges
        ]
        first, last = store.invoices.stored_offsets(conn, invoice_id)
        summaries = tuple(c.detail for c in charges)
        priced = PricedInvoice(
            currency=currency,
            lines=tuple(lines),
            subtotal=round_money(rating.exact_total, currency),
            largest_lines=largest_lines(summaries, lines),
            source=()
            if first is None or last is None
            else (
                SourceRange(
                    topic=head.source_topic,
                    partition=head.source_partition,
                    first_offset=first,
                    last_offset=last,
                ),
            ),
            charges=summaries,
            rating=rating,
        )
        totals = apply_tax(priced, taxed)
    marker = rows.CloseMarker(
        head.close_event_id,
        head.customer_id,
        head.billing_period,
        "period_closed",
        rows.SourceCoordinates(head.source_topic, head.source_partition, head.close_offset),
    )
    draft = rows.InvoiceDraft(
        invoice_id=invoice_id,
        revision=head.revision,
        customer=rows.Customer(head.customer_id, head.customer_name, head.email, currency),
        billing_period=head.billing_period,
        totals=totals,
        lines=tuple(lines),
        taxed=tuple(taxed),
        marker=marker,
        supersedes_invoice_id=head.supersedes_invoice_id,
    )
    event = invoice_issued(draft, head.invoice_number, head.issued_at)
    return store.invoices.OutboxEvent(
        head.customer_id, event.event_type, event.model_dump(mode="json")
    )
