"""Money: ``Decimal`` amounts in a currency's units, and the one rounding rule.

Rule (docs/design.md "Money and time"): line amounts keep full precision; an invoice
subtotal and each tax amount are rounded **once**, to the currency's minor unit,
ROUND_HALF_EVEN (banker's rounding). Never ``float``.

Minor units come from ISO 4217 (the exponent column); only the currencies the
pipeline is known to bill in are listed, any other code is refused.
"""

from __future__ import annotations

import decimal
import re
from decimal import ROUND_HALF_EVEN, Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from streams.core.domain.errors import DomainError

#: ISO 4217 minor-unit exponents of the currencies we bill in.
MINOR_UNITS: dict[str, int] = {
    "USD": 2,
    "EUR": 2,
    "GBP": 2,
    "CHF": 2,
    "CAD": 2,
    "AUD": 2,
    "JPY": 0,
    "KRW": 0,
    "BHD": 3,
    "KWD": 3,
}

#: Most integer digits of an amount or quantity on the wire (the contract's bound;
#: docs/contract.md). 10^18 - 1 is beyond any charge in any currency we bill (even in KRW,
#: 10^18 won is about 700 trillion USD), and 18 + 20 = 38 significant digits is the largest
#: exact decimal of the ledgers and warehouses our subscribers load invoices into
#: (``DECIMAL(38, s)`` in SQL Server, Oracle, Snowflake, Redshift, Databricks).
MAX_INTEGER_DIGITS = 18
#: Most decimal places of an amount or quantity on the wire. Cloud usage exports carry
#: up to ~15 (the FOCUS sample: 11 for costs, 15 for consumed quantities); 20 leaves room
#: and keeps every value inside ``DECIMAL(38, 20)``.
MAX_DECIMALS = 20

#: Pattern of a decimal number written as a JSON string: plain digits (no exponent,
#: no ``+``, no whitespace, no digits of other scripts), at most
#: :data:`MAX_INTEGER_DIGITS` before the point and :data:`MAX_DECIMALS` after it.
DECIMAL_PATTERN = rf"^-?[0-9]{{1,{MAX_INTEGER_DIGITS}}}(\.[0-9]{{1,{MAX_DECIMALS}}})?$"
_DECIMAL_RE = re.compile(DECIMAL_PATTERN)

#: Significant digits of the context :func:`round_money` quantizes in: wide enough for
#: any sum of bounded amounts, so quantizing never fails for lack of precision.
_ROUNDING_PRECISION = 80


class UnknownCurrency(DomainError):
    """A currency code that is not in :data:`MINOR_UNITS`."""


class InvalidAmount(DomainError):
    """A value that is not an exact decimal amount (a float, NaN, infinity, garbage)."""


def minor_unit_exponent(currency: str) -> int:
    """Number of decimal places of ``currency``'s minor unit (USD → 2, JPY → 0).

    Raises:
        UnknownCurrency: the code is not one we bill in.
    """
    try:
        return MINOR_UNITS[currency]
    except KeyError:
        raise UnknownCurrency(f"unknown or unsupported currency code {currency!r}") from None


def round_money(amount: Decimal, currency: str) -> Decimal:
    """Round ``amount`` once to ``currency``'s minor unit, half-even.

    >>> round_money(Decimal("0.125"), "USD")
    Decimal('0.12')
    >>> round_money(Decimal("0.135"), "USD")
    Decimal('0.14')

    Quantizes in a context of :data:`_ROUNDING_PRECISION` digits: the default context
    (28 digits) cannot quantize ``1E+30`` to cents and raised ``InvalidOperation``,
    which an invoice job once retried for ever.

    Raises:
        UnknownCurrency: see :func:`minor_unit_exponent`.
        InvalidAmount: ``amount`` is not finite, or too large to round exactly.
    """
    quantum = Decimal(1).scaleb(-minor_unit_exponent(currency))
    try:
        with decimal.localcontext() as ctx:
            ctx.prec = _ROUNDING_PRECISION
            ctx.traps[InvalidOperation] = True
            return amount.quantize(quantum, rounding=ROUND_HALF_EVEN)
    except (InvalidOperation, TypeError) as exc:
        raise InvalidAmount(f"cannot round {amount!r} to {currency}: {exc!r}") from None


def parse_decimal(value: object, *, what: str = "amount") -> Decimal:
    """An exact ``Decimal`` from a string, int or Decimal; floats are refused.

    Raises:
        InvalidAmount: ``value`` is a float, bool, non-finite, or not a number.
    """
    if isinstance(value, (bool, float)):
        raise InvalidAmount(
            f"{what} must be a decimal string, not {type(value).__name__} {value!r}"
        )
    if isinstance(value, Decimal):
        result = value
    elif isinstance(value, int):
        result = Decimal(value)
    elif isinstance(value, str):
        try:
            result = Decimal(value.strip())
        except InvalidOperation:
            raise InvalidAmount(f"{what} {value!r} is not a decimal number") from None
    else:
        raise InvalidAmount(f"{what} must be a decimal string, not {type(value).__name__}")
    if not result.is_finite():
        raise InvalidAmount(f"{what} {value!r} is not finite")
    return result


def canonical_decimal(value: Decimal) -> Decimal:
    """The canonical form of a finite decimal: no trailing fractional zeros, no
    exponent above 0, and ``0`` for ``-0``. Equal numbers get equal forms
    (``10``, ``10.0`` and ``1E+1`` all give ``Decimal("10")``). Exact: never
    rounds, whatever the context precision.

    >>> format(canonical_decimal(Decimal("10.50")), "f")
    '10.5'

    Raises:
        InvalidAmount: ``value`` is not a finite ``Decimal``.
    """
    if not isinstance(value, Decimal) or not value.is_finite():
        raise InvalidAmount(f"not a finite Decimal: {value!r}")
    if value.is_zero():
        return Decimal(0)
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):  # "n", "N", "F": excluded above
        raise InvalidAmount(f"not a finite Decimal: {value!r}")
    kept = list(digits)
    while kept and kept[-1] == 0 and exponent < 0:
        kept.pop()
        exponent += 1
    if exponent > 0:
        kept.extend([0] * exponent)
        exponent = 0
    return Decimal((sign, tuple(kept), exponent))


def contract_decimal(value: object, *, what: str = "amount") -> Decimal:
    """An amount or quantity as the contract takes it: a decimal string of
    the form :data:`DECIMAL_PATTERN`, an ``int`` or a finite ``Decimal``, with at most
    :data:`MAX_INTEGER_DIGITS` integer digits and :data:`MAX_DECIMALS` decimal places.

    The bounds are checked on the digits, never by expanding the number, so
    ``Decimal("1E+999999")`` is refused at once.

    Raises:
        InvalidAmount: anything else (a float, a bool, ``NaN``, an exponent, spaces,
            ``+``, digits of another script, or too many digits).
    """
    if isinstance(value, str) and not _DECIMAL_RE.fullmatch(value):
        shown = value if len(value) <= 40 else f"{value[:40]}… ({len(value)} characters)"
        raise InvalidAmount(
            f"{what} {shown!r} is not a plain decimal string with at most "
            f"{MAX_INTEGER_DIGITS} integer digits and {MAX_DECIMALS} decimals"
        )
    result = parse_decimal(value, what=what)
    _sign, digits, exponent = result.as_tuple()
    if not isinstance(exponent, int):  # pragma: no cover - parse_decimal refused non-finite
        raise InvalidAmount(f"{what} {value!r} is not finite")
    integer_digits = max(len(digits) + exponent, 1)
    places = max(-exponent, 0)
    if integer_digits > MAX_INTEGER_DIGITS or places > MAX_DECIMALS:
        raise InvalidAmount(
            f"{what} has {integer_digits} integer digits and {places} decimals; at most "
            f"{MAX_INTEGER_DIGITS} and {MAX_DECIMALS} are allowed"
        )
    return result


def _validate_amount(value: Any) -> Decimal:
    # pydantic turns ValueError into a ValidationError naming the field.
    try:
        return contract_decimal(value)
    except InvalidAmount as exc:
        raise ValueError(str(exc)) from None


#: A money amount in a pydantic model: exact Decimal in, decimal *string* out in
#: JSON (never a JSON number, so no consumer parses it as a float). Bounded by
#: :func:`contract_decimal` (:data:`MAX_INTEGER_DIGITS`, :data:`MAX_DECIMALS`).
Amount = Annotated[
    Decimal,
    BeforeValidator(_validate_amount),
    PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": DECIMAL_PATTERN}),
]

#: A quantity (not money) with the same exactness and wire form as :data:`Amount`.
Quantity = Amount
