"""The price book's value types: exact prices, percentages, quantities, tier bounds.

Each is a ``Decimal`` validated from a YAML number's text or a decimal string (never
a float), written back as a decimal string in JSON, with the JSON Schema an editor
checks a price book against. Prices, amounts and percentages take at most
:data:`PRICE_DECIMALS` (12) decimal places, as Stripe's ``unit_amount_decimal``
(docs/rating.md "Charge models"). Validation errors are pydantic custom errors, so the
loader reports them with the value's path (:mod:`streams.core.domain.rating.book_yaml`).
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, WithJsonSchema
from pydantic_core import PydanticCustomError

from streams.core.domain.money import MINOR_UNITS, InvalidAmount, canonical_decimal, parse_decimal

#: Most decimal places of a price, amount or percentage (Stripe ``unit_amount_decimal``).
PRICE_DECIMALS = 12


def _decimal(value: Any, what: str) -> Decimal:
    try:
        return parse_decimal(value, what=what)
    except InvalidAmount as exc:
        raise PydanticCustomError("decimal", str(exc)) from None


def _places(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def _price(value: Any) -> Decimal:
    result = _decimal(value, "price")
    if result < 0:
        raise PydanticCustomError("price", "must not be negative")
    if _places(canonical_decimal(result)) > PRICE_DECIMALS:
        raise PydanticCustomError(
            "price", "at most {places} decimal places", {"places": PRICE_DECIMALS}
        )
    return result


def _percent(value: Any) -> Decimal:
    result = _decimal(value, "percentage")
    if result < -100:
        raise PydanticCustomError("percent", "must be at least -100 (a 100 % discount)")
    if _places(canonical_decimal(result)) > PRICE_DECIMALS:
        raise PydanticCustomError(
            "percent", "at most {places} decimal places", {"places": PRICE_DECIMALS}
        )
    return result


def _positive(value: Any) -> Decimal:
    result = _decimal(value, "quantity")
    if result <= 0:
        raise PydanticCustomError("positive", "must be greater than 0")
    return result


def _non_negative(value: Any) -> Decimal:
    result = _decimal(value, "quantity")
    if result < 0:
        raise PydanticCustomError("non_negative", "must not be negative")
    return result


_OPEN = frozenset({"inf", "+inf", "infinity", "+infinity", ".inf", "+.inf"})


def parse_bound(value: Any) -> Decimal | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _OPEN):
        return None
    return _positive(value)


def _number_schema(pattern: str, description: str, minimum: int | None) -> dict[str, Any]:
    number: dict[str, Any] = {"type": "number"}
    if minimum is not None:
        number["minimum"] = minimum
    return {
        "anyOf": [{"type": "string", "pattern": pattern}, number],
        "description": description,
    }


_AS_STRING = PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json")

#: A price or money amount: exact, >= 0, at most 12 decimal places.
Price = Annotated[
    Decimal,
    BeforeValidator(_price),
    _AS_STRING,
    WithJsonSchema(
        _number_schema(
            r"^[0-9]+(\.[0-9]{1,12})?$",
            "Exact decimal >= 0 with at most 12 decimal places: a YAML number (read as "
            "its text, never as a float) or a decimal string.",
            0,
        )
    ),
]
#: A percentage, >= -100 (a discount) with at most 12 decimal places.
Percent = Annotated[
    Decimal,
    BeforeValidator(_percent),
    _AS_STRING,
    WithJsonSchema(
        _number_schema(
            r"^-?[0-9]+(\.[0-9]{1,12})?$",
            "Percentage, exact, >= -100 (negative: a discount), at most 12 decimal places.",
            -100,
        )
    ),
]
_QUANTITY_DOC = "Exact decimal quantity: a YAML number or a decimal string."
PositiveQuantity = Annotated[
    Decimal,
    BeforeValidator(_positive),
    _AS_STRING,
    WithJsonSchema(_number_schema(r"^[0-9]+(\.[0-9]+)?$", _QUANTITY_DOC + " > 0.", 0)),
]
NonNegativeQuantity = Annotated[
    Decimal,
    BeforeValidator(_non_negative),
    _AS_STRING,
    WithJsonSchema(_number_schema(r"^[0-9]+(\.[0-9]+)?$", _QUANTITY_DOC + " >= 0.", 0)),
]
#: A tier's inclusive upper bound; ``None`` (``null``, ``inf``) = open.
TierBound = Annotated[
    Decimal | None,
    BeforeValidator(parse_bound),
    PlainSerializer(
        lambda d: None if d is None else format(d, "f"), return_type=str | None, when_used="json"
    ),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?|inf)$"},
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "null"},
            ],
            "description": "Inclusive upper bound of the tier (Stripe up_to); null or inf: "
            "open, only for the last tier. Bounds increase.",
        }
    ),
]


def _known_currency(value: str) -> str:
    if value not in MINOR_UNITS:
        known = ", ".join(sorted(MINOR_UNITS))
        raise PydanticCustomError(
            "currency", f"unknown or unsupported currency {value!r} (known: {known})"
        )
    return value


BookCurrency = Annotated[
    str,
    Field(pattern=r"^[A-Z]{3}$"),
    AfterValidator(_known_currency),
    WithJsonSchema({"type": "string", "enum": sorted(MINOR_UNITS)}),
]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class Aggregation(StrEnum):
    """How a billable metric turns one period's events into a quantity.

    * ``count`` — the number of events;
    * ``sum`` — the sum of a decimal value;
    * ``max`` — its largest value;
    * ``unique_count`` — the number of distinct values of a text property;
    * ``latest`` — the decimal value of the latest event (by event time, then
      event id).

    No events give a quantity of 0 under every aggregation.
    """

    COUNT = "count"
    SUM = "sum"
    MAX = "max"
    UNIQUE_COUNT = "unique_count"
    LATEST = "latest"


#: The aggregations that read a decimal of the event's ``values``.
DECIMAL_AGGREGATIONS = frozenset({Aggregation.SUM, Aggregation.MAX, Aggregation.LATEST})
#: The ``model`` tags of the charges that price a metric.
METRIC_MODELS = frozenset({"per_unit", "graduated", "volume", "package"})
