"""``invoicing invoice finalize ID`` and ``invoicing invoice show ID`` (docs/invoices.md
"Drafts and finalisation").

The command never writes the invoice: only the invoicing worker that owns the
customer's partition writes its documents. It checks (read-only) that ID is an open
draft, then produces the draft's finalisation marker
(:func:`streams.core.domain.drafts.finalize_marker`) with the customer id as its key:
it reaches the owner on the customer's partition behind the usage already there, and
the owner numbers, issues, writes the outbox row and records the finalisation in one
fenced transaction. With ``wait_s`` the command then waits for the draft to be
finalised and returns the number.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg.rows import dict_row

from streams.core.billing.rows import Draft
from streams.core.billing.store import drafts
from streams.core.domain.codec import encode
from streams.core.domain.drafts import finalize_marker
from streams.errors import InvoicingError

__all__ = ["FinalizeError", "Finalized", "finalize_draft", "show_document"]

#: CloudEvents ``source`` of the markers the command produces.
SOURCE = "/ops/finalize"


class FinalizeError(InvoicingError):
    """The finalisation was refused (not a draft, unknown, already finalised) or its
    marker was not delivered; the message says which."""


@dataclass(frozen=True)
class Finalized:
    """What ``finalize`` did: the draft, the marker's event id, and — when it waited and
    the owner finalised it in time — the issued number (else None)."""

    draft: Draft
    marker_id: str
    invoice_number: str | None


def _issued(conn: psycopg.Connection[Any], ident: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT invoice_id::text AS invoice_id, invoice_number, revision, status, "
            "customer_id, billing_period, trim(currency) AS currency, line_count, subtotal, "
            "tax_total, total, issued_at FROM invoices "
            "WHERE invoice_id::text = %s OR invoice_number = %s ORDER BY revision DESC LIMIT 1",
            (ident, ident),
        ).fetchone()


def _open_draft_of(conn: psycopg.Connection[Any], ident: str) -> Draft:
    """The open draft ``ident`` names, or :class:`FinalizeError` saying what it is."""
    found = drafts.find_draft(conn, ident)
    if found is not None and found.status == "draft":
        return found
    if found is not None:
        raise FinalizeError(
            f"invoice {ident} is no draft any more: it was finalised as "
            f"{found.invoice_number} at {found.finalized_at}; nothing to finalize"
        )
    issued = _issued(conn, ident)
    if issued is not None:
        raise FinalizeError(
            f"invoice {issued['invoice_number']} ({issued['invoice_id']}) is "
            f"{issued['status']}, not a draft: only a draft can be finalized"
        )
    raise FinalizeError(f"no draft or invoice {ident!r} (give a draft's invoice id)")


def finalize_draft(
    conn: psycopg.Connection[Any],
    producer: Producer,
    topic: str,
    ident: str,
    *,
    wait_s: float = 0.0,
    delivery_timeout_s: float = 30.0,
) -> Finalized:
    """Ask the owner of the draft ``ident`` (its invoice id) to finalise it now.

    Args:
        conn: a connection that may read ``invoice_drafts`` and ``invoices`` (the admin
            role), autocommit.
        producer: a murmur2 producer (the customer's key puts the marker on its partition).
        topic: the account-events topic (prefixed).
        wait_s: how long to wait for the finalisation (seconds, 0: do not wait).
        delivery_timeout_s: how long to wait for the broker's confirmation (seconds).

    Raises:
        FinalizeError: not an open draft (issued, superseded, voided, finalised, unknown),
            or the marker was not delivered.
    """
    draft = _open_draft_of(conn, ident)
    envelope = finalize_marker(
        draft.customer_id,
        draft.billing_period,
        draft.invoice_id,
        at=datetime.now(UTC),
        source=SOURCE,
    )
    record = encode(envelope)
    errors: list[str] = []
    producer.produce(
        topic,
        key=record.key,
        value=record.value,
        headers=[(name, value) for name, value in record.headers],
        on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
    )
    if producer.flush(delivery_timeout_s) or errors:
        raise FinalizeError(
            f"the finalisation marker of {draft.invoice_id} was not delivered "
            f"({errors or 'timeout'}): run the command again"
        )
    number: str | None = None
    deadline = time.monotonic() + wait_s
    while wait_s > 0 and time.monotonic() < deadline:
        now = drafts.find_draft(conn, draft.invoice_id)
        if now is not None and now.status == "finalized":
            number = now.invoice_number
            break
        time.sleep(0.2)
    return Finalized(draft, envelope.id, number)


def show_document(conn: psycopg.Connection[Any], ident: str) -> dict[str, Any]:
    """What ``invoice show`` prints: the issued invoice ``ident`` names (id or number;
    the highest revision), else its draft. ``status`` is ``draft`` for an open draft
    (``invoice_number`` None, ``grace_ends_at`` UTC), else the invoice's status. Money is
    ``Decimal``.

    Raises:
        FinalizeError: neither an invoice nor a draft.
    """
    issued = _issued(conn, ident)
    if issued is not None:
        draft = drafts.find_draft(conn, issued["invoice_id"])
        if draft is not None:
            issued["drafted_at"] = draft.created_at
            issued["finalized_at"] = draft.finalized_at
        return issued
    draft = drafts.find_draft(conn, ident)
    if draft is None:
        raise FinalizeError(f"no draft or invoice {ident!r}")
    return {
        "invoice_id": draft.invoice_id,
        "invoice_number": None,
        "revision": draft.revision,
        "status": draft.status,
        "customer_id": draft.customer_id,
        "billing_period": draft.billing_period,
        "currency": draft.currency,
        "line_count": draft.line_count,
        "subtotal": draft.subtotal,
        "tax_total": draft.tax_total,
        "total": draft.total,
        "grace_hours": draft.grace_hours,
        "grace_source": draft.grace_source,
        "grace_ends_at": draft.grace_ends_at,
        "rerated": draft.rerated,
        "drafted_at": draft.created_at,
    }
