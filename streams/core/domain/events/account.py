"""The account events on ``billing.account-events.v1``: customers, pre-priced and metered
usage, the close marker, subscriptions.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, ClassVar, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from streams.core.domain.events.fields import (
    MAX_INT32,
    MAX_INT64,
    TEXT_PATTERN,
    Currency,
    CustomerId,
    Email,
    EventData,
    Name,
    Period,
    Text64,
    Text128,
    Text256,
    Text512,
    Text1024,
    UtcDateTime,
)
from streams.core.domain.money import (
    DECIMAL_PATTERN,
    Amount,
    InvalidAmount,
    Quantity,
    canonical_decimal,
    contract_decimal,
    parse_decimal,
)
from streams.core.domain.periods import BillingPeriod

#: Longest grace period (hours): a year.
MAX_GRACE_HOURS = Decimal(8760)


def _grace_hours(value: object) -> Decimal:
    """A grace period in hours: an exact decimal (string on the wire), 0 to 8760, at most
    6 decimals (a fraction of an hour is allowed: 0.5 is 30 minutes)."""
    try:
        parsed = contract_decimal(value, what="invoice_grace_hours")
    except InvalidAmount as exc:
        raise ValueError(str(exc)) from None
    if parsed < 0 or parsed > MAX_GRACE_HOURS:
        raise ValueError(f"invoice_grace_hours must be between 0 and {MAX_GRACE_HOURS}")
    canonical = canonical_decimal(parsed)
    exponent = canonical.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -6:
        raise ValueError("invoice_grace_hours has at most 6 decimals")
    return canonical


#: A grace period in hours (docs/invoices.md "Drafts and finalisation").
GraceHours = Annotated[
    Decimal,
    BeforeValidator(_grace_hours),
    PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": DECIMAL_PATTERN,
            "description": "Hours, 0 to 8760, at most 6 decimals (docs/invoices.md).",
        }
    ),
]


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
    #: Hours an invoice of this customer stays a draft after the close (0: issued at the
    #: close). Absent: the plan version's grace period applies, else 0. The customer's
    #: value wins over the plan's (docs/invoices.md "Drafts and finalisation").
    invoice_grace_hours: GraceHours | None = None


class UsageRecorded(EventData):
    """One usage line: a charge for a customer in a billing period (``usage.recorded``).

    ``amount`` is the billed cost in ``currency`` units, exact, any sign (credits
    and adjustments are negative), with at most 18 integer digits and 20 decimals
    (:data:`~streams.core.domain.money.DECIMAL_PATTERN`); quantities likewise. Text fields
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
    #: Why the marker was sent: the period's close, an operator releasing a hold, or the
    #: finalisation of a draft (its grace period ended, or ``invoicing invoice finalize``;
    #: docs/invoices.md "Drafts and finalisation").
    reason: Literal["period_closed", "hold_released", "draft_finalize"] = "period_closed"
    #: Fencing number of the Redis lease the close-period run held (docs/design.md "Redis leases").
    lease_fencing_token: Annotated[int, Field(ge=0, le=MAX_INT64)] | None = None


#: Code of a billable metric or a plan in the price book (:mod:`streams.core.domain.rating`).
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
    (:mod:`streams.core.domain.rating`).

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
    (:class:`~streams.core.domain.periods.BillingPeriod`); the event id (CloudEvents
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
    while subscribed acts as a change (see :mod:`streams.core.domain.rating.segments`)."""

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
