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

Rated invoices (the event carries ``rating``, issue 12): instead of the largest
lines, the email lists every charge line per plan version with how it was
computed (quantity x unit price, each tier, the packages, the proration, the
minimum's true-up), the pre-priced usage per plan version (cost, markup,
billed), then how the lines relate to the subtotal: the exact sum of the lines
(line amounts are shown **exact**, :func:`format_exact`, so they add up to it)
and the subtotal, that sum rounded once, half-even, to the minor unit. An
invoice without ``rating`` (pre-priced lines only) renders as it always did.

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

from streams.domain.events import (
    ChargeSummary,
    CreditNoteIssued,
    InvoiceIssued,
    LineSummary,
    RatingSummary,
    TaxAmount,
)
from streams.domain.money import (
    InvalidAmount,
    UnknownCurrency,
    canonical_decimal,
    minor_unit_exponent,
    round_money,
)
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


def format_exact(amount: Decimal, currency: str) -> str:
    """``amount`` exactly, with thousands separators and at least the currency's minor
    unit of decimals (more when it has them), no code: ``Decimal("187.6536"), "USD"``
    → ``"187.6536"``; ``Decimal("199")`` → ``"199.00"``. Never rounds: a rated
    invoice's lines add up to the exact sum its subtotal rounds.

    Raises:
        RenderError: the currency is not one we bill in, or not a finite amount.
    """
    try:
        exponent = minor_unit_exponent(currency)
        value = canonical_decimal(amount)
    except (UnknownCurrency, InvalidAmount) as exc:
        raise RenderError(str(exc)) from exc
    places = value.as_tuple().exponent
    decimals = max(exponent, -places if isinstance(places, int) else 0)
    if value.is_zero():
        value = value.copy_abs()
    return format(value, f",.{decimals}f")


def format_quantity(quantity: Decimal) -> str:
    """A quantity exactly, thousands separated: ``Decimal("1234567.50")`` → ``"1,234,567.5"``."""
    return format(canonical_decimal(quantity), ",f")


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
    if doc.rating is not None:
        out += _rated_text(doc, doc.rating)
    elif lines:
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
    if doc.rating is not None:
        parts += _rated_html(doc, doc.rating)
    elif lines:
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


# --------------------------------------------------------------------------- rated invoice


def _range_text(first: object, last: object) -> str:
    return str(first) if first == last else f"{first}..{last}"


def _charge_detail(charge: ChargeSummary, cur: str) -> list[str]:
    """How a charge's amount was computed, one line each (exact figures)."""
    unit = f" {_oneline(charge.unit)}" if charge.unit else ""
    out: list[str] = []
    if charge.quantity is not None and charge.unit_price is not None:
        out.append(
            f"{format_quantity(charge.quantity)}{unit} x {format_exact(charge.unit_price, cur)}"
        )
    elif charge.quantity is not None:
        out.append(f"{format_quantity(charge.quantity)}{unit}")
    for tier in charge.tiers:
        bound = "∞" if tier.up_to is None else format_quantity(tier.up_to)
        flat = (
            f" + flat {format_exact(tier.flat_amount, cur)}"
            if not tier.flat_amount.is_zero()
            else ""
        )
        out.append(
            f"tier {tier.tier} (above {format_quantity(tier.above)} up to {bound}): "
            f"{format_quantity(tier.units)} x {format_exact(tier.unit_price, cur)}{flat} = "
            f"{format_exact(tier.amount, cur)}"
        )
    if charge.package is not None:
        package = charge.package
        free = (
            f", after {format_quantity(package.free_units)} free"
            if not package.free_units.is_zero()
            else ""
        )
        out.append(
            f"{package.packages} package(s) of {format_quantity(package.package_size)}{unit} "
            f"at {format_exact(package.price, cur)}{free}"
        )
    if charge.proration is not None:
        proration = charge.proration
        out.append(
            f"{format_exact(proration.full_amount, cur)} x {proration.days}/"
            f"{proration.days_in_period} days"
        )
    if charge.true_up is not None:
        out.append(
            f"minimum {format_exact(charge.true_up.minimum, cur)} - charged "
            f"{format_exact(charge.true_up.charged, cur)}"
        )
    return out


def _plan_title(code: str | None, version: int | None, rating: RatingSummary) -> str:
    if code is None:
        return "Pre-priced usage at cost"
    days = [
        _range_text(d.first, d.last)
        for s in rating.segments
        if (s.plan_code, s.plan_version) == (code, version)
        for d in s.days
    ]
    return f"Plan {_oneline(code)} v{version}" + (f" ({', '.join(days)})" if days else "")


def _rated_groups(
    doc: InvoiceIssued, rating: RatingSummary
) -> list[tuple[str, list[tuple[str, Decimal, list[str]]]]]:
    """Per plan version (segment order, then pass-through at cost): its lines as
    (description, exact amount, detail lines)."""
    cur = doc.currency
    groups: dict[tuple[str | None, int | None], list[tuple[str, Decimal, list[str]]]] = {}
    for segment in rating.segments:
        groups.setdefault((segment.plan_code, segment.plan_version), [])
    for charge in doc.charges or ():
        groups.setdefault((charge.plan_code, charge.plan_version), []).append(
            (_oneline(charge.description), charge.amount, _charge_detail(charge, cur))
        )
    for part in rating.pass_through:
        markup = (
            ""
            if part.markup_percent is None or part.markup_percent.is_zero()
            else f", {'markup' if part.markup_percent > 0 else 'discount'} "
            f"{format_quantity(abs(part.markup_percent))}%"
        )
        groups.setdefault((part.plan_code, part.plan_version), []).append(
            (
                f"Pre-priced usage ({part.lines:,} line(s))",
                part.amount,
                [f"cost {format_exact(part.cost, cur)}{markup}"],
            )
        )
    return [
        (_plan_title(code, version, rating), lines)
        for (code, version), lines in groups.items()
        if lines
    ]


def _rated_text(doc: InvoiceIssued, rating: RatingSummary) -> list[str]:
    cur = doc.currency
    groups = _rated_groups(doc, rating)
    amounts = [format_exact(amount, cur) for _, lines in groups for _, amount, _ in lines]
    width = max([len(a) for a in amounts] + [len(format_exact(rating.exact_total, cur))])
    out = ["", "Charges:"]
    for title, lines in groups:
        out.append(f"  {title}")
        for description, amount, detail in lines:
            out.append(f"    {format_exact(amount, cur).rjust(width)} {cur}  {description}")
            out.extend(f"    {' ' * (width + len(cur) + 3)}{text}" for text in detail)
    out += [
        "",
        f"Sum of the lines (exact): {format_exact(rating.exact_total, cur)} {cur}",
        f"Subtotal = the sum rounded once, half-even, to the minor unit: "
        f"{format_money(doc.subtotal, cur)}",
    ]
    if rating.metered_events:
        out.append(f"Metered events rated: {rating.metered_events:,}")
    return out


def _rated_html(doc: InvoiceIssued, rating: RatingSummary) -> list[str]:
    cur = doc.currency
    parts = [
        "<h3>Charges</h3>",
        '<table class="charges"><tr><th>Charge</th><th>How</th><th>Amount</th></tr>',
    ]
    for title, lines in _rated_groups(doc, rating):
        parts.append(f'<tr><th colspan="3" style="text-align:left">{_e(title)}</th></tr>')
        for description, amount, detail in lines:
            parts.append(
                f"<tr><td>{_e(description)}</td><td>{'<br>'.join(_e(t) for t in detail)}</td>"
                f'<td style="text-align:right">{_e(format_exact(amount, cur))} {_e(cur)}</td></tr>'
            )
    parts += [
        "</table>",
        '<table class="rating">',
        f"<tr><th>Sum of the lines (exact)</th><td>{_e(format_exact(rating.exact_total, cur))} "
        f"{_e(cur)}</td></tr>",
        "<tr><th>Subtotal (the sum rounded once, half-even, to the minor unit)</th>"
        f"<td>{_e(format_money(doc.subtotal, cur))}</td></tr>",
    ]
    if rating.metered_events:
        parts.append(f"<tr><th>Metered events rated</th><td>{rating.metered_events:,}</td></tr>")
    parts.append("</table>")
    return parts


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
