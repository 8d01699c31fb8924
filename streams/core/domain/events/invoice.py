"""The invoice events on ``billing.invoices.v1``: ``invoice.issued`` (with its rated
summary), ``credit_note.issued``, ``invoice.voided``.
"""

from __future__ import annotations

from datetime import date
from typing import Annotated, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from streams.core.domain.events.account import (
    Code,
)
from streams.core.domain.events.fields import (
    MAX_INT64,
    TEXT_PATTERN,
    Currency,
    CustomerId,
    DocumentNumber,
    DocumentRef,
    EventData,
    Int32,
    Name,
    Period,
    Recipient,
    Revision,
    Text64,
    Text1024,
    Text2000,
    UtcDateTime,
)
from streams.core.domain.money import (
    Amount,
    Quantity,
)


class TaxAmount(BaseModel):
    """Tax of one rate on an invoice: ``amount`` is rounded once (half-even)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tax_code: Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]
    rate: Amount
    taxable_amount: Amount
    amount: Amount


class LineSummary(BaseModel):
    """One of the largest lines of an invoice, for the email and subscribers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    description: Text1024
    amount: Amount
    quantity: Quantity | None = None
    unit: Text64 | None = None


class SourceRange(BaseModel):
    """Kafka coordinates of the events an invoice was built from (invariant 6)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,249}$")]
    partition: Int32
    first_offset: Annotated[int, Field(ge=0, le=MAX_INT64)]
    last_offset: Annotated[int, Field(ge=0, le=MAX_INT64)]


#
# What a rated invoice (metered usage priced by a plan; docs/rating.md) adds to
# ``invoice.issued``: every charge line with how its amount was computed, the
# pre-priced lines per plan version, the segments and the exact sum of the lines
# (the subtotal is that sum rounded once). All optional and omitted from the JSON
# when absent, so a pure pass-through invoice's event is what it always was.


class _Summary(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DayRange(_Summary):
    """Days ``first`` to ``last``, both included (UTC calendar days)."""

    first: date
    last: date


class TierSummary(_Summary):
    """The part of a quantity that fell in one tier: quantities above ``above`` up to
    and including ``up_to`` (None: the open last tier); ``amount = units *
    unit_price + flat_amount``, exact."""

    tier: Annotated[int, Field(ge=1)]
    above: Quantity
    up_to: Quantity | None = None
    units: Quantity
    unit_price: Amount
    flat_amount: Amount
    amount: Amount


class PackageSummary(_Summary):
    """``packages`` started packages of ``package_size`` units at ``price``, counted
    after ``free_units``."""

    package_size: Quantity
    price: Amount
    free_units: Quantity
    packages: Annotated[int, Field(ge=0)]


class ProrationSummary(_Summary):
    """A fee for part of a period: ``full_amount * days / days_in_period`` (12
    decimal places, half-even)."""

    days: Annotated[int, Field(ge=0)]
    days_in_period: Annotated[int, Field(ge=28, le=31)]
    full_amount: Amount


class TrueUpSummary(_Summary):
    """A minimum commitment: ``minimum`` (prorated) against ``charged``, the exact sum
    of the segment's other lines; the true-up line is ``minimum - charged``."""

    minimum: Amount
    charged: Amount


class ChargeSummary(_Summary):
    """One rated charge line of an invoice (:class:`streams.core.domain.rating.ChargeLine`):
    the plan version and charge it comes from, the metric and quantity, and how the
    exact ``amount`` was computed — ``unit_price`` (per unit), ``tiers`` (graduated:
    every tier touched; volume: the one tier), ``package``, ``proration`` (a fixed
    fee or minimum for part of the period), ``true_up`` (minimum). ``line_id`` is
    deterministic (period, plan, version, charge, group): also the tax line id."""

    line_id: str
    plan_code: Code
    plan_version: Annotated[int, Field(ge=1)]
    charge_code: Code
    charge_model: str
    description: str
    days: tuple[DayRange, ...] = ()
    metric: str | None = None
    group_value: str | None = None
    unit: str | None = None
    quantity: Quantity | None = None
    unit_price: Amount | None = None
    tiers: tuple[TierSummary, ...] = ()
    package: PackageSummary | None = None
    proration: ProrationSummary | None = None
    true_up: TrueUpSummary | None = None
    amount: Amount


class PassThroughSummary(_Summary):
    """The pre-priced (``usage.recorded``) lines billed under one plan version, or at
    cost (plan None) for a customer without a subscription: ``lines`` of them,
    ``cost`` their exact sum, ``amount`` what is billed (``cost * (1 +
    markup_percent / 100)`` line by line, exact)."""

    plan_code: Code | None = None
    plan_version: Annotated[int, Field(ge=1)] | None = None
    markup_percent: Amount | None = None
    lines: Annotated[int, Field(ge=0)]
    cost: Amount
    amount: Amount


class SegmentSummary(_Summary):
    """The days of the period under one plan version (docs/rating.md "Segments")."""

    plan_code: Code
    plan_version: Annotated[int, Field(ge=1)]
    days: tuple[DayRange, ...]
    day_count: Annotated[int, Field(ge=0)]
    days_in_period: Annotated[int, Field(ge=28, le=31)]


class RatingSummary(_Summary):
    """How a rated invoice relates its lines to its subtotal: ``exact_total`` is the
    exact sum of every line (charges and pre-priced lines); the ``subtotal`` is that
    sum rounded once, half-even, to the minor unit. ``metered_events``: the distinct
    ``usage.metered`` events rated."""

    segments: tuple[SegmentSummary, ...] = ()
    metered_events: Annotated[int, Field(ge=0)] = 0
    pass_through: tuple[PassThroughSummary, ...] = ()
    exact_total: Amount


def _is_none(value: object) -> bool:
    """Leave an optional field out of the JSON when it is None (rated-invoice fields)."""
    return value is None


class InvoiceIssued(EventData):
    """An invoice revision was issued (``invoice.issued``). Amounts in ``currency`` units:
    ``subtotal`` and each tax rounded once; ``total = subtotal + tax_total``."""

    event_type: ClassVar[str] = "invoice.issued"

    invoice_id: DocumentRef
    invoice_number: DocumentNumber
    revision: Revision
    customer_id: CustomerId
    customer_name: Name
    email: Recipient
    billing_period: Period
    currency: Currency
    line_count: Int32
    subtotal: Amount
    tax_total: Amount
    total: Amount
    taxes: tuple[TaxAmount, ...] = ()
    largest_lines: tuple[LineSummary, ...] = ()
    issued_at: UtcDateTime
    #: Invoice id of the revision this one replaces (after a credit note), if any.
    supersedes_invoice_id: DocumentRef | None = None
    source: tuple[SourceRange, ...] = ()
    #: Rated invoices only (absent from the JSON otherwise, so an invoice without
    #: rating serialises exactly as before these fields existed): every charge line,
    #: in invoice order.
    charges: tuple[ChargeSummary, ...] | None = Field(default=None, exclude_if=_is_none)
    #: Rated invoices only (absent otherwise): segments, pre-priced lines per plan
    #: version, and the exact sum of the lines that the subtotal rounds.
    rating: RatingSummary | None = Field(default=None, exclude_if=_is_none)


class CreditedLine(BaseModel):
    """One invoice line a partial credit note credits: the line's number on the invoice
    revision, the amount and the tax credited (currency units, minor-unit precision)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    line_no: Annotated[int, Field(ge=1, le=2147483647)]
    amount: Amount
    tax: Amount


class CreditNoteIssued(EventData):
    """A credit note on an issued invoice revision (``credit_note.issued``). Amounts are
    positive numbers credited back to the customer. A full note (a replay's correction,
    no ``lines``) credits what was still open on the revision, which it supersedes; a
    partial note (``lines``: the lines it credits) leaves the revision issued
    (docs/invoices.md "Partial credit notes")."""

    event_type: ClassVar[str] = "credit_note.issued"

    credit_note_id: DocumentRef
    credit_note_number: DocumentNumber
    invoice_id: DocumentRef
    invoice_number: DocumentNumber
    revision: Revision
    customer_id: CustomerId
    customer_name: Name
    email: Recipient
    billing_period: Period
    currency: Currency
    subtotal: Amount
    tax_total: Amount
    total: Amount
    reason: Text2000
    issued_at: UtcDateTime
    #: Partial notes only (absent from the JSON of a full note, which serialises exactly
    #: as before this field existed): the credited lines, in the order given.
    lines: tuple[CreditedLine, ...] | None = Field(default=None, exclude_if=_is_none)


class InvoiceVoided(EventData):
    """An invoice revision was voided without replacement (``invoice.voided``)."""

    event_type: ClassVar[str] = "invoice.voided"

    invoice_id: DocumentRef
    invoice_number: DocumentNumber
    revision: Revision
    customer_id: CustomerId
    billing_period: Period
    reason: Text2000
    voided_at: UtcDateTime
