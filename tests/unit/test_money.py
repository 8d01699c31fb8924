"""Money: the one rounding rule (half-even, once, to the minor unit) and exact parsing."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import BaseModel, ValidationError

from streams.core.domain.money import (
    Amount,
    InvalidAmount,
    UnknownCurrency,
    minor_unit_exponent,
    parse_decimal,
    round_money,
)


@pytest.mark.parametrize(
    ("amount", "currency", "expected"),
    [
        ("0.125", "USD", "0.12"),  # half to even: down
        ("0.135", "USD", "0.14"),  # half to even: up
        ("0.145", "USD", "0.14"),
        ("2.5", "JPY", "2"),
        ("3.5", "JPY", "4"),
        ("0.126", "USD", "0.13"),  # not a tie: nearest
        ("0.1250000001", "USD", "0.13"),  # just above the tie
        ("-0.125", "USD", "-0.12"),  # negatives mirror positives
        ("-0.135", "USD", "-0.14"),
        ("-2.5", "JPY", "-2"),
        ("1.0005", "BHD", "1.000"),
        ("1.0015", "BHD", "1.002"),
        ("0.00000080000", "USD", "0.00"),
        ("13.61648254970", "USD", "13.62"),
        ("7", "USD", "7.00"),
        ("0", "KWD", "0.000"),
    ],
)
def test_round_money_is_half_even_to_the_minor_unit(
    amount: str, currency: str, expected: str
) -> None:
    result = round_money(Decimal(amount), currency)
    assert result == Decimal(expected)
    assert str(result) == expected  # the exponent is the minor unit's, too


def test_minor_units() -> None:
    assert minor_unit_exponent("USD") == 2
    assert minor_unit_exponent("JPY") == 0
    assert minor_unit_exponent("BHD") == 3


@pytest.mark.parametrize("code", ["XXX", "usd", "", "US"])
def test_unknown_currency_is_refused(code: str) -> None:
    with pytest.raises(UnknownCurrency):
        round_money(Decimal("1"), code)


@pytest.mark.parametrize("value", [0.1, 1.0, float("nan"), True])
def test_float_and_bool_are_refused(value: object) -> None:
    with pytest.raises(InvalidAmount):
        parse_decimal(value)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-inf", "abc", "", "1,5"])
def test_non_numbers_and_non_finite_are_refused(value: str) -> None:
    with pytest.raises(InvalidAmount):
        parse_decimal(value)


def test_parse_keeps_every_decimal() -> None:
    assert str(parse_decimal("0.00000080000")) == "8.0000E-7"
    assert parse_decimal("0.00000080000").as_tuple().exponent == -11
    assert parse_decimal(3) == Decimal(3)
    assert parse_decimal(Decimal("-1.50")) == Decimal("-1.50")


class _Priced(BaseModel):
    amount: Amount


def test_amount_is_a_string_on_the_wire_and_refuses_floats() -> None:
    model = _Priced(amount=Decimal("0.00000080000"))
    assert model.model_dump_json() == '{"amount":"0.00000080000"}'
    assert _Priced.model_validate_json('{"amount":"-1.5"}').amount == Decimal("-1.5")
    with pytest.raises(ValidationError):
        _Priced.model_validate_json('{"amount":0.1}')
    with pytest.raises(ValidationError):
        _Priced(amount=0.1)
