"""Render an issued invoice or credit note into an email (pure: no I/O, no clock).

* :func:`document_ref` — what identifies the email of a document: its type, id,
  ``document_key`` (the dedup key in ``email_deliveries``) and its deterministic
  ``Message-ID``;
* :func:`is_zero_total` — whether the document's total rounds to zero;
* :func:`render_email` — an :class:`email.message.EmailMessage` with a plain-text
  and an HTML alternative.

Identity (DESIGN "Email"): the ``Message-ID`` derives from the document only,
never from the event or the clock, so a resend after a crash between "sent" and
"marked" carries the same ``Message-ID`` and the receiver can recognise it:

=================  ===================================  ==========================================
document           ``document_key``                     ``Message-ID``
=================  ===================================  ==========================================
invoice revision   ``invoice:{invoice_id}:r{revision}``  ``<invoice-{invoice_id}-r{revision}@{domain}>``
credit note        ``credit_note:{credit_note_id}``     ``<credit-note-{credit_note_id}@{domain}>``
=================  ===================================  ==========================================

Ids are normalised to the lowercase hyphenated UUID form.

Traceability (invariant 6): every email carries ``X-Outbox-Event-Id`` (the
outbox row id = CloudEvents ``ce_id``) and ``X-Document-Key``; an invoice email
``X-Invoice-Id`` and ``X-Invoice-Revision``; a credit note ``X-Credit-Note-Id``,
``X-Credited-Invoice-Id`` and ``X-Credited-Invoice-Revision`` (a credit note does
not carry ``X-Invoice-Id``, so counting emails by ``X-Invoice-Id`` counts invoice
emails only).

Money: amounts are ``Decimal`` shown at the currency's minor unit
(:func:`streams.domain.money.round_money`, half-even) with thousands separators,
e.g. ``1,234.50 USD``, ``1,235 JPY``; never converted to float. Tax rates are
fractions shown as percentages (``0.065`` → ``6.5%``).

HTML: every interpolated value goes through :func:`html.escape` (quotes
included) in one helper. A template library (Jinja2 with autoescape) was
considered; the layout is one small fixed table, so the standard library keeps
the escaping rule visible in one place without a new dependency.
"""

from __future__ import annotations

import html
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Literal

from streams.domain.events import CreditNoteIssued, InvoiceIssued, LineSummary, TaxAmount
from streams.domain.money import UnknownCurrency, minor_unit_exponent, round_money
from streams.email.errors import RenderError

#: Right-hand side of every ``Message-ID`` this sender makes.
MESSAGE_ID_DOMAIN = "invoicing.local"
#: Largest lines shown in an invoice email by default.
DEFAULT_MAX_LINES = 10

#: A document that gets an email.
EmailDocument = InvoiceIssued | CreditNoteIssued
DocumentType = Literal["invoice", "credit_note"]

_CONTROL_OR_SPACE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")


@dataclass(frozen=True)
class DocumentRef:
    """What identifies the email of one document.

    ``document_id`` is the invoice id (invoice) or the credit note id, lowercase
    UUID text; ``recipient`` is the address as given in the event (validated by
    :func:`render_email`, not here).
    """

    document_type: DocumentType
    document_id: str
    document_key: str
    message_id: str
    customer_id: str
    recipient: str


def _uuid(value: str, what: str) -> str:
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise RenderError(f"{what} {value!r} is not a UUID") from None


def document_ref(doc: EmailDocument, *, domain: str = MESSAGE_ID_DOMAIN) -> DocumentRef:
    """The identity of ``doc``'s email (see the module docstring for the forms).

    Raises:
        RenderError: the document id is not a UUID (``email_deliveries.document_id``
            is a ``uuid`` column, and the id would make an unsafe ``Message-ID``).
    """
    if isinstance(doc, InvoiceIssued):
        invoice_id = _uuid(doc.invoice_id, "invoice_id")
        return DocumentRef(
            document_type="invoice",
            document_id=invoice_id,
            document_key=f"invoice:{invoice_id}:r{doc.revision}",
            message_id=f"<invoice-{invoice_id}-r{doc.revision}@{domain}>",
            customer_id=doc.customer_id,
            recipient=doc.email,
        )
    credit_note_id = _uuid(doc.credit_note_id, "credit_note_id")
    return DocumentRef(
        document_type="credit_note",
        document_id=credit_note_id,
        document_key=f"credit_note:{credit_note_id}",
        message_id=f"<credit-note-{credit_note_id}@{domain}>",
        customer_id=doc.customer_id,
        recipient=doc.email,
    )


def _round(amount: Decimal, currency: str) -> Decimal:
    try:
        rounded = round_money(amount, currency)
    except UnknownCurrency as exc:
        raise RenderError(f"unknown currency {currency!r}") from exc
    # "-0.00" reads as a debt of nothing: show zero without a sign.
    return rounded.copy_abs() if rounded.is_zero() else rounded


def is_zero_total(doc: EmailDocument) -> bool:
    """True when ``doc.total`` rounds to zero at the currency's minor unit (half-even),
    e.g. ``0.004 USD``.

    Raises:
        RenderError: the currency is not one we bill in.
    """
    return _round(doc.total, doc.currency).is_zero()


def format_amount(amount: Decimal, currency: str) -> str:
    """``amount`` at ``currency``'s minor unit with thousands separators, no code:
    ``Decimal("1234.5"), "USD"`` → ``"1,234.50"``; ``"JPY"`` → ``"1,234"`` (half-even).

    Raises:
        RenderError: the currency is not one we bill in.
    """
    rounded = _round(amount, currency)
    exponent = minor_unit_exponent(currency)
    return format(rounded, f",.{exponent}f")


def format_money(amount: Decimal, currency: str) -> str:
    """:func:`format_amount` followed by the ISO 4217 code: ``"1,234.50 USD"``."""
    return f"{format_amount(amount, currency)} {currency}"


def format_rate(rate: Decimal) -> str:
    """A tax rate fraction as a percentage without trailing zeros: ``0.065`` → ``"6.5%"``,
    ``0.2`` → ``"20%"``, ``0`` → ``"0%"``."""
    percent = (rate * 100).normalize()
    text = format(percent, "f")
    return f"{text}%"


def _oneline(text: str) -> str:
    """Free text as one line: control characters and whitespace runs become one space."""
    return _CONTROL_OR_SPACE.sub(" ", text).strip()


def _e(value: object) -> str:
    """The one HTML escaping rule: text content and attribute values, quotes included."""
    return html.escape(str(value), quote=True)


def _recipient(name: str, address: str) -> Address:
    display = _oneline(name)
    try:
        return Address(display_name=display, addr_spec=address)
    except (ValueError, IndexError, HeaderParseError) as exc:
        raise RenderError(f"invalid recipient address {address!r}: {exc}") from None


def _greeting(doc: EmailDocument) -> str:
    return _oneline(doc.customer_name) or "customer"


def _issued(doc: EmailDocument) -> str:
    return doc.issued_at.strftime("%Y-%m-%d %H:%M UTC")


# --------------------------------------------------------------------------- invoice


def _invoice_text(doc: InvoiceIssued, lines: tuple[LineSummary, ...], event_id: str) -> str:
    cur = doc.currency
    out = [
        f"Dear {_greeting(doc)},",
        "",
        f"invoice {_oneline(doc.invoice_number)} for the billing period {doc.billing_period} "
        "has been issued.",
        "",
        f"Invoice number:  {_oneline(doc.invoice_number)}",
        f"Revision:        {doc.revision}",
        f"Billing period:  {doc.billing_period}",
        f"Customer:        {_oneline(doc.customer_name)} ({doc.customer_id})",
        f"Issued:          {_issued(doc)}",
        f"Lines:           {doc.line_count:,}",
    ]
    if doc.supersedes_invoice_id:
        out.append(f"Replaces:        invoice {_oneline(doc.supersedes_invoice_id)}")
    if lines:
        out += ["", _largest_title(len(lines), doc.line_count) + ":"]
        width = max(len(format_money(line.amount, cur)) for line in lines)
        for line in lines:
            amount = format_money(line.amount, cur).rjust(width)
            out.append(f"  {amount}  {_oneline(line.description)}")
    out += ["", f"Subtotal:        {format_money(doc.subtotal, cur)}"]
    for tax in doc.taxes:
        out.append(f"Tax {_tax_label(tax)}: {format_money(tax.amount, cur)}")
    out += [
        f"Tax total:       {format_money(doc.tax_total, cur)}",
        f"Total:           {format_money(doc.total, cur)}",
        "",
        f"Reference: event {_oneline(event_id)}",
    ]
    return "\n".join(out) + "\n"


def _largest_title(shown: int, total: int) -> str:
    if shown >= total:
        return "Lines"
    return f"The {shown} largest of {total:,} lines"


def _tax_label(tax: TaxAmount) -> str:
    return f"{_oneline(tax.tax_code)} ({format_rate(tax.rate)})"


def _invoice_html(doc: InvoiceIssued, lines: tuple[LineSummary, ...], event_id: str) -> str:
    cur = doc.currency
    rows = [
        ("Invoice number", _oneline(doc.invoice_number)),
        ("Revision", str(doc.revision)),
        ("Billing period", doc.billing_period),
        ("Customer", f"{_oneline(doc.customer_name)} ({doc.customer_id})"),
        ("Issued", _issued(doc)),
        ("Lines", f"{doc.line_count:,}"),
    ]
    if doc.supersedes_invoice_id:
        rows.append(("Replaces", f"invoice {_oneline(doc.supersedes_invoice_id)}"))
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>Invoice {_e(_oneline(doc.invoice_number))}</title></head><body>",
        f"<p>Dear {_e(_greeting(doc))},</p>",
        f"<p>invoice <strong>{_e(_oneline(doc.invoice_number))}</strong> for the billing "
        f"period {_e(doc.billing_period)} has been issued.</p>",
        '<table class="summary">',
        *(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows),
        "</table>",
    ]
    if lines:
        parts += [
            f"<h3>{_e(_largest_title(len(lines), doc.line_count))}</h3>",
            '<table class="lines"><tr><th>Description</th><th>Amount</th></tr>',
            *(
                f"<tr><td>{_e(_oneline(line.description))}</td>"
                f'<td style="text-align:right">{_e(format_money(line.amount, cur))}</td></tr>'
                for line in lines
            ),
            "</table>",
        ]
    parts += [
        '<table class="totals">',
        f"<tr><th>Subtotal</th><td>{_e(format_money(doc.subtotal, cur))}</td></tr>",
        *(
            f"<tr><th>Tax {_e(_tax_label(tax))}</th>"
            f"<td>{_e(format_money(tax.amount, cur))}</td></tr>"
            for tax in doc.taxes
        ),
        f"<tr><th>Tax total</th><td>{_e(format_money(doc.tax_total, cur))}</td></tr>",
        f"<tr><th>Total</th><td><strong>{_e(format_money(doc.total, cur))}</strong></td></tr>",
        "</table>",
        f"<p><small>Reference: event {_e(_oneline(event_id))}</small></p>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- credit note


def _credit_rows(doc: CreditNoteIssued) -> list[tuple[str, str]]:
    cur = doc.currency
    return [
        ("Credit note number", _oneline(doc.credit_note_number)),
        ("Credited invoice", f"{_oneline(doc.invoice_number)} (revision {doc.revision})"),
        ("Billing period", doc.billing_period),
        ("Customer", f"{_oneline(doc.customer_name)} ({doc.customer_id})"),
        ("Issued", _issued(doc)),
        ("Reason", _oneline(doc.reason)),
        ("Subtotal", format_money(doc.subtotal, cur)),
        ("Tax total", format_money(doc.tax_total, cur)),
        ("Total credited", format_money(doc.total, cur)),
    ]


def _credit_text(doc: CreditNoteIssued, event_id: str) -> str:
    rows = _credit_rows(doc)
    width = max(len(k) for k, _ in rows) + 2
    out = [
        f"Dear {_greeting(doc)},",
        "",
        f"credit note {_oneline(doc.credit_note_number)} cancels invoice "
        f"{_oneline(doc.invoice_number)} for the billing period {doc.billing_period}.",
        "",
        *(f"{(k + ':').ljust(width)}{v}" for k, v in rows),
        "",
        f"Reference: event {_oneline(event_id)}",
    ]
    return "\n".join(out) + "\n"


def _credit_html(doc: CreditNoteIssued, event_id: str) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html><head><meta charset="utf-8">',
        f"<title>Credit note {_e(_oneline(doc.credit_note_number))}</title></head><body>",
        f"<p>Dear {_e(_greeting(doc))},</p>",
        f"<p>credit note <strong>{_e(_oneline(doc.credit_note_number))}</strong> cancels "
        f"invoice {_e(_oneline(doc.invoice_number))} for the billing period "
        f"{_e(doc.billing_period)}.</p>",
        '<table class="summary">',
        *(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in _credit_rows(doc)),
        "</table>",
        f"<p><small>Reference: event {_e(_oneline(event_id))}</small></p>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


# --------------------------------------------------------------------------- message


def render_email(
    doc: EmailDocument,
    *,
    event_id: str,
    from_address: str,
    domain: str = MESSAGE_ID_DOMAIN,
    max_lines: int = DEFAULT_MAX_LINES,
) -> EmailMessage:
    """The email of ``doc``: ``multipart/alternative`` with ``text/plain`` then
    ``text/html`` (both UTF-8).

    Headers: ``From`` = ``from_address``; ``To`` = the customer's name and
    ``doc.email``; ``Subject``; ``Date`` = ``doc.issued_at`` (so the message is a
    function of the document and the event id); ``Message-ID`` from
    :func:`document_ref`; the ``X-…`` traceability headers of the module docstring.

    Args:
        event_id: the outbox event id (CloudEvents ``ce_id``) the email comes from.
        max_lines: at most this many of ``doc.largest_lines`` are shown (invoices).

    Raises:
        RenderError: invalid recipient or sender address, a document id that is
            not a UUID, an unknown currency, or a header value with CR/LF.
    """
    ref = document_ref(doc, domain=domain)
    if isinstance(doc, InvoiceIssued):
        lines = doc.largest_lines[: max(0, max_lines)]
        subject = (
            f"Invoice {_oneline(doc.invoice_number)} for {doc.billing_period}: "
            f"{format_money(doc.total, doc.currency)}"
        )
        text = _invoice_text(doc, lines, event_id)
        body_html = _invoice_html(doc, lines, event_id)
    else:
        subject = (
            f"Credit note {_oneline(doc.credit_note_number)} for invoice "
            f"{_oneline(doc.invoice_number)}: {format_money(doc.total, doc.currency)}"
        )
        text = _credit_text(doc, event_id)
        body_html = _credit_html(doc, event_id)

    msg = EmailMessage()
    try:
        try:
            sender = Address(addr_spec=from_address)
        except (ValueError, IndexError, HeaderParseError) as exc:
            raise RenderError(f"invalid from address {from_address!r}: {exc}") from None
        msg["From"] = sender
        msg["To"] = _recipient(doc.customer_name, doc.email)
        msg["Subject"] = subject
        msg["Date"] = format_datetime(doc.issued_at)
        msg["Message-ID"] = ref.message_id
        msg["X-Outbox-Event-Id"] = event_id
        msg["X-Document-Key"] = ref.document_key
        if isinstance(doc, InvoiceIssued):
            msg["X-Invoice-Id"] = ref.document_id
            msg["X-Invoice-Revision"] = str(doc.revision)
        else:
            msg["X-Credit-Note-Id"] = ref.document_id
            msg["X-Credited-Invoice-Id"] = doc.invoice_id
            msg["X-Credited-Invoice-Revision"] = str(doc.revision)
    except ValueError as exc:  # CR/LF in a header value, a malformed header
        raise RenderError(f"cannot build the email headers: {exc}") from None
    msg.set_content(text)
    msg.add_alternative(body_html, subtype="html")
    return msg
