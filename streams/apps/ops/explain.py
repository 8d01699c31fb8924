"""``invoicing explain ID``: where an issued document came from and what became of it
(docs/operations.md, "Explaining a document"; invariant 6 of docs/architecture.md made
visible).

For an invoice revision (its id or its number):

* every line with the event it came from: event id and (topic, partition, offset) of
  ``invoice_lines``; a rated invoice's charge lines with the offset range of the
  partition they were rated from;
* who wrote it: the partition fence token (consumer group, generation, member id), the
  close marker (event id and coordinates) and the lease fencing number the marker
  carried; the close request (``close_requests``: its lease fencing number and time);
* the tax document: the idempotency key the tax service knows it by
  (``<invoice id>:r<revision>``; requests of more than 1,000 lines are sent as
  ``<key>:0``, ``<key>:1``, …) and the number of requests;
* the outbox rows that announced it (ids = CloudEvents ids; rows older than the
  retention are pruned, which the report says);
* its emails: Message-ID, status, attempts, time sent or why it was not sent;
* what supersedes it: newer revisions and credit notes (and the revision it replaced);
  its void, when it was voided: the reason, who and when (``invoice_voids``,
  docs/invoices.md "Void").

For a credit note: the credit note, the invoice revision it credits, its outbox rows and
its email.

Reads as the read-only ``operator`` role (no contact data: no names, no addresses, no
outbox payloads). :func:`explain` returns plain data; the command prints tables or JSON.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import dict_row

from streams.adapters.tax.wire import MAX_LINES_PER_REQUEST
from streams.core.billing.issuance import tax_idempotency_key
from streams.errors import InvoicingError

__all__ = ["Lineage", "NotFound", "explain"]


class NotFound(InvoicingError):
    """No invoice revision or credit note has that id or number."""


@dataclass
class Lineage:
    """What :func:`explain` found; every field is JSON-ready (money as ``Decimal``, times
    as UTC ``datetime``, shown by the command as strings)."""

    kind: str
    document: dict[str, Any]
    written_by: dict[str, Any] = field(default_factory=dict)
    close_request: dict[str, Any] | None = None
    tax_document: dict[str, Any] | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    charges: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    emails: list[dict[str, Any]] = field(default_factory=list)
    supersedes: list[dict[str, Any]] = field(default_factory=list)
    superseded_by: list[dict[str, Any]] = field(default_factory=list)
    void: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        """The lineage with money and times as strings."""

        def plain(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, list):
                return [plain(v) for v in value]
            if isinstance(value, Decimal):
                return str(value)
            if isinstance(value, datetime):
                return value.isoformat().replace("+00:00", "Z")
            return value

        result: dict[str, Any] = plain(asdict(self))
        return result


def _rows(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(sql, params).fetchall())


def _find(conn: psycopg.Connection[Any], key: str) -> tuple[str, str]:
    """``(kind, id)`` of the document whose id or number is ``key``."""
    try:
        as_uuid: str | None = str(uuid.UUID(key))
    except ValueError:
        as_uuid = None
    found = _rows(
        conn,
        """
        SELECT 'invoice' AS kind, invoice_id::text AS id FROM invoices
         WHERE invoice_id::text = %(id)s OR invoice_number = %(key)s
        UNION ALL
        SELECT 'credit_note', credit_note_id::text FROM credit_notes
         WHERE credit_note_id::text = %(id)s OR credit_note_number = %(key)s
        """,
        {"id": as_uuid, "key": key},
    )
    if not found:
        raise NotFound(f"no invoice revision or credit note has the id or number {key!r}")
    return str(found[0]["kind"]), str(found[0]["id"])


def _outbox_and_emails(conn: psycopg.Connection[Any], lineage: Lineage, document_id: str) -> None:
    lineage.outbox = _rows(
        conn,
        "SELECT id::text AS outbox_id, type, created_at FROM outbox "
        "WHERE document_id = %(id)s ORDER BY created_at",
        {"id": document_id},
    )
    lineage.emails = _rows(
        conn,
        """
        SELECT message_id, status, attempts, event_id AS outbox_event_id, sent_at,
               skip_reason, source_topic, source_partition, source_offset
          FROM email_deliveries WHERE document_id = %(id)s ORDER BY claimed_at
        """,
        {"id": document_id},
    )
    if not lineage.outbox:
        lineage.notes.append(
            "no outbox row kept: pruned after the retention (invoicing outbox prune), "
            "or never written"
        )
    if not lineage.emails:
        lineage.notes.append("no email delivery recorded (not yet sent, or never consumed)")


def _invoice(conn: psycopg.Connection[Any], invoice_id: str) -> Lineage:
    (head,) = _rows(
        conn,
        """
        SELECT invoice_id::text, invoice_number, revision, status, customer_id, billing_period,
               trim(currency) AS currency, line_count, subtotal, tax_total, total, issued_at,
               close_event_id, source_topic, source_partition, first_offset, last_offset,
               close_offset, fence_group, fence_generation, fence_member, lease_fencing_token,
               supersedes_invoice_id::text, rating IS NOT NULL AS rated,
               (rating ->> 'metered_events')::bigint AS metered_events
          FROM invoices WHERE invoice_id = %(id)s
        """,
        {"id": invoice_id},
    )
    lineage = Lineage(
        kind="invoice",
        document={
            k: head[k]
            for k in (
                "invoice_id",
                "invoice_number",
                "revision",
                "status",
                "customer_id",
                "billing_period",
                "currency",
                "line_count",
                "subtotal",
                "tax_total",
                "total",
                "issued_at",
            )
        },
        written_by={
            "fence_group": head["fence_group"],
            "fence_generation": head["fence_generation"],
            "fence_member": head["fence_member"],
            "close_event_id": head["close_event_id"],
            "close_marker": {
                "topic": head["source_topic"],
                "partition": head["source_partition"],
                "offset": head["close_offset"],
            },
            "lease_fencing_token": head["lease_fencing_token"],
            "usage_offsets": {"first": head["first_offset"], "last": head["last_offset"]},
        },
    )
    if head["fence_group"] is None:
        lineage.notes.append(
            "written under the replay's lease fence, not a partition fence "
            "(a corrected revision of invoicing replay --apply)"
        )
    requests = _rows(
        conn,
        "SELECT event_id, lease_fencing_token, requested_at FROM close_requests "
        "WHERE customer_id = %(c)s AND billing_period = %(p)s",
        {"c": head["customer_id"], "p": head["billing_period"]},
    )
    lineage.close_request = requests[0] if requests else None
    lineage.lines = _rows(
        conn,
        """
        SELECT line_no, event_id, source_topic AS topic, source_partition AS partition,
               source_offset AS offset, amount, tax_code, tax
          FROM invoice_lines WHERE invoice_id = %(id)s ORDER BY line_no
        """,
        {"id": invoice_id},
    )
    lineage.charges = _rows(
        conn,
        """
        SELECT line_no, line_id::text, plan_code, plan_version, charge_code, amount, tax_code, tax
          FROM invoice_charges WHERE invoice_id = %(id)s ORDER BY line_no
        """,
        {"id": invoice_id},
    )
    if lineage.charges:
        lineage.notes.append(
            f"rated charges aggregate {head['metered_events'] or 0} metered event(s) of "
            f"{head['source_topic']}[{head['source_partition']}] offsets "
            f"{head['first_offset']}..{head['last_offset']} (before the close marker)"
        )
    taxed_lines = len(lineage.lines) + len(lineage.charges)
    key = tax_idempotency_key(head["invoice_id"], head["revision"])
    lineage.tax_document = {
        "idempotency_key": key,
        "requests": max(1, math.ceil(taxed_lines / MAX_LINES_PER_REQUEST)),
        "request_keys": f"{key}:0 .. {key}:{max(0, math.ceil(taxed_lines / MAX_LINES_PER_REQUEST) - 1)}",
    }
    _outbox_and_emails(conn, lineage, invoice_id)
    if head["supersedes_invoice_id"]:
        lineage.supersedes = _rows(
            conn,
            "SELECT 'invoice' AS kind, invoice_id::text AS id, invoice_number AS number, "
            "revision, status, issued_at FROM invoices WHERE invoice_id = %(id)s",
            {"id": head["supersedes_invoice_id"]},
        )
    lineage.superseded_by = _rows(
        conn,
        """
        SELECT 'credit_note' AS kind, credit_note_id::text AS id, credit_note_number AS number,
               NULL::integer AS revision, 'issued' AS status, issued_at, total
          FROM credit_notes WHERE invoice_id = %(id)s
        UNION ALL
        SELECT 'invoice', invoice_id::text, invoice_number, revision, status, issued_at, total
          FROM invoices WHERE supersedes_invoice_id = %(id)s
         ORDER BY issued_at, number
        """,
        {"id": invoice_id},
    )
    voids = _rows(
        conn,
        "SELECT reason, voided_by, voided_at, outbox_id::text FROM invoice_voids "
        "WHERE invoice_id = %(id)s",
        {"id": invoice_id},
    )
    lineage.void = voids[0] if voids else None
    return lineage


def _credit_note(conn: psycopg.Connection[Any], credit_note_id: str) -> Lineage:
    (head,) = _rows(
        conn,
        """
        SELECT c.credit_note_id::text, c.credit_note_number, c.customer_id, c.billing_period,
               trim(c.currency) AS currency, c.subtotal, c.tax_total, c.total, c.reason,
               c.issued_at, c.invoice_id::text AS credited_invoice_id,
               i.invoice_number AS credited_invoice_number, i.revision AS credited_revision
          FROM credit_notes c JOIN invoices i ON i.invoice_id = c.invoice_id
         WHERE c.credit_note_id = %(id)s
        """,
        {"id": credit_note_id},
    )
    lineage = Lineage(kind="credit_note", document=dict(head))
    lineage.supersedes = [
        {
            "kind": "invoice",
            "id": head["credited_invoice_id"],
            "number": head["credited_invoice_number"],
            "revision": head["credited_revision"],
        }
    ]
    _outbox_and_emails(conn, lineage, credit_note_id)
    return lineage


def explain(conn: psycopg.Connection[Any], key: str) -> Lineage:
    """The lineage of the invoice revision or credit note whose id or number is ``key``.

    Raises:
        NotFound: no document has that id or number.
        psycopg.Error: the database failed.
    """
    kind, document_id = _find(conn, key)
    return _invoice(conn, document_id) if kind == "invoice" else _credit_note(conn, document_id)
