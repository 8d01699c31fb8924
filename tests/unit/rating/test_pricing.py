"""Charge models at their bounds, and the vendors' published worked examples
(docs/rating.md "What vendors publish": Zuplo, Autumn, Lago, Flexprice)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from streams.core.domain.rating import RatingError, Tier
from streams.core.domain.rating.pricing import graduated, package, per_unit, prorate, volume

D = Decimal


def tiers(*spec: tuple[int | str | None, str] | tuple[int | str | None, str, str]) -> list[Tier]:
    result = []
    for item in spec:
        up_to, unit_price = item[0], item[1]
        flat = item[2] if len(item) == 3 else "0"
        result.append(
            Tier.model_validate({"up_to": up_to, "unit_price": unit_price, "flat_amount": flat})
        )
    return result


#: Zuplo docs: 1-1,000 at 0.10; 1,001-10,000 at 0.05; above at 0.01.
ZUPLO = tiers((1000, "0.10"), (10000, "0.05"), (None, "0.01"))
#: Autumn docs: 1-1,000 at 0.01; 1,001-10,000 at 0.008; above at 0.005.
AUTUMN = tiers((1000, "0.01"), (10000, "0.008"), (None, "0.005"))
#: Lago docs (graduated): first 100 at 1.00; next 100 at 0.50; above at 0.10.
LAGO_GRADUATED = tiers((100, "1.00"), (200, "0.50"), (None, "0.10"))
#: Lago docs (volume): <=10,000 at 0.0010; <=50,000 at 0.0008; <=100,000 at 0.0006;
#: above at 0.0004; a flat 10 on each tier. Flexprice: the same without the flat fee.
LAGO_VOLUME = tiers(
    (10000, "0.0010", "10"),
    (50000, "0.0008", "10"),
    (100000, "0.0006", "10"),
    (None, "0.0004", "10"),
)
FLEXPRICE_VOLUME = tiers((10000, "0.0010"), (50000, "0.0008"), (100000, "0.0006"), (None, "0.0004"))


# --------------------------------------------------------------------------- worked examples


@pytest.mark.parametrize(
    ("source", "table", "quantity", "expected"),
    [
        ("Zuplo", ZUPLO, 15000, "600.00"),
        ("Autumn", AUTUMN, 15000, "107.00"),
        ("Lago", LAGO_GRADUATED, 250, "155.00"),
    ],
)
def test_graduated_worked_examples(
    source: str, table: list[Tier], quantity: int, expected: str
) -> None:
    assert graduated(D(quantity), table).amount == D(expected), source


@pytest.mark.parametrize(
    ("source", "table", "quantity", "expected"),
    [
        ("Zuplo", ZUPLO, 15000, "150.00"),
        ("Lago", LAGO_VOLUME, 65000, "49.00"),
        ("Flexprice", FLEXPRICE_VOLUME, 65000, "39.00"),
    ],
)
def test_volume_worked_examples(
    source: str, table: list[Tier], quantity: int, expected: str
) -> None:
    assert volume(D(quantity), table).amount == D(expected), source


def test_lago_package_example_201_units_cost_10() -> None:
    """5.00 per 100 units, the first 100 free: 201 units cost 0 + 5 + 5 = 10.00."""
    priced = package(D(201), package_size=D(100), price=D("5.00"), free_units=D(100))
    assert priced.amount == D("10.00")
    assert priced.packages == 2


# --------------------------------------------------------------------------- graduated bounds


def test_graduated_zuplo_breakdown() -> None:
    priced = graduated(D(15000), ZUPLO)
    assert [(p.tier, p.units, p.amount) for p in priced.tiers] == [
        (1, D(1000), D("100.00")),
        (2, D(9000), D("450.00")),
        (3, D(5000), D("50.00")),
    ]
    assert [(p.above, p.up_to) for p in priced.tiers] == [
        (D(0), D(1000)),
        (D(1000), D(10000)),
        (D(10000), None),
    ]


@pytest.mark.parametrize(
    ("quantity", "expected", "tiers_used"),
    [
        ("0", "0", 0),
        ("1", "0.10", 1),
        ("1000", "100.00", 1),  # exactly up_to: all in the first tier
        ("1001", "100.05", 2),  # just over
        ("1000.5", "100.025", 2),  # fractional: 0.5 in the second tier
        ("10000", "550.00", 2),
        ("10000.25", "550.0025", 3),
    ],
)
def test_graduated_at_the_bounds(quantity: str, expected: str, tiers_used: int) -> None:
    priced = graduated(D(quantity), ZUPLO)
    assert priced.amount == D(expected)
    assert len(priced.tiers) == tiers_used
    assert sum((p.units for p in priced.tiers), D(0)) == D(quantity)


def test_graduated_flat_amount_is_due_once_a_unit_falls_in_its_tier() -> None:
    table = tiers((10, "0", "5"), (20, "1", "7"), (None, "0.5", "11"))
    assert graduated(D(0), table).amount == D(0)  # no unit, no flat amount
    assert graduated(D("0.001"), table).amount == D(5)
    assert graduated(D(10), table).amount == D(5)
    assert graduated(D(11), table).amount == D(5 + 7 + 1)
    assert graduated(D(20), table).amount == D(5 + 7 + 10)
    assert graduated(D(21), table).amount == D(5) + D(17) + D("11.5")


def test_graduated_refuses_a_negative_quantity() -> None:
    with pytest.raises(RatingError):
        graduated(D(-1), ZUPLO)


# --------------------------------------------------------------------------- volume bounds


@pytest.mark.parametrize(
    ("quantity", "expected", "tier"),
    [
        ("1", "0.10", 1),
        ("1000", "100.00", 1),  # exactly up_to: the first tier's price
        ("1001", "50.05", 2),  # just over: every unit at the second tier's price
        ("1000.5", "50.025", 2),
        ("10000", "500.00", 2),
        ("10001", "100.01", 3),
    ],
)
def test_volume_at_the_bounds(quantity: str, expected: str, tier: int) -> None:
    priced = volume(D(quantity), ZUPLO)
    assert priced.amount == D(expected)
    [part] = priced.tiers
    assert part.tier == tier
    assert part.units == D(quantity)


def test_volume_zero_is_free_even_with_a_flat_amount() -> None:
    priced = volume(D(0), LAGO_VOLUME)
    assert priced.amount == D(0)
    assert priced.tiers == ()


def test_volume_adds_the_tier_flat_amount() -> None:
    assert volume(D(10000), LAGO_VOLUME).amount == D(10) + D(10)
    assert volume(D(10001), LAGO_VOLUME).amount == D("10001") * D("0.0008") + D(10)


# --------------------------------------------------------------------------- package


@pytest.mark.parametrize(
    ("quantity", "packages", "amount"),
    [
        ("0", 0, "0"),  # zero units: nothing (Lago), not Chargebee's one package
        ("100", 0, "0"),  # all free
        ("100.5", 1, "5.00"),  # a started package
        ("200", 1, "5.00"),
        ("201", 2, "10.00"),
        ("300", 2, "10.00"),
        ("300.0001", 3, "15.00"),
    ],
)
def test_package_after_free_units(quantity: str, packages: int, amount: str) -> None:
    priced = package(D(quantity), package_size=D(100), price=D("5.00"), free_units=D(100))
    assert (priced.packages, priced.amount) == (packages, D(amount))


def test_package_without_free_units_and_fractional_sizes() -> None:
    assert package(D(1), package_size=D(1000), price=D(2), free_units=D(0)).amount == D(2)
    assert package(D("1.2"), package_size=D("0.5"), price=D(1), free_units=D(0)).packages == 3


# --------------------------------------------------------------------------- per unit, proration


def test_per_unit_is_exact_beyond_the_default_decimal_context() -> None:
    # 21 + 12 significant digits: the default 28-digit context would round this.
    quantity = D("123456789012345678.901")
    price = D("0.123456789012")  # 12 decimal places, as Stripe allows
    exact = 123456789012345678901 * 123456789012  # integer arithmetic, scaled by 10^-15
    assert per_unit(quantity, price).amount == D(f"{exact}e-15")  # parsing is exact
    assert per_unit(D(-3), D("0.5")).amount == D("-1.5")  # a negative sum is a credit


@pytest.mark.parametrize(
    ("days", "month_days", "expected"),
    [
        (14, 28, "50"),
        (1, 28, "3.571428571429"),
        (15, 29, "51.724137931034"),
        (1, 30, "3.333333333333"),
        (15, 30, "50"),
        (1, 31, "3.225806451613"),
        (31, 31, "100"),
        (0, 30, "0"),
    ],
)
def test_prorate_by_day_to_twelve_places(days: int, month_days: int, expected: str) -> None:
    assert prorate(D(100), days, month_days) == D(expected)


def test_prorate_of_a_full_period_is_the_amount_itself() -> None:
    assert str(prorate(D("49.99"), 30, 30)) == "49.99"
    with pytest.raises(RatingError):
        prorate(D(1), 31, 30)
