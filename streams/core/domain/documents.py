"""What a customer's document says, independent of where it is shown (pure).

A :class:`Document` is an issued invoice revision or a credit note as the email, the PDF
and the hosted page show it: its identity, the customer, its lines, its taxes and totals.
One set of templates renders it (``streams/adapters/documents/templates``, docs/email.md).

Two sources build one:

* the event (:func:`from_event`): what the email body shows. A pre-priced invoice's event
  carries only its largest lines (``lines_complete`` is then false and the templates say
  "the N largest of M lines");
* the stored rows (``streams.core.billing.store.documents``): every line, for the PDF and
  the hosted page, so those two are the same document whoever renders them.

Rated invoices show every charge line per plan version with how it was computed, then
the pre-priced usage per plan version (cost, markup, billed); their line amounts are exact
and add up to ``exact_total``, which the subtotal rounds once, half-even.

The document holds no status (superseded, voided): an issued document never changes, so
its PDF is the same bytes for as long as it exists (docs/email.md, "The PDF").
Money is ``Decimal`` in the currency's units; ``issued_at`` is UTC.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import Literal

from streams.core.domain.events import (
    ChargeSummary,
    CreditedLine,
    CreditNoteIssued,
    InvoiceIssued,
    RatingSummary,
    TaxAmount,
)
from streams.core.domain.formatting import (
    format_exact,
    format_quantity,
    oneline,
)

__all__ = [
    "Document",
    "DocumentKind",
    "DocumentLine",
    "DocumentTax",
    "LineGroup",
    "credited_line",
    "from_event",
    "largest_only",
    "rated_groups",
]

DocumentKind = Literal["invoice", "credit_note"]


@dataclass(frozen=True)
class DocumentTax:
    """One tax of a document: code, rate (a fraction, ``0.065``), taxable amount and tax."""

    code: str
    rate: Decimal
    taxable_amount: Decimal
    amount: Decimal


@dataclass(frozen=True)
class DocumentLine:
    """One line as shown: description, amount (exact), quantity and unit when known, and
    how a rated charge was computed (``detail``, one sentence each)."""

    description: str
    amount: Decimal
    quantity: Decimal | None = None
    unit: str | None = None
    detail: tuple[str, ...] = ()


@dataclass(frozen=True)
class LineGroup:
    """Lines under one heading (a plan version of a rated invoice; ``title`` None for the
    lines of a pre-priced invoice)."""

    title: str | None
    lines: tuple[DocumentLine, ...]


@dataclass(frozen=True)
class Document:
    """An issued invoice revision or credit note, as the customer reads it.

    ``document_id`` is the invoice id (one per revision) or the credit note id, lowercase
    UUID text. ``groups`` hold the lines shown; ``line_count`` is how many lines the
    document has in all and ``lines_complete`` whether ``groups`` show every one of them.
    ``exact_total`` (rated invoices) is the exact sum of the lines the subtotal rounds.
    Credit notes name the invoice revision they credit and the reason.
    """

    kind: DocumentKind
    document_id: str
    number: str
    customer_id: str
    customer_name: str
    billing_period: str
    currency: str
    issued_at: datetime
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    taxes: tuple[DocumentTax, ...] = ()
    groups: tuple[LineGroup, ...] = ()
    line_count: int = 0
    lines_complete: bool = True
    revision: int = 1
    exact_total: Decimal | None = None
    metered_events: int = 0
    supersedes_invoice_id: str | None = None
    credited_invoice_id: str | None = None
    credited_invoice_number: str | None = None
    reason: str | None = None
    #: A partial credit note (docs/invoices.md "Partial credit notes"): it credits the
    #: lines in ``groups`` and leaves the invoice issued; a full note cancels it.
    partial: bool = False

    @property
    def lines(self) -> tuple[DocumentLine, ...]:
        """Every line shown, in order, across the groups."""
        return tuple(line for group in self.groups for line in group.lines)

    @property
    def title(self) -> str:
        """``"Invoice INV-2026-10-000042"`` or ``"Credit note CN-…"``."""
        what = "Invoice" if self.kind == "invoice" else "Credit note"
        return f"{what} {self.number}"


def taxes_of(taxes: Iterable[TaxAmount]) -> tuple[DocumentTax, ...]:
    """The document taxes of an event's (or a stored invoice's) tax amounts."""
    return tuple(
        DocumentTax(oneline(t.tax_code), t.rate, t.taxable_amount, t.amount) for t in taxes
    )


def charge_detail(charge: ChargeSummary, currency: str) -> tuple[str, ...]:
    """How a charge's amount was computed, one sentence each (exact figures)."""
    unit = f" {oneline(charge.unit)}" if charge.unit else ""
    out: list[str] = []
    if charge.quantity is not None and charge.unit_price is not None:
        out.append(
            f"{format_quantity(charge.quantity)}{unit} x {format_exact(charge.unit_price, currency)}"
        )
    elif charge.quantity is not None:
        out.append(f"{format_quantity(charge.quantity)}{unit}")
    for tier in charge.tiers:
        bound = "∞" if tier.up_to is None else format_quantity(tier.up_to)
        flat = (
            f" + flat {format_exact(tier.flat_amount, currency)}"
            if not tier.flat_amount.is_zero()
            else ""
        )
        out.append(
            f"tier {tier.tier} (above {format_quantity(tier.above)} up to {bound}): "
            f"{format_quantity(tier.units)} x {format_exact(tier.unit_price, currency)}{flat} = "
            f"{format_exact(tier.amount, currency)}"
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
            f"at {format_exact(package.price, currency)}{free}"
        )
    if charge.proration is not None:
        proration = charge.proration
        out.append(
            f"{format_exact(proration.full_amount, currency)} x {proration.days}/"
            f"{proration.days_in_period} days"
        )
    if charge.true_up is not None:
        out.append(
            f"minimum {format_exact(charge.true_up.minimum, currency)} - charged "
            f"{format_exact(charge.true_up.charged, currency)}"
        )
    return tuple(out)


def _range_text(first: object, last: object) -> str:
    return str(first) if first == last else f"{first}..{last}"


def _plan_title(code: str | None, version: int | None, rating: RatingSummary) -> str:
    if code is None:
        return "Pre-priced usage at cost"
    days = [
        _range_text(d.first, d.last)
        for s in rating.segments
        if (s.plan_code, s.plan_version) == (code, version)
        for d in s.days
    ]
    return f"Plan {oneline(code)} v{version}" + (f" ({', '.join(days)})" if days else "")


def rated_groups(
    charges: Sequence[ChargeSummary], rating: RatingSummary, currency: str
) -> tuple[LineGroup, ...]:
    """A rated invoice's lines per plan version, in segment order, then pre-priced usage
    at cost: each charge with how it was computed, and the pre-priced usage of each plan
    version as one line (count of lines, cost, markup or discount, billed amount).

    Raises:
        UnknownCurrency: not a currency we bill in.
    """
    groups: dict[tuple[str | None, int | None], list[DocumentLine]] = {}
    for segment in rating.segments:
        groups.setdefault((segment.plan_code, segment.plan_version), [])
    for charge in charges:
        groups.setdefault((charge.plan_code, charge.plan_version), []).append(
            DocumentLine(
                description=oneline(charge.description),
                amount=charge.amount,
                quantity=charge.quantity,
                unit=charge.unit,
                detail=charge_detail(charge, currency),
            )
        )
    for part in rating.pass_through:
        markup = (
            ""
            if part.markup_percent is None or part.markup_percent.is_zero()
            else f", {'markup' if part.markup_percent > 0 else 'discount'} "
            f"{format_quantity(abs(part.markup_percent))}%"
        )
        groups.setdefault((part.plan_code, part.plan_version), []).append(
            DocumentLine(
                description=f"Pre-priced usage ({part.lines:,} line(s))",
                amount=part.amount,
                detail=(f"cost {format_exact(part.cost, currency)}{markup}",),
            )
        )
    return tuple(
        LineGroup(_plan_title(code, version, rating), tuple(lines))
        for (code, version), lines in groups.items()
        if lines
    )


def credited_line(line_no: int, tax: Decimal, description: str | None = None) -> str:
    """The description of a credited line on a partial credit note."""
    name = f"line {line_no}" if description is None else f"line {line_no}: {description}"
    return f"{name} (tax credited {tax})"


def _credited_groups(lines: Iterable[CreditedLine]) -> tuple[LineGroup, ...]:
    shown = tuple(
        DocumentLine(credited_line(line.line_no, line.tax), line.amount) for line in lines
    )
    return (LineGroup(None, shown),) if shown else ()


def largest_only(doc: Document, max_lines: int) -> Document:
    """``doc`` showing at most ``max_lines`` of its lines: a pre-priced invoice of more
    lines keeps its largest ones (by absolute amount, ties in line order), largest first,
    with ``lines_complete`` false; any other document is returned unchanged.

    The PDF shows this view (docs/email.md, "The PDF"): its cost grows with every line
    laid out, so a document of thousands of usage lines gets its largest lines and every
    line goes in a CSV file beside it. Rated invoices show every charge line: their
    count is bounded by the price book, not by the usage.

    Raises:
        ValueError: ``max_lines`` is below 1.
    """
    if max_lines < 1:
        raise ValueError(f"max_lines must be at least 1, got {max_lines}")
    if doc.kind != "invoice" or doc.exact_total is not None or not doc.lines_complete:
        return doc
    lines = doc.lines
    if len(lines) <= max_lines:
        return doc
    order = sorted(range(len(lines)), key=lambda i: (-abs(lines[i].amount), i))
    shown = tuple(lines[i] for i in order[:max_lines])
    return replace(doc, groups=(LineGroup(None, shown),), lines_complete=False)


def from_event(doc: InvoiceIssued | CreditNoteIssued, *, max_lines: int | None = None) -> Document:
    """The document an ``invoice.issued`` or ``credit_note.issued`` event announces, with
    the lines the event carries (a pre-priced invoice: its largest lines only, at most
    ``max_lines`` of them when given).

    Raises:
        UnknownCurrency: not a currency we bill in.
    """
    if isinstance(doc, CreditNoteIssued):
        return Document(
            kind="credit_note",
            document_id=doc.credit_note_id.lower(),
            number=oneline(doc.credit_note_number),
            customer_id=doc.customer_id,
            customer_name=oneline(doc.customer_name),
            billing_period=doc.billing_period,
            currency=doc.currency,
            issued_at=doc.issued_at,
            subtotal=doc.subtotal,
            tax_total=doc.tax_total,
            total=doc.total,
            revision=doc.revision,
            credited_invoice_id=doc.invoice_id.lower(),
            credited_invoice_number=oneline(doc.invoice_number),
            reason=oneline(doc.reason),
            partial=doc.lines is not None,
            groups=_credited_groups(doc.lines or ()),
            line_count=len(doc.lines or ()),
        )
    if doc.rating is not None:
        groups = rated_groups(doc.charges or (), doc.rating, doc.currency)
        complete = True
    else:
        lines = tuple(
            DocumentLine(oneline(line.description), line.amount, line.quantity, line.unit)
            for line in (
                doc.largest_lines if max_lines is None else doc.largest_lines[: max(0, max_lines)]
            )
        )
        groups = (LineGroup(None, lines),) if lines else ()
        complete = len(lines) >= doc.line_count
    return Document(
        kind="invoice",
        document_id=doc.invoice_id.lower(),
        number=oneline(doc.invoice_number),
        customer_id=doc.customer_id,
        customer_name=oneline(doc.customer_name),
        billing_period=doc.billing_period,
        currency=doc.currency,
        issued_at=doc.issued_at,
        subtotal=doc.subtotal,
        tax_total=doc.tax_total,
        total=doc.total,
        taxes=taxes_of(doc.taxes),
        groups=groups,
        line_count=doc.line_count,
        lines_complete=complete,
        revision=doc.revision,
        exact_total=None if doc.rating is None else doc.rating.exact_total,
        metered_events=0 if doc.rating is None else doc.rating.metered_events,
        supersedes_invoice_id=doc.supersedes_invoice_id,
    )
