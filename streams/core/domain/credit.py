"""The creditable-amount rule of a partial credit note (docs/invoices.md "Partial credit
notes"), pure: no I/O.

The database applies the same rule, under the invoice row's lock, in
``credit_invoice_lines()`` of migration 0021; this module states it in Python for the
operator's preview and the property tests (``tests/unit/test_credit_tax.py``).

Shapes: money ``Decimal`` in currency units; ``exponent`` is the currency's minor-unit
exponent (:func:`streams.core.domain.money.minor_unit_exponent`: USD → 2).

- A line's creditable amount is its charged amount rounded half-even to the minor unit;
  its creditable tax is its charged tax (the tax service's unrounded answer) rounded the
  same way. What earlier partial notes credited on the line is subtracted from both.
- The tax of a credit is pro rata to the line's creditable tax,
  ``round_half_even(tax * amount / line amount)``, and never more than the line's open
  tax; a credit of the line's whole open amount takes the whole open tax (the exact
  remainder). So the credits of a line never sum to more than its creditable tax, and
  crediting all of it credits exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from streams.core.domain.errors import DomainError

__all__ = ["CreditExceeded", "LineCredit", "credit_line", "round_half_even"]


class CreditExceeded(DomainError):
    """More than what is still creditable on the line."""


def round_half_even(value: Decimal, exponent: int) -> Decimal:
    """``value`` rounded half-even to ``exponent`` decimals (``exponent`` 0 to 4)."""
    return value.quantize(Decimal(1).scaleb(-exponent), rounding=ROUND_HALF_EVEN)


@dataclass(frozen=True)
class LineCredit:
    """What one credit credits on one line: ``amount`` and ``tax`` (minor units)."""

    amount: Decimal
    tax: Decimal


def credit_line(
    *,
    charged_amount: Decimal,
    charged_tax: Decimal,
    credited_amount: Decimal,
    credited_tax: Decimal,
    amount: Decimal,
    exponent: int,
) -> LineCredit:
    """The credit of ``amount`` on a line charged ``charged_amount`` with ``charged_tax``,
    of which ``credited_amount`` / ``credited_tax`` were credited already.

    Raises:
        CreditExceeded: ``amount`` is not positive, has more decimals than the minor unit,
            or is more than the line's open amount.
    """
    if amount <= 0 or amount != round_half_even(amount, exponent):
        raise CreditExceeded(f"{amount} is not a positive amount in minor units")
    creditable_amount = round_half_even(charged_amount, exponent)
    creditable_tax = round_half_even(charged_tax, exponent)
    open_amount = creditable_amount - credited_amount
    open_tax = creditable_tax - credited_tax
    if amount > open_amount:
        raise CreditExceeded(f"{amount} is more than the {open_amount} still creditable")
    if amount == open_amount:
        return LineCredit(amount, open_tax)
    tax = round_half_even(creditable_tax * amount / creditable_amount, exponent)
    return LineCredit(amount, min(tax, open_tax))
