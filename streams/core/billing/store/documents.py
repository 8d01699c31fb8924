"""Issued documents read back whole, for the PDF, the hosted page and ``invoicing explain``.

:func:`load_document` builds the :class:`~streams.core.domain.documents.Document` of an
invoice revision or a credit note from its stored rows: the head (``invoices`` /
``credit_notes``), **every** line (``invoice_lines`` for a pre-priced invoice; the charge
lines of ``invoice_charges`` and the rating summary for a rated one). The rows of an
issued document never change (migration 0006's triggers), so the document, and its PDF,
is the same whenever and by whichever process it is read.

:func:`document_state` is what may change: the status of an invoice revision and the
documents that supersede it (newer revisions, credit notes), for the hosted page.

Reads only; every function runs in the caller's transaction. Columns read (the grants of
the email sender's and the portal's roles, ``streams/adapters/postgres/grants.py``):
``invoices`` (:data:`INVOICE_COLUMNS`), ``invoice_lines`` (:data:`LINE_COLUMNS`),
``invoice_charges`` (``detail``), ``credit_notes`` (:data:`CREDIT_NOTE_COLUMNS`),
``credit_note_lines`` (:data:`CREDIT_NOTE_LINE_COLUMNS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Final

import psycopg
from psycopg.rows import class_row, scalar_row

from streams.core.domain.documents import (
    Document,
    DocumentKind,
    DocumentLine,
    LineGroup,
    credited_line,
    rated_groups,
    taxes_of,
)
from streams.core.domain.events import ChargeSummary, RatingSummary, TaxAmount
from streams.core.domain.formatting import oneline

__all__ = [
    "CREDIT_NOTE_COLUMNS",
    "CREDIT_NOTE_LINE_COLUMNS",
    "INVOICE_COLUMNS",
    "LINE_COLUMNS",
    "DocumentState",
    "Supersession",
    "document_state",
    "invoice_recipient",
    "load_document",
]

#: The ``invoices`` columns a document is built from.
INVOICE_COLUMNS: Final = (
    "invoice_id",
    "invoice_number",
    "revision",
    "status",
    "customer_id",
    "customer_name",
    "billing_period",
    "currency",
    "issued_at",
    "subtotal",
    "tax_total",
    "total",
    "taxes",
    "line_count",
    "rating",
    "supersedes_invoice_id",
)
#: The ``invoice_lines`` columns a pre-priced invoice's lines are built from.
LINE_COLUMNS: Final = (
    "invoice_id",
    "line_no",
    "event_id",
    "amount",
    "quantity",
    "unit",
    "description",
    "sku_id",
)
#: The ``credit_notes`` columns a credit note is built from.
CREDIT_NOTE_COLUMNS: Final = (
    "credit_note_id",
    "credit_note_number",
    "invoice_id",
    "customer_id",
    "billing_period",
    "currency",
    "subtotal",
    "tax_total",
    "total",
    "reason",
    "issued_at",
)
#: The ``credit_note_lines`` columns a partial credit note's lines are built from.
CREDIT_NOTE_LINE_COLUMNS: Final = ("credit_note_id", "invoice_id", "line_no", "amount", "tax")


@dataclass(frozen=True)
class _InvoiceHead:
    invoice_id: str
    invoice_number: str
    revision: int
    status: str
    customer_id: str
    customer_name: str
    billing_period: str
    currency: str
    issued_at: datetime
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    taxes: Any
    line_count: int
    rating: Any
    supersedes_invoice_id: str | None


@dataclass(frozen=True)
class _CreditHead:
    credit_note_id: str
    credit_note_number: str
    invoice_id: str
    invoice_number: str
    revision: int
    customer_id: str
    customer_name: str
    billing_period: str
    currency: str
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    reason: str
    issued_at: datetime


@dataclass(frozen=True)
class _CreditedLine:
    line_no: int
    amount: Decimal
    tax: Decimal
    description: str | None
    sku_id: str | None
    event_id: str


@dataclass(frozen=True)
class _Line:
    amount: Decimal
    quantity: Decimal | None
    unit: str | None
    description: str | None
    sku_id: str | None
    event_id: str


def _invoice(conn: psycopg.Connection[Any], invoice_id: str) -> Document | None:
    with conn.cursor(row_factory=class_row(_InvoiceHead)) as cur:
        head = cur.execute(
            """
            SELECT invoice_id::text, invoice_number, revision, status, customer_id,
                   customer_name, billing_period, trim(currency) AS currency, issued_at,
                   subtotal, tax_total, total, taxes, line_count, rating,
                   supersedes_invoice_id::text
              FROM invoices WHERE invoice_id = %s
            """,
            (invoice_id,),
        ).fetchone()
    if head is None:
        return None
    rating = None if head.rating is None else RatingSummary.model_validate(head.rating)
    if rating is not None:
        with conn.cursor(row_factory=scalar_row) as cur:
            details = cur.execute(
                "SELECT detail FROM invoice_charges WHERE invoice_id = %s ORDER BY line_no",
                (invoice_id,),
            ).fetchall()
        charges = [ChargeSummary.model_validate(detail) for detail in details]
        groups = rated_groups(charges, rating, head.currency)
    else:
        with conn.cursor(row_factory=class_row(_Line)) as cur:
            rows = cur.execute(
                """
                SELECT amount, quantity, unit, description, sku_id, event_id
                  FROM invoice_lines WHERE invoice_id = %s ORDER BY line_no
                """,
                (invoice_id,),
            ).fetchall()
        lines = tuple(
            DocumentLine(
                # the description rule of the invoice event (core/domain/invoice.py)
                oneline(row.description or row.sku_id or row.event_id),
                row.amount,
                row.quantity,
                row.unit,
            )
            for row in rows
        )
        groups = (LineGroup(None, lines),) if lines else ()
    return Document(
        kind="invoice",
        document_id=head.invoice_id,
        number=oneline(head.invoice_number),
        customer_id=head.customer_id,
        customer_name=oneline(head.customer_name),
        billing_period=head.billing_period,
        currency=head.currency,
        issued_at=head.issued_at,
        subtotal=head.subtotal,
        tax_total=head.tax_total,
        total=head.total,
        taxes=taxes_of(TaxAmount.model_validate(t) for t in head.taxes),
        groups=groups,
        line_count=head.line_count,
        lines_complete=True,
        revision=head.revision,
        exact_total=None if rating is None else rating.exact_total,
        metered_events=0 if rating is None else rating.metered_events,
        supersedes_invoice_id=head.supersedes_invoice_id,
    )


def _credit_note(conn: psycopg.Connection[Any], credit_note_id: str) -> Document | None:
    with conn.cursor(row_factory=class_row(_CreditHead)) as cur:
        head = cur.execute(
            """
            SELECT c.credit_note_id::text, c.credit_note_number, c.invoice_id::text,
                   i.invoice_number, i.revision, c.customer_id, i.customer_name,
                   c.billing_period, trim(c.currency) AS currency, c.subtotal, c.tax_total,
                   c.total, c.reason, c.issued_at
              FROM credit_notes c JOIN invoices i ON i.invoice_id = c.invoice_id
             WHERE c.credit_note_id = %s
            """,
            (credit_note_id,),
        ).fetchone()
    if head is None:
        return None
    # a partial note has its credited lines (migration 0021); a full note has none
    with conn.cursor(row_factory=class_row(_CreditedLine)) as cur:
        credited = cur.execute(
            """
            SELECT c.line_no, c.amount, c.tax, l.description, l.sku_id, l.event_id
              FROM credit_note_lines c
              JOIN invoice_lines l ON (l.invoice_id, l.line_no) = (c.invoice_id, c.line_no)
             WHERE c.credit_note_id = %s ORDER BY c.line_no
            """,
            (credit_note_id,),
        ).fetchall()
    lines = tuple(
        DocumentLine(
            credited_line(
                row.line_no, row.tax, oneline(row.description or row.sku_id or row.event_id)
            ),
            row.amount,
        )
        for row in credited
    )
    groups = (LineGroup(None, lines),) if lines else ()
    return Document(
        kind="credit_note",
        document_id=head.credit_note_id,
        number=oneline(head.credit_note_number),
        customer_id=head.customer_id,
        customer_name=oneline(head.customer_name),
        billing_period=head.billing_period,
        currency=head.currency,
        issued_at=head.issued_at,
        subtotal=head.subtotal,
        tax_total=head.tax_total,
        total=head.total,
        revision=head.revision,
        credited_invoice_id=head.invoice_id,
        credited_invoice_number=oneline(head.invoice_number),
        reason=oneline(head.reason),
        partial=bool(groups),
        groups=groups,
        line_count=len(groups[0].lines) if groups else 0,
    )


def load_document(
    conn: psycopg.Connection[Any], kind: DocumentKind, document_id: str
) -> Document | None:
    """The stored document ``kind`` / ``document_id`` with every line, or None when no
    such document exists. ``document_id`` must be a UUID text (the callers check it).

    Raises:
        psycopg.Error: the database failed (the caller classifies it).
    """
    if kind == "invoice":
        return _invoice(conn, document_id)
    return _credit_note(conn, document_id)


@dataclass(frozen=True)
class Supersession:
    """A document that supersedes an invoice revision: a newer revision or a credit note."""

    kind: DocumentKind
    document_id: str
    number: str
    issued_at: datetime


@dataclass(frozen=True)
class DocumentState:
    """What may change about a document after it was issued: an invoice revision's
    ``status`` (``issued``, ``superseded``, ``voided``; a credit note is always
    ``issued``) and the documents that supersede it, oldest first."""

    status: str
    superseded_by: tuple[Supersession, ...] = ()


def document_state(
    conn: psycopg.Connection[Any], kind: DocumentKind, document_id: str
) -> DocumentState | None:
    """The :class:`DocumentState` of a stored document (None: no such document)."""
    if kind == "credit_note":
        with conn.cursor(row_factory=scalar_row) as cur:
            found = cur.execute(
                "SELECT 1 FROM credit_notes WHERE credit_note_id = %s", (document_id,)
            ).fetchone()
        return None if found is None else DocumentState("issued")
    with conn.cursor(row_factory=scalar_row) as cur:
        status = cur.execute(
            "SELECT status FROM invoices WHERE invoice_id = %s", (document_id,)
        ).fetchone()
    if status is None:
        return None
    with conn.cursor(row_factory=class_row(Supersession)) as cur:
        later = cur.execute(
            """
            SELECT 'credit_note' AS kind, credit_note_id::text AS document_id,
                   credit_note_number AS number, issued_at
              FROM credit_notes WHERE invoice_id = %(id)s
            UNION ALL
            SELECT 'invoice', invoice_id::text, invoice_number, issued_at
              FROM invoices WHERE supersedes_invoice_id = %(id)s
             ORDER BY issued_at, number
            """,
            {"id": document_id},
        ).fetchall()
    return DocumentState(str(status), tuple(later))


def invoice_recipient(conn: psycopg.Connection[Any], invoice_id: str) -> str | None:
    """The address invoice revision ``invoice_id`` was issued to (``invoices.email``), None
    when no such revision exists. ``invoice_id`` must be a UUID text.

    Raises:
        psycopg.Error: the database failed, or the role may not read the address.
    """
    with conn.cursor(row_factory=scalar_row) as cur:
        found = cur.execute(
            "SELECT email FROM invoices WHERE invoice_id = %s", (invoice_id,)
        ).fetchone()
    return None if found is None else str(found)
