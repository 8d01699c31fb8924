"""What each charge model computes from a quantity: pure, exact ``Decimal`` math.

Every function returns an exact amount in the plan's currency (never rounded:
the invoice subtotal is rounded once, :func:`streams.core.domain.money.round_money`),
except :func:`prorate`, the one rule that must divide (see there).

Tier bounds (Stripe, Price ``tiers``): ``up_to`` is inclusive; tier *i* covers
quantities above the previous bound up to and including its own; the last tier
is open. A fractional quantity is split exactly: 1000.5 with a bound at 1000
puts 1000 in the first tier and 0.5 in the next.

Sources of the rules, with their published examples (docs/rating.md "What vendors
publish", tested in ``tests/unit/rating/test_pricing.py``):

* graduated — Stripe ``tiers_mode=graduated``, Flexprice "slab": Zuplo 15,000
  calls → 600.00, Autumn → 107.00, Lago 250 → 155.00;
* volume — Stripe ``tiers_mode=volume``: Zuplo → 150.00, Lago with flat fees
  65,000 → 49.00, Flexprice without → 39.00;
* package — Lago: 5.00 per 100 units, first 100 free, 201 units → 10.00.

Quantity 0 costs nothing under every model (no unit falls in any tier, so no
flat amount is due; no package is started: Lago's choice, not Chargebee's
"at least one package").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from streams.core.domain.money import canonical_decimal
from streams.core.domain.rating import _exact
from streams.core.domain.rating.book import Tier
from streams.core.domain.rating.errors import RatingError

#: Decimal places of a prorated amount (as many as a unit price may have).
PRORATION_DECIMALS = 12


@dataclass(frozen=True)
class TierPart:
    """The part of a quantity that fell in one tier, and what it costs.

    * ``tier`` — the tier's 1-based position in the charge;
    * ``above`` / ``up_to`` — the tier's range: quantities above ``above`` up to
      and including ``up_to`` (``None``: open);
    * ``units`` — the quantity in this tier (exact, may be fractional);
    * ``amount`` = ``units * unit_price + flat_amount``.
    """

    tier: int
    above: Decimal
    up_to: Decimal | None
    units: Decimal
    unit_price: Decimal
    flat_amount: Decimal
    amount: Decimal


@dataclass(frozen=True)
class Priced:
    """An amount with how it was computed: the tiers used (graduated: each tier
    touched; volume: the one tier), or the packages billed."""

    amount: Decimal
    tiers: tuple[TierPart, ...] = ()
    packages: int | None = None


def _require_non_negative(quantity: Decimal, model: str) -> None:
    if quantity < 0:
        raise RatingError(f"{model} pricing needs a quantity >= 0, got {format(quantity, 'f')}")


def per_unit(quantity: Decimal, unit_price: Decimal) -> Priced:
    """``quantity * unit_price`` (any sign of quantity: a negative sum is a credit)."""
    return Priced(_exact.mul(quantity, unit_price))


def graduated(quantity: Decimal, tiers: Sequence[Tier]) -> Priced:
    """Each tier's units at that tier's price, plus the tier's flat amount when any
    unit falls in it (Stripe ``graduated``).

    Raises:
        RatingError: ``quantity < 0`` (tiers of a negative quantity mean nothing).
    """
    _require_non_negative(quantity, "graduated")
    parts: list[TierPart] = []
    above = Decimal(0)
    for position, tier in enumerate(tiers, start=1):
        if quantity <= above:
            break
        top = quantity if tier.up_to is None else min(quantity, tier.up_to)
        units = _exact.sub(top, above)
        amount = _exact.total((_exact.mul(units, tier.unit_price), tier.flat_amount))
        parts.append(
            TierPart(position, above, tier.up_to, units, tier.unit_price, tier.flat_amount, amount)
        )
        if tier.up_to is None:
            break
        above = tier.up_to
    return Priced(_exact.total(part.amount for part in parts), tuple(parts))


def volume(quantity: Decimal, tiers: Sequence[Tier]) -> Priced:
    """All units at the price of the tier the quantity falls in, plus that tier's
    flat amount (Stripe ``volume``). Quantity 0 falls in no tier: 0, no flat amount.

    Raises:
        RatingError: ``quantity < 0``.
    """
    _require_non_negative(quantity, "volume")
    if quantity == 0:
        return Priced(Decimal(0))
    above = Decimal(0)
    for position, tier in enumerate(tiers, start=1):
        if tier.up_to is None or quantity <= tier.up_to:
            amount = _exact.total((_exact.mul(quantity, tier.unit_price), tier.flat_amount))
            part = TierPart(
                position, above, tier.up_to, quantity, tier.unit_price, tier.flat_amount, amount
            )
            return Priced(amount, (part,))
        above = tier.up_to
    raise RatingError("the last tier is not open")  # validated in the book: unreachable


def package(
    quantity: Decimal, *, package_size: Decimal, price: Decimal, free_units: Decimal
) -> Priced:
    """``price`` per *started* package of ``package_size`` units, counted after
    ``free_units`` (Lago "package"). ``quantity <= free_units`` (0 included) costs 0.

    Raises:
        RatingError: ``quantity < 0``.
    """
    _require_non_negative(quantity, "package")
    billable = _exact.sub(quantity, free_units)
    if billable <= 0:
        return Priced(Decimal(0), packages=0)
    with _exact.exact():
        whole, rest = divmod(billable, package_size)
    packages = int(whole) + (1 if rest > 0 else 0)
    return Priced(_exact.mul(Decimal(packages), price), packages=packages)


def prorate(amount: Decimal, days: int, days_in_period: int) -> Decimal:
    """``amount * days / days_in_period`` (docs/rating.md "Proration": by day,
    fee * days used / days in the month, both ends included), to :data:`PRORATION_DECIMALS`
    decimal places, half-even.

    The one rounding before the subtotal: a fee divided by 28, 29, 30 or 31 days
    has no exact decimal. Twelve places keep the error below 10⁻¹² per line,
    far under a minor unit. A full period (``days == days_in_period``) is the
    amount itself, exactly.

    Raises:
        RatingError: ``days`` outside ``0..days_in_period``.
    """
    if not 0 <= days <= days_in_period or days_in_period <= 0:
        raise RatingError(f"cannot prorate {days} day(s) of a {days_in_period}-day period")
    if days == days_in_period:
        return amount
    share = _exact.divide(_exact.mul(amount, Decimal(days)), Decimal(days_in_period))
    return canonical_decimal(_exact.quantize(share, PRORATION_DECIMALS))
