"""What rating returns: a rated invoice, its charge and pass-through lines, its holds.

Values only (frozen dataclasses, exact ``Decimal``); :func:`streams.core.domain.rating.rate`
builds them, :func:`streams.core.domain.rating.priced.priced_invoice` turns one into what
the billing kernel issues.

* ``lines`` — one :class:`ChargeLine` per charge of each segment's plan version
  (and group value): plan code and version, charge code and model, metric,
  group value, quantity, unit price or the tier breakdown or the packages, the
  proration, and the amount, **exact** (unrounded);
* ``pass_through`` — one :class:`PassThroughLine` per pre-priced
  ``usage.recorded`` line, its markup applied, exact;
* ``holds`` — the gaps, each a :class:`Hold` with a code and a reason: the
  invoice must not be issued while there is one (``subtotal`` is then ``None``);
* ``subtotal`` — the exact sum of every line amount, rounded **once**, half-even,
  to the currency's minor unit (:func:`streams.core.domain.money.round_money`), the
  rule of :mod:`streams.core.domain.invoice`.

The hold codes and when each applies: :mod:`streams.core.domain.rating.rate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from enum import StrEnum

from streams.core.domain.invoice import UsageLine
from streams.core.domain.rating.pricing import TierPart
from streams.core.domain.rating.segments import Segment


class HoldCode(StrEnum):
    """Why a rated invoice cannot be issued (see the module docstring)."""

    NO_SUBSCRIPTION = "no_subscription"
    UNKNOWN_PLAN = "unknown_plan"
    VERSION_NOT_EFFECTIVE = "version_not_effective"
    CURRENCY_MISMATCH = "currency_mismatch"
    UNKNOWN_METRIC = "unknown_metric"
    UNPRICED_METRIC = "unpriced_metric"
    INVALID_USAGE = "invalid_usage"
    INVALID_QUANTITY = "invalid_quantity"
    PASS_THROUGH_NOT_PRICED = "pass_through_not_priced"


@dataclass(frozen=True)
class Hold:
    """A gap that holds the invoice: ``code``, a reason an operator can act on,
    and the plan version and metric concerned when there is one."""

    code: HoldCode
    message: str
    plan_code: str | None = None
    plan_version: int | None = None
    metric: str | None = None

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


@dataclass(frozen=True)
class Proration:
    """A fixed fee or minimum for part of a period: ``full_amount * days /
    days_in_period`` (see :func:`streams.core.domain.rating.pricing.prorate`)."""

    days: int
    days_in_period: int
    full_amount: Decimal


@dataclass(frozen=True)
class PackageDetail:
    """How a package charge counted: ``packages`` started packages of
    ``package_size`` units at ``price``, after ``free_units``."""

    package_size: Decimal
    price: Decimal
    free_units: Decimal
    packages: int


@dataclass(frozen=True)
class TrueUp:
    """A minimum commitment's comparison: ``minimum`` (prorated) against
    ``charged``, the exact sum of the segment's other lines; the true-up line's
    amount is ``minimum - charged``."""

    minimum: Decimal
    charged: Decimal


@dataclass(frozen=True)
class ChargeLine:
    """One rated line of a plan version's charge (and group value), in a segment.

    * ``line_id`` — deterministic (uuid5 of period, plan, version, charge, group):
      the same input gives the same id, for the tax document and the invoice;
    * ``days`` — the segment's day ranges (inclusive);
    * ``quantity`` — the metric's aggregate (``None`` for fixed fees and true-ups);
    * ``unit_price`` (per unit), ``tiers`` (graduated: each tier touched; volume:
      the one tier), ``package``, ``proration`` (fixed, minimum), ``true_up``
      (minimum) — how ``amount`` was computed;
    * ``amount`` — exact, in the invoice currency, never rounded.
    """

    line_id: str
    plan_code: str
    plan_version: int
    charge_code: str
    charge_model: str
    description: str
    days: tuple[tuple[date, date], ...]
    amount: Decimal
    metric: str | None = None
    group_value: str | None = None
    unit: str | None = None
    quantity: Decimal | None = None
    unit_price: Decimal | None = None
    tiers: tuple[TierPart, ...] = ()
    package: PackageDetail | None = None
    proration: Proration | None = None
    true_up: TrueUp | None = None


@dataclass(frozen=True)
class PassThroughLine:
    """A pre-priced ``usage.recorded`` line as billed: ``amount = usage.amount * (1
    + markup_percent / 100)``, exact. ``markup_percent`` and the plan are ``None``
    for a customer without a subscription (billed at cost, as today)."""

    usage: UsageLine
    amount: Decimal
    markup_percent: Decimal | None = None
    plan_code: str | None = None
    plan_version: int | None = None

    @property
    def line_id(self) -> str:
        """The usage event's id (as today: also the tax line id)."""
        return self.usage.event_id


@dataclass(frozen=True)
class RatedInvoice:
    """A customer's billing period, rated (see the module docstring).

    ``exact_total`` is the exact sum of every line; ``rounded_total`` that sum
    rounded once (half-even) to the minor unit: the preview's figure, and the
    ``subtotal`` unless the invoice is held.
    """

    period: str
    currency: str
    segments: tuple[Segment, ...]
    lines: tuple[ChargeLine, ...]
    pass_through: tuple[PassThroughLine, ...]
    holds: tuple[Hold, ...]
    exact_total: Decimal
    rounded_total: Decimal

    @property
    def held(self) -> bool:
        return bool(self.holds)

    @property
    def subtotal(self) -> Decimal | None:
        """The subtotal to issue, or ``None`` when the invoice is held."""
        return None if self.holds else self.rounded_total

    @property
    def line_count(self) -> int:
        return len(self.lines) + len(self.pass_through)
