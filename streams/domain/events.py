"""The contracts of the pipeline's topics: CloudEvents envelopes and their data.

One place per contract (CONVENTIONS §3): every event's data is a frozen pydantic
model with ``extra="forbid"`` and a ``schema_version``; money is :data:`Amount`
(an exact ``Decimal``, a decimal *string* on the wire) with an ISO 4217 currency
code; times are UTC. JSON Schema files in ``schemas/`` are generated from these
models (``invoicing schemas export``) and a test fails when they are stale.

Wire form: the CloudEvents Kafka protocol binding, **binary content mode**
(CloudEvents 1.0.2, kafka-protocol-binding §3.2): the record value is the event's
``data`` as JSON, the attributes travel as headers ``ce_specversion``, ``ce_id``,
``ce_source``, ``ce_type``, ``ce_time``, ``ce_subject`` and ``content-type``, and
the record key is the customer id. See :mod:`streams.domain.codec`.

Event types (past tense, DESIGN §2 "Topics"):

===============================  ==================================  ==========================
type                             data model                          topic
===============================  ==================================  ==========================
``customer.upserted``            :class:`CustomerUpserted`           billing.account-events.v1
``usage.recorded``               :class:`UsageRecorded`              billing.account-events.v1
``billing_period.closed``        :class:`BillingPeriodClosed`        billing.account-events.v1
``usage.metered``                :class:`UsageMetered`               billing.account-events.v1
``subscription.started``         :class:`SubscriptionStarted`        billing.account-events.v1
``subscription.changed``         :class:`SubscriptionChanged`        billing.account-events.v1
``subscription.ended``           :class:`SubscriptionEnded`          billing.account-events.v1
``invoice.issued``               :class:`InvoiceIssued`              billing.invoices.v1
``credit_note.issued``           :class:`CreditNoteIssued`           billing.invoices.v1
``invoice.voided``               :class:`InvoiceVoided`              billing.invoices.v1
``billable_metric.published``    :class:`BillableMetricPublished`    billing.price-book.v1
``plan_version.published``       :class:`PlanVersionPublished`       billing.price-book.v1
===============================  ==================================  ==========================
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from streams.domain.money import (
    DECIMAL_PATTERN,
    Amount,
    InvalidAmount,
    Quantity,
    canonical_decimal,
    contract_decimal,
    parse_decimal,
)
from streams.domain.periods import PERIOD_PATTERN, BillingPeriod

#: Namespace of the deterministic (uuid5) event and document ids of this project.
ID_NAMESPACE = uuid.UUID("6f1c8a52-3d0e-4f7b-9a55-2b7f0c1e9d41")

CURRENCY_PATTERN = r"^[A-Z]{3}$"


#: Earliest instant an event may carry (UTC): nothing billed here happened before it,
#: and billing periods start at 1970-01 (:class:`~streams.domain.periods.BillingPeriod`).
EARLIEST_INSTANT = datetime(1970, 1, 1, tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("datetime must carry a time zone (UTC)")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+05:00: no such UTC datetime (found by fuzzing)
        raise ValueError("datetime is out of range once converted to UTC") from None
    if utc < EARLIEST_INSTANT:
        raise ValueError("datetime is before 1970-01-01T00:00:00Z")
    return utc


#: A timezone-aware datetime normalised to UTC, from 1970 to the year 9999; naive
#: values are refused.
UtcDateTime = Annotated[
    datetime,
    AfterValidator(_utc),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "description": "RFC 3339 date-time with an offset, from 1970-01-01T00:00:00Z to "
            "the year 9999 in UTC.",
        }
    ),
]

#: Characters no text field accepts (issue 10): the C0 control characters other than
#: TAB, LF and CR (NUL, which PostgreSQL cannot store in ``text``; ESC; BEL; …), DEL
#: and the C1 controls; the bidirectional embedding, override and isolate controls
#: U+202A-U+202E and U+2066-U+2069 (text that displays unlike its content,
#: CVE-2021-42574). Lone surrogates (``"\ud800"`` in JSON) are refused as well: they
#: are no Unicode characters and have no UTF-8 form (RFC 7493, I-JSON §2.1). TAB, LF
#: and CR stay: FOCUS descriptions span lines, and whoever renders text into a
#: line-oriented format (mail headers) folds it there (``streams.email.render``).
TEXT_PATTERN = (
    r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]*$"
)
#: An email address: one ``@``, no white space, no control characters.
EMAIL_PATTERN = r"^[^@\s\u0000-\u001f\u007f-\u009f]+@[^@\s\u0000-\u001f\u007f-\u009f]+$"
#: Largest value of a PostgreSQL ``integer`` (revisions, counts, plan versions, partitions).
MAX_INT32 = 2**31 - 1
#: Largest value of a PostgreSQL ``bigint`` (offsets, fencing numbers).
MAX_INT64 = 2**63 - 1

#: Text of at most N characters, without the characters :data:`TEXT_PATTERN` refuses.
Text64 = Annotated[str, Field(max_length=64, pattern=TEXT_PATTERN)]
Text128 = Annotated[str, Field(max_length=128, pattern=TEXT_PATTERN)]
Text256 = Annotated[str, Field(max_length=256, pattern=TEXT_PATTERN)]
Text512 = Annotated[str, Field(max_length=512, pattern=TEXT_PATTERN)]
Text1024 = Annotated[str, Field(max_length=1024, pattern=TEXT_PATTERN)]
Text2000 = Annotated[str, Field(max_length=2000, pattern=TEXT_PATTERN)]
#: A person's or company's name: 1 to 512 characters.
Name = Annotated[str, Field(min_length=1, max_length=512, pattern=TEXT_PATTERN)]
#: A document id: 1 to 64 characters.
DocumentRef = Annotated[str, Field(min_length=1, max_length=64, pattern=TEXT_PATTERN)]
#: A document number (``INV-2024-09-000042``): 1 to 64 characters, written by the
#: issuance from a counter (whoever renders it escapes it, ``streams.email.render``).
DocumentNumber = Annotated[str, Field(min_length=1, max_length=64)]
Email = Annotated[str, Field(pattern=EMAIL_PATTERN, max_length=320)]
#: The recipient named on an invoice event: bounded text; whether it is an address
#: is the email sender's business (a bad one is a recorded render failure).
Recipient = Annotated[str, Field(max_length=320, pattern=TEXT_PATTERN)]
Int32 = Annotated[int, Field(ge=0, le=MAX_INT32)]
Revision = Annotated[int, Field(ge=1, le=MAX_INT32)]

#: Customer id (the Kafka key). "/" is allowed: real provider account ids contain it
#: (Azure "/subscriptions/<uuid>" in the FOCUS sample).
CustomerId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/-]+$")]
Period = Annotated[str, Field(pattern=PERIOD_PATTERN)]
Currency = Annotated[str, Field(pattern=CURRENCY_PATTERN)]


def deterministic_id(*parts: str) -> str:
    """A stable UUID (v5) from ``parts``: the same inputs give the same id, so a
    resend of the same fact deduplicates downstream."""
    return str(uuid.uuid5(ID_NAMESPACE, "\x1f".join(parts)))


class EventData(BaseModel):
    """Base of every event's data: frozen, no unknown fields, versioned."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=False)

    #: CloudEvents ``type`` of events carrying this data.
    event_type: ClassVar[str]
    schema_version: Literal[1] = 1

    def record_key(self) -> str:
        """The Kafka record key (and CloudEvents ``subject``) of events carrying this
        data: the customer id for account and invoice events; the entry's key for
        price book publications (:class:`PlanVersionPublished`)."""
        return str(getattr(self, "customer_id"))  # noqa: B009 - every other event names its customer


# --------------------------------------------------------------------------- account events


class CustomerUpserted(EventData):
    """A customer's billing identity was created or changed (``customer.upserted``)."""

    event_type: ClassVar[str] = "customer.upserted"

    customer_id: CustomerId
    name: Name
    #: Where invoices are emailed. FOCUS data has none: the importer derives a placeholder.
    email: Email
    currency: Currency
    #: Billing account the customer belongs to at the provider (FOCUS BillingAccountId), if any.
    billing_account_id: Text128 | None = None


class UsageRecorded(EventData):
    """One usage line: a charge for a customer in a billing period (``usage.recorded``).

    ``amount`` is the billed cost in ``currency`` units, exact, any sign (credits
    and adjustments are negative), with at most 18 integer digits and 20 decimals
    (:data:`~streams.domain.money.DECIMAL_PATTERN`); quantities likewise. Text fields
    are bounded and free of control characters (:data:`TEXT_PATTERN`).
    """

    event_type: ClassVar[str] = "usage.recorded"

    customer_id: CustomerId
    billing_period: Period
    amount: Amount
    currency: Currency
    quantity: Quantity | None = None
    unit: Text64 | None = None
    consumed_quantity: Quantity | None = None
    consumed_unit: Text64 | None = None
    sku_id: Text256 | None = None
    description: Text1024 | None = None
    region_id: Text64 | None = None
    charge_category: Text64 | None = None
    #: Start of the charge period (UTC).
    event_time: UtcDateTime
    #: Provider of the usage (FOCUS ProviderName), if known.
    provider: Text128 | None = None

    def period(self) -> BillingPeriod:
        return BillingPeriod.parse(self.billing_period)


class BillingPeriodClosed(EventData):
    """No more usage is expected for a customer's billing period: build the invoice
    from the usage that precedes this marker on the customer's partition."""

    event_type: ClassVar[str] = "billing_period.closed"

    customer_id: CustomerId
    billing_period: Period
    closed_at: UtcDateTime
    #: Why the marker was sent: the period's close, or an operator releasing a hold.
    reason: Literal["period_closed", "hold_released"] = "period_closed"
    #: Fencing number of the Redis lease the close-period run held (DESIGN "Redis").
    lease_fencing_token: Annotated[int, Field(ge=0, le=MAX_INT64)] | None = None


#: Code of a billable metric or a plan in the price book (:mod:`streams.domain.rating`).
CODE_PATTERN = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
Code = Annotated[str, Field(pattern=CODE_PATTERN)]

#: Name of an event property (``properties`` or ``values`` of ``usage.metered``).
PROPERTY_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
#: At most this many entries in each of ``properties`` and ``values``.
MAX_PROPERTIES = 32
#: At most this many characters in a text property value.
MAX_PROPERTY_TEXT = 256
#: At most this many characters in a decimal value on the wire (canonical form).
MAX_DECIMAL_TEXT = 48


def _canonical_value(value: object) -> Decimal:
    """A value of ``values``: any exact decimal form (``"1E+1"`` too), kept in canonical
    form, bounded like amounts (18 integer digits, 20 decimals) once canonical."""
    # pydantic turns ValueError into a ValidationError naming the entry.
    try:
        parsed = parse_decimal(value, what="value")
        # The magnitude is checked first: "1E+999999" must not expand to a million digits.
        if not parsed.is_zero() and abs(parsed.adjusted()) > MAX_DECIMAL_TEXT:
            raise InvalidAmount(f"decimal value longer than {MAX_DECIMAL_TEXT} characters")
        return contract_decimal(canonical_decimal(parsed), what="value")
    except InvalidAmount as exc:
        raise ValueError(str(exc)) from None


#: An exact decimal property value: a decimal *string* on the wire, in canonical form
#: (no exponent, no trailing fractional zeros, no ``-0``), so ``"10"``, ``"10.0"`` and
#: ``"1E+1"`` are one value with one wire form (and one payload hash).
PropertyDecimal = Annotated[
    Decimal,
    BeforeValidator(_canonical_value),
    PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": DECIMAL_PATTERN}),
]

PropertyName = Annotated[str, Field(pattern=PROPERTY_NAME_PATTERN)]
PropertyText = Annotated[str, Field(max_length=MAX_PROPERTY_TEXT, pattern=TEXT_PATTERN)]

_TEXT_MAP_SCHEMA = {
    "type": "object",
    "maxProperties": MAX_PROPERTIES,
    "propertyNames": {"pattern": PROPERTY_NAME_PATTERN},
    "additionalProperties": {
        "type": "string",
        "maxLength": MAX_PROPERTY_TEXT,
        "pattern": TEXT_PATTERN,
    },
}
_DECIMAL_MAP_SCHEMA = {
    "type": "object",
    "maxProperties": MAX_PROPERTIES,
    "propertyNames": {"pattern": PROPERTY_NAME_PATTERN},
    "additionalProperties": {
        "type": "string",
        "pattern": DECIMAL_PATTERN,
        "maxLength": MAX_DECIMAL_TEXT,
    },
}


class UsageMetered(EventData):
    """One metered usage event: a fact to be priced by the customer's plan
    (``usage.metered``). It carries no amount: rating turns it into money
    (:mod:`streams.domain.rating`).

    Properties are typed by the map they are in, never by JSON type (no JSON
    numbers on the wire, so no consumer reads a float):

    * ``properties`` — text values (at most 32, each at most 256 characters):
      what a billable metric filters on, groups by, or counts distinct values of
      (``unique_count``). Compared as exact strings.
    * ``values`` — exact decimals as decimal strings (at most 32): what ``sum``,
      ``max`` and ``latest`` aggregate. Stored and serialised in canonical form,
      so a resend with ``"10.0"`` where the first said ``"10"`` is the same payload,
      not a conflict. A name may not be in both maps.

    The billing period is the UTC month of ``event_time``
    (:class:`~streams.domain.periods.BillingPeriod`); the event id (CloudEvents
    ``ce_id``) is the deduplication key, as for ``usage.recorded``.
    """

    event_type: ClassVar[str] = "usage.metered"

    customer_id: CustomerId
    #: Code of the billable metric in the price book.
    metric: Code
    #: When the usage happened (UTC).
    event_time: UtcDateTime
    properties: Annotated[
        dict[PropertyName, PropertyText],
        Field(max_length=MAX_PROPERTIES),
        WithJsonSchema(_TEXT_MAP_SCHEMA),
    ] = Field(default_factory=dict)
    values: Annotated[
        dict[PropertyName, PropertyDecimal],
        Field(max_length=MAX_PROPERTIES),
        WithJsonSchema(_DECIMAL_MAP_SCHEMA),
    ] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names_are_unique(self) -> UsageMetered:
        both = sorted(set(self.properties) & set(self.values))
        if both:
            raise ValueError(f"names in both properties and values: {both}")
        return self


class _SubscriptionEvent(EventData):
    customer_id: CustomerId
    #: From when the fact holds (UTC). May be in the past (a backdated change) or
    #: the future; rating orders a customer's subscription events by this time.
    effective_at: UtcDateTime


class SubscriptionStarted(_SubscriptionEvent):
    """A customer subscribed to a plan version from ``effective_at``
    (``subscription.started``). One subscription per customer at a time: a start
    while subscribed acts as a change (see :mod:`streams.domain.rating.segments`)."""

    event_type: ClassVar[str] = "subscription.started"

    plan_code: Code
    plan_version: Annotated[int, Field(ge=1, le=MAX_INT32)]


class SubscriptionChanged(_SubscriptionEvent):
    """A customer's subscription moved to another plan or plan version from
    ``effective_at`` (``subscription.changed``)."""

    event_type: ClassVar[str] = "subscription.changed"

    plan_code: Code
    plan_version: Annotated[int, Field(ge=1, le=MAX_INT32)]


class SubscriptionEnded(_SubscriptionEvent):
    """A customer's subscription ended at ``effective_at`` (``subscription.ended``):
    no plan applies from that instant."""

    event_type: ClassVar[str] = "subscription.ended"

    reason: Text512 | None = None


SubscriptionEvent = SubscriptionStarted | SubscriptionChanged | SubscriptionEnded


# --------------------------------------------------------------------------- invoice events


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


# --------------------------------------------------------------------------- rated invoices
#
# What a rated invoice (issue 12: metered usage priced by a plan) adds to
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
    """One rated charge line of an invoice (:class:`streams.domain.rating.ChargeLine`):
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


class CreditNoteIssued(EventData):
    """A credit note cancelling an issued invoice revision (``credit_note.issued``).
    Amounts are positive numbers credited back to the customer."""

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


# --------------------------------------------------------------------------- price book


#: Pattern of a SHA-256 digest in lowercase hex.
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class BillableMetricPublished(EventData):
    """A billable metric of the price book was published (``billable_metric.published``,
    topic ``billing.price-book.v1``, key ``metric/<code>``). Immutable: a metric code
    is published with one definition for good (a redefinition needs a new code).

    ``definition`` is the metric as the price book states it, in canonical JSON
    (``schemas/price-book/price-book.schema.json``, ``$defs/BillableMetric``);
    ``content_sha256`` is the SHA-256 of that canonical JSON.
    """

    event_type: ClassVar[str] = "billable_metric.published"

    metric_code: Code
    definition: Annotated[
        dict[str, Any],
        WithJsonSchema(
            {
                "type": "object",
                "description": "A BillableMetric of the price book schema "
                "(schemas/price-book/price-book.schema.json#/$defs/BillableMetric), "
                "decimals as strings.",
            }
        ),
    ]
    content_sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    published_at: UtcDateTime

    def record_key(self) -> str:
        return f"metric/{self.metric_code}"


class PlanVersionPublished(EventData):
    """A plan version of the price book was published (``plan_version.published``,
    topic ``billing.price-book.v1``, key ``plan/<plan code>/<version>``). Immutable:
    publishing the same version with other content is refused; a price change is a
    new version.

    ``definition`` is the version as the price book states it (version,
    effective_from, currency, charges) in canonical JSON
    (``schemas/price-book/price-book.schema.json``, ``$defs/PlanVersion``);
    ``content_sha256`` is the SHA-256 of that canonical JSON. ``plan_name`` is the
    plan's name when the version was published (not part of the content).
    """

    event_type: ClassVar[str] = "plan_version.published"

    plan_code: Code
    plan_name: Annotated[str, Field(max_length=256)] | None = None
    plan_version: Annotated[int, Field(ge=1)]
    effective_from: date
    currency: Currency
    definition: Annotated[
        dict[str, Any],
        WithJsonSchema(
            {
                "type": "object",
                "description": "A PlanVersion of the price book schema "
                "(schemas/price-book/price-book.schema.json#/$defs/PlanVersion), "
                "decimals as strings.",
            }
        ),
    ]
    content_sha256: Annotated[str, Field(pattern=SHA256_PATTERN)]
    published_at: UtcDateTime

    def record_key(self) -> str:
        return f"plan/{self.plan_code}/{self.plan_version}"


AccountEventData = (
    CustomerUpserted
    | UsageRecorded
    | BillingPeriodClosed
    | UsageMetered
    | SubscriptionStarted
    | SubscriptionChanged
    | SubscriptionEnded
)
InvoiceEventData = InvoiceIssued | CreditNoteIssued | InvoiceVoided
PriceBookEventData = BillableMetricPublished | PlanVersionPublished

#: Event type → data model, for every type the pipeline knows.
EVENT_TYPES: dict[str, type[EventData]] = {
    model.event_type: model
    for model in (
        CustomerUpserted,
        UsageRecorded,
        BillingPeriodClosed,
        InvoiceIssued,
        CreditNoteIssued,
        InvoiceVoided,
        UsageMetered,
        SubscriptionStarted,
        SubscriptionChanged,
        SubscriptionEnded,
        BillableMetricPublished,
        PlanVersionPublished,
    )
}


def event_models(types: Iterable[str]) -> tuple[type[EventData], ...]:
    """The data models of the CloudEvents ``types``, in their order.

    Which types a topic carries is declared once, by name, in the topic registry
    (:attr:`streams.topics.TopicSpec.event_types`); this maps those names to models,
    e.g. ``event_models(INVOICES.event_types)`` for the ``allowed`` of a decoder.

    Raises:
        KeyError: a name that is no event type of :data:`EVENT_TYPES`.
    """
    models = []
    for name in types:
        if name not in EVENT_TYPES:
            raise KeyError(f"no event type named {name!r} in streams.domain.events.EVENT_TYPES")
        models.append(EVENT_TYPES[name])
    return tuple(models)


class Envelope(BaseModel):
    """A CloudEvents 1.0 event: context attributes plus ``data``.

    ``subject`` is the customer id and equals the Kafka record key.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    specversion: Literal["1.0"] = "1.0"
    id: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT_PATTERN)]
    source: Annotated[str, Field(min_length=1, max_length=512, pattern=TEXT_PATTERN)]
    type: str
    time: UtcDateTime
    subject: CustomerId
    datacontenttype: Literal["application/json"] = "application/json"
    data: Any

    @classmethod
    def wrap(
        cls, data: EventData, *, id: str, source: str, time: datetime | None = None
    ) -> Envelope:
        """An envelope for ``data`` with ``subject`` = its record key (the customer id,
        :meth:`EventData.record_key`)."""
        subject = data.record_key()
        return cls(
            id=id,
            source=source,
            type=data.event_type,
            time=time or datetime.now(UTC),
            subject=subject,
            data=data,
        )


def close_marker_id(
    customer_id: str, billing_period: str, reason: str = "period_closed", nonce: str = ""
) -> str:
    """Deterministic id of a close marker: a rerun of close-period sends the same id."""
    return deterministic_id("billing_period.closed", customer_id, billing_period, reason, nonce)


def invoice_id_for(customer_id: str, billing_period: str, revision: int) -> str:
    """Deterministic invoice id: also the tax document's idempotency key with the revision."""
    return deterministic_id("invoice", customer_id, billing_period, str(revision))
