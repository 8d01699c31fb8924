"""Partial credit notes on an issued invoice revision (docs/invoices.md "Partial credit
notes").

:func:`credit_invoice` calls ``credit_invoice_lines(…)`` of migration 0021, a ``SECURITY
DEFINER`` function of the owner that only the admin role may execute. In one transaction
it locks the invoice row, refuses unless the revision is ``issued`` and pre-priced,
refuses more than what is still creditable per line and per invoice (the rule of
:mod:`streams.core.domain.credit`), takes the next gapless ``CN-<period>`` number, writes
the ``credit_notes`` row (``kind`` ``partial``), its ``credit_note_lines`` and the
``credit_note.issued`` outbox row with the lines. Debezium routes the row to
``billing.invoices.v1``; the email sender sends one email saying what it credits. The
revision stays ``issued``; a replay's later full note credits only what is still open.

The tax credited is pro rata to the line's charged tax, rounded half-even to the
currency's minor unit (no tax-service call, as the full note of a replay).

The invoice is named by its id (a UUID) or its number (``INV-2026-10-000042``);
``--lines FILE`` is a CSV of ``line,amount`` rows (a header row ``line,amount`` may lead).
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import psycopg
from psycopg import errors

from streams.core.billing.issuance import outbox_event_id
from streams.core.domain.events import CreditNoteIssued
from streams.core.domain.money import UnknownCurrency, minor_unit_exponent
from streams.errors import InvoicingError

__all__ = [
    "SOURCE",
    "CreditError",
    "CreditExceedsOpen",
    "CreditNoteIssuedResult",
    "InvalidCredit",
    "InvoiceNotCreditable",
    "InvoiceNotFound",
    "credit_invoice",
    "parse_lines_csv",
]

#: CloudEvents ``source`` of the partial ``credit_note.issued`` events.
SOURCE = "/ops/credit-note"


class CreditError(InvoicingError):
    """A credit note was refused; nothing was written."""


class InvoiceNotFound(CreditError):
    """No invoice revision has that id or number."""


class InvoiceNotCreditable(CreditError):
    """The revision is not ``issued`` (voided, superseded) or is a rated invoice."""


class InvalidCredit(CreditError):
    """A bad reason, line list, line number or amount."""


class CreditExceedsOpen(CreditError):
    """More than what is still creditable on a line or on the invoice."""


@dataclass(frozen=True)
class CreditNoteIssuedResult:
    """A committed partial credit note: its id and number, the credited revision, the
    amounts credited (currency units), when, and the id of its outbox row."""

    credit_note_id: str
    credit_note_number: str
    invoice_id: str
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    issued_at: datetime
    outbox_id: str


def _amount(text: str, where: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise InvalidCredit(f"{where}: {text!r} is not a decimal amount") from None
    if not value.is_finite():
        raise InvalidCredit(f"{where}: {text!r} is not a decimal amount")
    return value


def _line_no(text: str, where: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InvalidCredit(f"{where}: {text!r} is not a line number") from None
    if value < 1:
        raise InvalidCredit(f"{where}: line numbers start at 1")
    return value


def parse_lines_csv(text: str) -> list[tuple[int, Decimal]]:
    """The ``(line_no, amount)`` pairs of a ``line,amount`` CSV (an optional header row).

    Raises:
        InvalidCredit: a row that is not two fields, a bad line number or amount, no rows.
    """
    pairs: list[tuple[int, Decimal]] = []
    for n, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or all(not cell.strip() for cell in row):
            continue
        if n == 1 and [c.strip().lower() for c in row] == ["line", "amount"]:
            continue
        if len(row) != 2:
            raise InvalidCredit(f"row {n}: expected line,amount, got {len(row)} fields")
        pairs.append((_line_no(row[0], f"row {n}"), _amount(row[1], f"row {n}")))
    if not pairs:
        raise InvalidCredit("the lines file holds no line,amount row")
    return pairs


def _resolve(conn: psycopg.Connection[Any], invoice: str) -> tuple[str, str]:
    """The invoice id and currency of ``invoice`` (an id or a number)."""
    try:
        key, column = str(uuid.UUID(invoice)), "invoice_id"
    except ValueError:
        key, column = invoice, "invoice_number"
    with conn.cursor() as cur:
        found = cur.execute(
            f"SELECT invoice_id::text, trim(currency) FROM invoices WHERE {column} = %s",
            (key,),
        ).fetchone()
    if found is None:
        raise InvoiceNotFound(f"no invoice has the id or number {invoice!r}")
    return str(found[0]), str(found[1])


def credit_invoice(
    conn: psycopg.Connection[Any],
    invoice: str,
    lines: list[tuple[int, Decimal]],
    reason: str,
    *,
    topic: str,
    source: str = SOURCE,
    credit_note_id: str | None = None,
) -> CreditNoteIssuedResult:
    """Issue a partial credit note on the issued revision ``invoice`` (id or number) for
    ``lines`` (``(line_no, amount)``, amounts in currency units), in one transaction on
    ``conn`` (a connection of the admin role), committed on return.

    Args:
        topic: the outbox row's ``aggregatetype``: the prefixed invoices topic.
        source: CloudEvents ``source`` of the event.
        credit_note_id: the note's id (a new UUID by default).

    Raises:
        InvalidCredit: a bad reason, line list, line or amount.
        InvoiceNotFound: no such invoice.
        InvoiceNotCreditable: not the issued revision, or a rated invoice.
        CreditExceedsOpen: more than still creditable per line or per invoice.
        psycopg.errors.InsufficientPrivilege: the role may not credit (only the admin may).
        psycopg.Error: the database failed.
    """
    if not reason.strip():
        raise InvalidCredit("a credit note needs a reason (--reason TEXT)")
    if not lines:
        raise InvalidCredit("a credit note needs at least one line (--line/--amount or --lines)")
    note_id = credit_note_id or str(uuid.uuid4())
    outbox_id = outbox_event_id(CreditNoteIssued.event_type, note_id)
    payload = json.dumps([{"line_no": n, "amount": str(a)} for n, a in lines])
    with conn.transaction():
        invoice_id, currency = _resolve(conn, invoice)
        try:
            exponent = minor_unit_exponent(currency)
        except UnknownCurrency as exc:
            raise InvoiceNotCreditable(str(exc)) from None
        try:
            with conn.transaction(), conn.cursor() as cur:
                row = cur.execute(
                    "SELECT credit_note_number, subtotal, tax_total, total, issued_at "
                    "FROM credit_invoice_lines(%s, %s, %s::jsonb, %s, %s, %s, %s, %s)",
                    (invoice_id, note_id, payload, reason, exponent, outbox_id, topic, source),
                ).fetchone()
        except errors.NoDataFound as exc:
            raise InvoiceNotFound(f"no invoice has the id {invoice_id}") from exc
        except (errors.ObjectNotInPrerequisiteState, errors.FeatureNotSupported) as exc:
            raise InvoiceNotCreditable(exc.diag.message_primary or str(exc)) from exc
        except errors.InvalidParameterValue as exc:
            raise InvalidCredit(exc.diag.message_primary or str(exc)) from exc
        except errors.CheckViolation as exc:
            raise CreditExceedsOpen(exc.diag.message_primary or str(exc)) from exc
        assert row is not None  # the function returns one row or raises
    number, subtotal, tax_total, total, issued_at = row
    return CreditNoteIssuedResult(
        note_id, str(number), invoice_id, subtotal, tax_total, total, issued_at, outbox_id
    )
