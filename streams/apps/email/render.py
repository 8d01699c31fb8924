"""Render an issued invoice or credit note into an email (pure: no I/O, no clock).

* :func:`document_ref` — what identifies the email of a document: its type, id,
  ``document_key`` (the dedup key in ``email_deliveries``) and its deterministic
  ``Message-ID``;
* :func:`is_zero_total` — whether the document's total rounds to zero;
* :func:`render_email` — an :class:`email.message.EmailMessage` with a plain-text
  and an HTML alternative.

Identity (docs/design.md "Email"): the ``Message-ID`` derives from the document only,
never from the event or the clock, so a resend after a crash between "sent" and
"marked" carries the same ``Message-ID`` and the receiver can recognise it:

=================  ===================================  ==========================================
document           ``document_key``                     ``Message-ID``
=================  ===================================  ==========================================
invoice revision   ``invoice:{invoice_id}:r{revision}``  ``<invoice-{invoice_id}-r{revision}@{domain}>``
credit note        ``credit_note:{credit_note_id}``     ``<credit-note-{credit_note_id}@{domain}>``
=================  ===================================  ==========================================

The void of a revision: ``invoice_void:{invoice_id}:r{revision}`` and
``<void-{invoice_id}-r{revision}@{domain}>`` (short enough that the header is never folded).

Ids are normalised to the lowercase hyphenated UUID form.

Traceability (invariant 6): every email carries ``X-Outbox-Event-Id`` (the
outbox row id = CloudEvents ``ce_id``) and ``X-Document-Key``; an invoice email
``X-Invoice-Id`` and ``X-Invoice-Revision``; a credit note ``X-Credit-Note-Id``,
``X-Credited-Invoice-Id`` and ``X-Credited-Invoice-Revision`` (a credit note does
not carry ``X-Invoice-Id``, so counting emails by ``X-Invoice-Id`` counts invoice
emails only); a void ``X-Voided-Invoice-Id`` and ``X-Voided-Invoice-Revision``.

A void (``invoice.voided``: :func:`void_ref`, :func:`render_void_email`) is announced with
the stored invoice it voids (the event carries neither the address nor the amounts): the
email says which invoice was voided, when and why, shows the voided document, links to its
hosted page (which says "voided") and attaches the voided invoice's PDF.

Content: the templates of :mod:`streams.adapters.documents.templates` (Jinja2,
autoescaped HTML; docs/email.md): ``email.txt.j2`` and ``email.html.j2`` show the
:class:`~streams.core.domain.documents.Document` the event announces (a pre-priced
invoice: its largest lines; a rated one: every charge line with how it was computed), a
link to the hosted page when one is given, and the name of the attached PDF. The PDF
(the whole document, every line) is rendered by the sender from the stored document
(:mod:`streams.adapters.documents.pdf`) and attached here as ``application/pdf``.

Money: amounts are ``Decimal`` shown at the currency's minor unit, half-even, with
thousands separators (``1,234.50 USD``, ``1,235 JPY``), rated lines exactly; tax
rates as percentages (``0.065`` → ``6.5%``): :mod:`streams.core.domain.formatting`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime
from typing import Literal

from jinja2 import TemplateError

from streams.adapters.documents.templates import render
from streams.apps.email.errors import RenderError
from streams.core.domain import formatting
from streams.core.domain.documents import Document, from_event
from streams.core.domain.events import CreditNoteIssued, InvoiceIssued, InvoiceVoided
from streams.core.domain.money import InvalidAmount, UnknownCurrency

#: Right-hand side of every ``Message-ID`` this sender makes.
MESSAGE_ID_DOMAIN = "invoicing.local"
#: Largest lines shown in an invoice email by default.
DEFAULT_MAX_LINES = 10

#: A document that gets an email.
EmailDocument = InvoiceIssued | CreditNoteIssued
DocumentType = Literal["invoice", "credit_note", "invoice_void"]


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


@dataclass(frozen=True)
class Attachment:
    """A file attached to the email: its name, MIME type and bytes."""

    filename: str
    content: bytes
    maintype: str = "application"
    subtype: str = "pdf"


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


def void_ref(
    void: InvoiceVoided, *, recipient: str, domain: str = MESSAGE_ID_DOMAIN
) -> DocumentRef:
    """The identity of the email announcing ``void`` (one per voided revision), sent to
    ``recipient`` (the address the invoice was issued to).

    Raises:
        RenderError: the invoice id is not a UUID.
    """
    invoice_id = _uuid(void.invoice_id, "invoice_id")
    return DocumentRef(
        document_type="invoice_void",
        document_id=invoice_id,
        document_key=f"invoice_void:{invoice_id}:r{void.revision}",
        message_id=f"<void-{invoice_id}-r{void.revision}@{domain}>",
        customer_id=void.customer_id,
        recipient=recipient,
    )


def _money_error(exc: UnknownCurrency | InvalidAmount) -> RenderError:
    if isinstance(exc, UnknownCurrency):
        return RenderError(f"unknown currency {exc}")
    return RenderError(str(exc))


def is_zero_total(doc: EmailDocument) -> bool:
    """True when ``doc.total`` rounds to zero at the currency's minor unit (half-even),
    e.g. ``0.004 USD``.

    Raises:
        RenderError: the currency is not one we bill in.
    """
    try:
        return formatting.rounded(doc.total, doc.currency).is_zero()
    except UnknownCurrency as exc:
        raise _money_error(exc) from exc


def format_amount(amount: Decimal, currency: str) -> str:
    """:func:`streams.core.domain.formatting.format_amount`, a :class:`RenderError` for
    an unknown currency."""
    try:
        return formatting.format_amount(amount, currency)
    except UnknownCurrency as exc:
        raise _money_error(exc) from exc


def format_exact(amount: Decimal, currency: str) -> str:
    """:func:`streams.core.domain.formatting.format_exact`, a :class:`RenderError` for an
    unknown currency or a non-finite amount."""
    try:
        return formatting.format_exact(amount, currency)
    except (UnknownCurrency, InvalidAmount) as exc:
        raise _money_error(exc) from exc


def format_money(amount: Decimal, currency: str) -> str:
    """``format_amount`` followed by the ISO 4217 code: ``"1,234.50 USD"``."""
    return f"{format_amount(amount, currency)} {currency}"


format_rate = formatting.format_rate
format_quantity = formatting.format_quantity


def _recipient(name: str, address: str) -> Address:
    display = formatting.oneline(name)
    try:
        return Address(display_name=display, addr_spec=address)
    except (ValueError, IndexError, HeaderParseError) as exc:
        raise RenderError(f"invalid recipient address {address!r}: {exc}") from None


def _text_width(document: Document) -> int:
    """Column width of the amounts in the plain-text alternative."""
    cur = document.currency
    if document.exact_total is not None:
        amounts = [formatting.format_exact(line.amount, cur) for line in document.lines]
        return max(
            [len(a) for a in amounts] + [len(formatting.format_exact(document.exact_total, cur))]
        )
    if document.lines_complete:
        texts = [f"{formatting.format_exact(line.amount, cur)} {cur}" for line in document.lines]
    else:
        texts = [formatting.format_money(line.amount, cur) for line in document.lines]
    return max((len(t) for t in texts), default=0)


@dataclass(frozen=True)
class VoidNotice:
    """What a void email says beside the voided document: why and when (UTC)."""

    reason: str
    voided_at: datetime


def render_bodies(
    document: Document,
    *,
    event_id: str,
    link: str | None = None,
    attachment: str | None = None,
    void: VoidNotice | None = None,
    lines_file: str | None = None,
) -> tuple[str, str]:
    """``(text, html)`` of ``document``'s email (``email.txt.j2``, ``email.html.j2``);
    with ``void``, the email that announces the void of the invoice ``document``.
    ``attachment`` and ``lines_file`` name the attached PDF and CSV of every line.

    Raises:
        RenderError: an unknown currency or amount, or a template that fails.
    """
    context = {
        "doc": document,
        "event_id": formatting.oneline(event_id),
        "link": link,
        "attachment": attachment,
        "lines_file": lines_file,
        "void": void,
    }
    try:
        text = render("email.txt.j2", width=_text_width(document), **context)
        html = render("email.html.j2", **context)
    except (UnknownCurrency, InvalidAmount) as exc:
        raise _money_error(exc) from exc
    except TemplateError as exc:
        raise RenderError(f"template failed: {exc}") from exc
    return text, html


def render_email(
    doc: EmailDocument,
    *,
    event_id: str,
    from_address: str,
    domain: str = MESSAGE_ID_DOMAIN,
    max_lines: int = DEFAULT_MAX_LINES,
    link: str | None = None,
    attachment: Attachment | None = None,
    lines: Attachment | None = None,
) -> EmailMessage:
    """The email of ``doc``: ``multipart/alternative`` with ``text/plain`` then
    ``text/html`` (both UTF-8), inside ``multipart/mixed`` with ``attachment`` (the PDF)
    and ``lines`` (the CSV of every line) when given.

    Headers: ``From`` = ``from_address``; ``To`` = the customer's name and
    ``doc.email``; ``Subject``; ``Date`` = ``doc.issued_at`` (so the message is a
    function of the document, the event id, the link and the attachment);
    ``Message-ID`` from :func:`document_ref`; the ``X-…`` traceability headers of the
    module docstring.

    Args:
        event_id: the outbox event id (CloudEvents ``ce_id``) the email comes from.
        max_lines: at most this many of ``doc.largest_lines`` are shown (invoices).
        link: the hosted page's URL (with its token), shown in both alternatives.
        attachment: the document's PDF.
        lines: the CSV of every line, when the PDF shows only the largest.

    Raises:
        RenderError: invalid recipient or sender address, a document id that is
            not a UUID, an unknown currency, or a header value with CR/LF.
    """
    ref = document_ref(doc, domain=domain)
    try:
        document = from_event(doc, max_lines=max_lines)
    except (UnknownCurrency, InvalidAmount) as exc:
        raise _money_error(exc) from exc
    total = format_money(doc.total, doc.currency)
    if isinstance(doc, InvoiceIssued):
        subject = f"Invoice {document.number} for {doc.billing_period}: {total}"
    else:
        subject = (
            f"Credit note {document.number} for invoice {document.credited_invoice_number}: {total}"
        )
    text, body_html = render_bodies(
        document,
        event_id=event_id,
        link=link,
        attachment=None if attachment is None else attachment.filename,
        lines_file=None if lines is None else lines.filename,
    )

    headers = {
        "Subject": subject,
        "Date": format_datetime(doc.issued_at),
        "Message-ID": ref.message_id,
        "X-Outbox-Event-Id": event_id,
        "X-Document-Key": ref.document_key,
    }
    if isinstance(doc, InvoiceIssued):
        headers["X-Invoice-Id"] = ref.document_id
        headers["X-Invoice-Revision"] = str(doc.revision)
    else:
        headers["X-Credit-Note-Id"] = ref.document_id
        headers["X-Credited-Invoice-Id"] = doc.invoice_id
        headers["X-Credited-Invoice-Revision"] = str(doc.revision)
    to = (doc.customer_name, doc.email)
    return _message(from_address, to, headers, text, body_html, (attachment, lines))


def render_void_email(
    void: InvoiceVoided,
    document: Document,
    *,
    recipient: str,
    event_id: str,
    from_address: str,
    domain: str = MESSAGE_ID_DOMAIN,
    link: str | None = None,
    attachment: Attachment | None = None,
    lines: Attachment | None = None,
) -> EmailMessage:
    """The email announcing ``void`` of the stored invoice ``document`` to ``recipient``:
    ``multipart/alternative`` (text, HTML) inside ``multipart/mixed`` with ``attachment``
    (the voided invoice's PDF) and ``lines`` (the CSV of every line) when given.

    Headers: ``Subject`` ``Invoice INV-… for 2026-10 voided``; ``Date`` = ``voided_at``;
    ``Message-ID`` from :func:`void_ref`; ``X-Outbox-Event-Id``, ``X-Document-Key``,
    ``X-Voided-Invoice-Id``, ``X-Voided-Invoice-Revision``.

    Raises:
        RenderError: an invalid address, an invoice id that is not a UUID, an unknown
            currency, a header value with CR/LF, or a template that fails.
    """
    ref = void_ref(void, recipient=recipient, domain=domain)
    text, body_html = render_bodies(
        document,
        event_id=event_id,
        link=link,
        attachment=None if attachment is None else attachment.filename,
        void=VoidNotice(formatting.oneline(void.reason), void.voided_at),
        lines_file=None if lines is None else lines.filename,
    )
    headers = {
        "Subject": f"Invoice {document.number} for {document.billing_period} voided",
        "Date": format_datetime(void.voided_at),
        "Message-ID": ref.message_id,
        "X-Outbox-Event-Id": event_id,
        "X-Document-Key": ref.document_key,
        "X-Voided-Invoice-Id": ref.document_id,
        "X-Voided-Invoice-Revision": str(void.revision),
    }
    to = (document.customer_name, recipient)
    return _message(from_address, to, headers, text, body_html, (attachment, lines))


def _message(
    from_address: str,
    to: tuple[str, str],
    headers: dict[str, str],
    text: str,
    body_html: str,
    attachments: tuple[Attachment | None, ...],
) -> EmailMessage:
    """``From``, ``To`` (``to``: display name, address) and ``headers`` (in order), the
    text and HTML alternatives, and each of ``attachments`` that is not None, in order.

    Raises:
        RenderError: an invalid from or recipient address, a header value with CR/LF.
    """
    msg = EmailMessage()
    try:
        try:
            sender = Address(addr_spec=from_address)
        except (ValueError, IndexError, HeaderParseError) as exc:
            raise RenderError(f"invalid from address {from_address!r}: {exc}") from None
        msg["From"] = sender
        msg["To"] = _recipient(*to)
        for name, value in headers.items():
            msg[name] = value
    except ValueError as exc:  # CR/LF in a header value, a malformed header
        raise RenderError(f"cannot build the email headers: {exc}") from None
    msg.set_content(text)
    msg.add_alternative(body_html, subtype="html")
    for attachment in attachments:
        if attachment is not None:
            msg.add_attachment(
                attachment.content,
                maintype=attachment.maintype,
                subtype=attachment.subtype,
                filename=attachment.filename,
            )
    return msg
