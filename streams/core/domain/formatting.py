"""How amounts, quantities and rates are written on a document (pure).

One set of rules for the email, the PDF and the hosted page (docs/email.md):

* money at the currency's minor unit, half-even, with thousands separators:
  ``Decimal("1234.5"), "USD"`` → ``"1,234.50"``; ``"JPY"`` → ``"1,235"``
  (:func:`format_amount`, :func:`format_money` adds the ISO 4217 code);
* a rated line **exactly** (:func:`format_exact`), so the lines add up to the exact sum
  that the subtotal rounds once;
* a tax rate fraction as a percentage without trailing zeros (``0.065`` → ``"6.5%"``).

A zero never shows a sign (``-0.00`` reads as a debt of nothing). Amounts are ``Decimal``
in the currency's units and are never converted to float.

Errors: :class:`~streams.core.domain.money.UnknownCurrency` for a currency we do not bill
in, :class:`~streams.core.domain.money.InvalidAmount` for a non-finite amount.
"""

from __future__ import annotations

import re
from decimal import Decimal

from streams.core.domain.money import canonical_decimal, minor_unit_exponent, round_money

__all__ = [
    "format_amount",
    "format_exact",
    "format_money",
    "format_quantity",
    "format_rate",
    "oneline",
    "rounded",
]

_CONTROL_OR_SPACE = re.compile(r"[\s\x00-\x1f\x7f-\x9f]+")


def oneline(text: str) -> str:
    """Free text as one line: control characters and whitespace runs become one space."""
    return _CONTROL_OR_SPACE.sub(" ", text).strip()


def rounded(amount: Decimal, currency: str) -> Decimal:
    """``amount`` rounded half-even to ``currency``'s minor unit, a zero without sign.

    Raises:
        UnknownCurrency: not a currency we bill in.
    """
    value = round_money(amount, currency)
    return value.copy_abs() if value.is_zero() else value


def format_amount(amount: Decimal, currency: str) -> str:
    """``amount`` at ``currency``'s minor unit with thousands separators, no code:
    ``Decimal("1234.5"), "USD"`` → ``"1,234.50"``; ``"JPY"`` → ``"1,234"`` (half-even).

    Raises:
        UnknownCurrency: not a currency we bill in.
    """
    exponent = minor_unit_exponent(currency)
    return format(rounded(amount, currency), f",.{exponent}f")


def format_exact(amount: Decimal, currency: str) -> str:
    """``amount`` exactly, with thousands separators and at least the currency's minor
    unit of decimals (more when it has them), no code: ``Decimal("187.6536"), "USD"``
    → ``"187.6536"``; ``Decimal("199")`` → ``"199.00"``. Never rounds.

    Raises:
        UnknownCurrency: not a currency we bill in.
        InvalidAmount: not a finite amount.
    """
    exponent = minor_unit_exponent(currency)
    value = canonical_decimal(amount)
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
    return f"{format(percent, 'f')}%"
