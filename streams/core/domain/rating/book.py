"""The price book: billable metrics, and plans with immutable, effective-dated versions.

Shape (YAML, see ``examples/pricing/price-book.yaml`` and the JSON Schema
``schemas/price-book/price-book.schema.json`` generated from these models)::

    schema_version: 1
    metrics:                      # billable metrics: how one period's events become a quantity
      - code: api_calls
        aggregation: count        # count | sum | max | unique_count | latest
        property: ...             # required for sum/max/latest (a decimal of ``values``)
                                  # and unique_count (a text of ``properties``); not for count
        filter: {region: [eu, us]}   # optional: only events whose text property is listed
        group_by: region          # optional: one invoice line per value of this text property
    plans:
      - code: growth
        versions:                 # immutable; numbers strictly increasing
          - version: 1
            effective_from: 2024-01-01
            currency: USD
            charges:              # each with a ``code`` unique in the version and a ``model``
              - {code: platform, model: fixed, amount: 49}
              - {code: api, model: graduated, metric: api_calls, tiers: [...]}

Charge models (what each computes: :mod:`streams.core.domain.rating.pricing`):

==================  ==========================================================
``fixed``           ``amount`` per period, prorated by day for a partial period
``per_unit``        quantity * ``unit_price``
``graduated``       each tier's units at its ``unit_price`` + its ``flat_amount``
                    when any unit falls in it (Stripe ``graduated``)
``volume``          all units at the price of the tier the quantity falls in, + that
                    tier's ``flat_amount`` (Stripe ``volume``)
``package``         ``price`` per started package of ``package_size`` units, after
                    ``free_units`` (Lago "package")
``minimum``         minimum commitment per period: a true-up line when the plan's
                    charges fall short (Lago "minimum commitment"), prorated by day
``pass_through``    pre-priced ``usage.recorded`` lines, * (1 + ``markup_percent`` / 100)
==================  ==========================================================

Tier bounds follow Stripe: ``up_to`` is inclusive ("up to and including"), the
next tier starts just above it, and the last tier is open (``up_to: null``, or
``inf``); bounds must increase. A quantity is split exactly, also a fractional one.

Money and quantities are exact ``Decimal``: in YAML write them as numbers or
strings (the loader reads a YAML number's *text*, never a float); prices,
amounts and percentages take at most :data:`PRICE_DECIMALS` (12) decimal places,
as Stripe's ``unit_amount_decimal``. Money is in the plan version's ``currency``.

Validation reports **every** error with its path in the document
(``plans[1].versions[0].charges[2].tiers[3].up_to: must be greater than 1000``)
and, from YAML, its line: :func:`~streams.core.domain.rating.book_yaml.load_price_book`,
:class:`PriceBookError`.

This module holds the models; the value types are in
:mod:`~streams.core.domain.rating.book_values`, the rules across items in
:mod:`~streams.core.domain.rating.book_rules`, the YAML loader in
:mod:`~streams.core.domain.rating.book_yaml`.
"""

from __future__ import annotations

import builtins
from datetime import date
from decimal import Decimal
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from streams.core.domain.events import (
    CODE_PATTERN,
    PROPERTY_NAME_PATTERN,
    Code,
    GraceHours,
    PropertyName,
)
from streams.core.domain.rating.book_rules import (
    charge_issues,
    checked,
    metric_issues,
    reference_issues,
    tier_issues,
    version_issues,
)
from streams.core.domain.rating.book_values import (
    DECIMAL_AGGREGATIONS,
    METRIC_MODELS,
    PRICE_DECIMALS,
    Aggregation,
    BookCurrency,
    Name,
    NonNegativeQuantity,
    Percent,
    PositiveQuantity,
    Price,
    TierBound,
)


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BillableMetric(_Model):
    """A billable metric: which events (``usage.metered`` whose ``metric`` is
    ``code``, optionally filtered) aggregate into what quantity, per group value.

    ``filter`` keeps an event when, for **every** listed text property, its value
    is **one of** the listed values; other events of the metric are excluded (and
    counted as such). ``group_by`` names a text property: one quantity (and one
    invoice line) per value; an event without it goes to the group ``None``.
    """

    code: Code
    name: Name | None = None
    #: Unit shown on invoice lines (``calls``, ``GB``).
    unit: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    aggregation: Aggregation
    #: The value aggregated: a ``values`` decimal for sum/max/latest, a
    #: ``properties`` text for unique_count; none for count.
    property: PropertyName | None = None
    filter: dict[PropertyName, Annotated[tuple[str, ...], Field(min_length=1)]] = Field(
        default_factory=dict
    )
    group_by: PropertyName | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _property_fits_the_aggregation(cls, data: Any, handler: Any) -> Any:
        return checked(data, handler, metric_issues)

    @builtins.property  # the field "property" shadows the builtin in this class body
    def label(self) -> str:
        """What invoice lines call the metric: its name, else its code."""
        return self.name or self.code

    def reads_decimal(self) -> bool:
        """Whether the aggregation reads a decimal of ``values`` (else text or nothing)."""
        return self.aggregation in DECIMAL_AGGREGATIONS


class Tier(_Model):
    """One tier: units up to and including ``up_to`` (``None`` = open, last tier)."""

    #: Required, also for the open last tier (``null``): a forgotten bound is an
    #: error, not an open tier.
    up_to: TierBound
    unit_price: Price = Decimal(0)
    flat_amount: Price = Decimal(0)


class _ChargeBase(_Model):
    #: Unique within the plan version; part of every line's identity.
    code: Code
    #: Shown on invoice lines (default: the metric's name or the code).
    name: Name | None = None

    model: ClassVar[str]


class FixedFee(_ChargeBase):
    """A recurring fee of ``amount`` per period, prorated by day for a partial one."""

    model: Literal["fixed"]  # type: ignore[misc]
    amount: Price


class _MetricCharge(_ChargeBase):
    #: Code of the billable metric priced.
    metric: Code


class PerUnit(_MetricCharge):
    """Quantity * ``unit_price``."""

    model: Literal["per_unit"]  # type: ignore[misc]
    unit_price: Price


class _Tiered(_MetricCharge):
    tiers: Annotated[tuple[Tier, ...], Field(min_length=1)]

    @field_validator("tiers", mode="wrap")
    @classmethod
    def _bounds_increase_and_the_last_is_open(cls, tiers: Any, handler: Any) -> Any:
        return checked(tiers, handler, tier_issues)


class Graduated(_Tiered):
    """Each tier's units at its price, plus its flat amount when any unit falls in it."""

    model: Literal["graduated"]  # type: ignore[misc]


class Volume(_Tiered):
    """All units at the price of the tier the quantity falls in, plus its flat amount."""

    model: Literal["volume"]  # type: ignore[misc]


class Package(_MetricCharge):
    """``price`` per started package of ``package_size`` units, after ``free_units``."""

    model: Literal["package"]  # type: ignore[misc]
    package_size: PositiveQuantity
    price: Price
    free_units: NonNegativeQuantity = Decimal(0)


class MinimumCommitment(_ChargeBase):
    """The plan version's charges of a period come to at least ``amount`` (prorated
    by day for a partial period): a true-up line makes up the difference."""

    model: Literal["minimum"]  # type: ignore[misc]
    amount: Price


class PassThrough(_ChargeBase):
    """Pre-priced ``usage.recorded`` lines, each * (1 + ``markup_percent`` / 100);
    a negative percentage is a discount."""

    model: Literal["pass_through"]  # type: ignore[misc]
    markup_percent: Percent = Decimal(0)


MetricCharge = PerUnit | Graduated | Volume | Package
Charge = Annotated[
    FixedFee | PerUnit | Graduated | Volume | Package | MinimumCommitment | PassThrough,
    Field(discriminator="model"),
]


class PlanVersion(_Model):
    """One immutable version of a plan: its currency and charges, in force from
    ``effective_from`` (a UTC day). A subscription names its version; a day of a
    subscription before that date is a gap (a hold), not a price.

    Rules: charge codes unique; at most one ``minimum`` and one ``pass_through``;
    at most one charge per metric (two charges on one metric would bill its
    usage twice).
    """

    version: Annotated[int, Field(ge=1)]
    effective_from: date
    currency: BookCurrency
    charges: tuple[Charge, ...] = ()
    #: Hours an invoice under this version stays a draft after the close (absent: 0,
    #: unless the customer states its own; the customer's value wins; docs/invoices.md
    #: "Drafts and finalisation").
    invoice_grace_hours: GraceHours | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _charges_are_distinct(cls, data: Any, handler: Any) -> Any:
        return checked(data, handler, charge_issues)

    def charge_for(self, metric: str) -> PerUnit | Graduated | Volume | Package | None:
        """The charge pricing ``metric``, if any."""
        for charge in self.charges:
            if (
                isinstance(charge, PerUnit | Graduated | Volume | Package)
                and charge.metric == metric
            ):
                return charge
        return None

    @property
    def minimum(self) -> MinimumCommitment | None:
        return next((c for c in self.charges if isinstance(c, MinimumCommitment)), None)

    @property
    def pass_through(self) -> PassThrough | None:
        return next((c for c in self.charges if isinstance(c, PassThrough)), None)


class Plan(_Model):
    """A plan: its versions, numbers strictly increasing, ``effective_from`` never
    decreasing. Versions are immutable once published: a change is a new version."""

    code: Code
    name: Name | None = None
    versions: Annotated[tuple[PlanVersion, ...], Field(min_length=1)]

    @field_validator("versions", mode="wrap")
    @classmethod
    def _versions_increase(cls, versions: Any, handler: Any) -> Any:
        return checked(versions, handler, version_issues)

    def version(self, number: int) -> PlanVersion | None:
        return next((v for v in self.versions if v.version == number), None)


class PriceBook(_Model):
    """Billable metrics and plans. Codes are unique; every charge's metric is
    defined. An empty book is valid (pure pass-through customers need none).

    Build one from YAML with :func:`~streams.core.domain.rating.book_yaml.load_price_book`,
    from parsed data with :func:`~streams.core.domain.rating.book_yaml.price_book_from_data`;
    both report every error with its path.
    """

    schema_version: Literal[1] = 1
    metrics: tuple[BillableMetric, ...] = ()
    plans: tuple[Plan, ...] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _references_resolve(cls, data: Any, handler: Any) -> Any:
        return checked(data, handler, reference_issues)

    def metric(self, code: str) -> BillableMetric | None:
        return next((m for m in self.metrics if m.code == code), None)

    def plan(self, code: str) -> Plan | None:
        return next((p for p in self.plans if p.code == code), None)

    def plan_version(self, code: str, version: int) -> PlanVersion | None:
        """The version ``version`` of plan ``code``, or ``None`` when either is unknown."""
        plan = self.plan(code)
        return None if plan is None else plan.version(version)

    @property
    def metrics_by_code(self) -> dict[str, BillableMetric]:
        return {m.code: m for m in self.metrics}


def price_book_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12 keywords, validation mode) of a price book
    document, from the models: what an editor can check a YAML file against.
    Book-wide rules (unique codes, defined metrics, increasing tiers) are beyond
    JSON Schema; :func:`~streams.core.domain.rating.book_yaml.load_price_book` checks
    them."""
    schema = PriceBook.model_json_schema(mode="validation")
    schema["description"] = (
        "A price book of the invoicing pipeline: billable metrics and plans with "
        "immutable, effective-dated versions (streams/core/domain/rating/book.py). Validate a "
        "file with `invoicing plans validate FILE`: it also checks what JSON Schema "
        "cannot (unique codes, defined metrics, increasing tier bounds, the last tier open)."
    )
    return schema


__all__ = [
    "CODE_PATTERN",
    "DECIMAL_AGGREGATIONS",
    "METRIC_MODELS",
    "PRICE_DECIMALS",
    "PROPERTY_NAME_PATTERN",
    "Aggregation",
    "BillableMetric",
    "Charge",
    "FixedFee",
    "Graduated",
    "MetricCharge",
    "MinimumCommitment",
    "Package",
    "PassThrough",
    "PerUnit",
    "Plan",
    "PlanVersion",
    "PriceBook",
    "Tier",
    "Volume",
    "price_book_json_schema",
]
