"""Exact decimal arithmetic for rating: a wide context in which any rounding is an
error, so a quantity * price or a sum is exact or raises, never silently rounded
(the default context keeps 28 digits: 15 digits of quantity * a 12-decimal price
would already round)."""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from decimal import ROUND_HALF_EVEN, Decimal

from streams.core.domain.rating.errors import RatingError

#: Significant digits of exact operations: far beyond any invoice.
PRECISION = 80


@contextmanager
def exact() -> Iterator[None]:
    """A context for exact arithmetic: wide, and ``Inexact`` trapped.

    Raises:
        RatingError: an operation inside would have had to round.
    """
    try:
        with decimal.localcontext() as ctx:
            ctx.prec = PRECISION
            ctx.traps[decimal.Inexact] = True
            ctx.traps[decimal.Rounded] = False
            yield
    except decimal.Inexact:
        raise RatingError(
            f"a rating amount exceeds {PRECISION} significant digits and cannot be exact"
        ) from None


def total(values: Iterable[Decimal]) -> Decimal:
    """The exact sum of ``values`` (``0`` when empty)."""
    result = Decimal(0)
    with exact():
        for value in values:
            result += value
    return result


def mul(left: Decimal, right: Decimal) -> Decimal:
    """The exact product."""
    with exact():
        return left * right


def sub(left: Decimal, right: Decimal) -> Decimal:
    """The exact difference."""
    with exact():
        return left - right


def quantize(value: Decimal, places: int) -> Decimal:
    """``value`` rounded half-even to ``places`` decimal places (the one place
    where rating rounds before the subtotal: a proration, see
    :func:`streams.core.domain.rating.pricing.prorate`)."""
    with decimal.localcontext() as ctx:
        ctx.prec = PRECISION
        return value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)


def divide(numerator: Decimal, denominator: Decimal) -> Decimal:
    """``numerator / denominator`` to :data:`PRECISION` digits (may round; only
    used before :func:`quantize`)."""
    with decimal.localcontext() as ctx:
        ctx.prec = PRECISION
        return numerator / denominator
