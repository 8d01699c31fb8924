"""The price book: models, the YAML loader, every error with its path, the schema."""

from __future__ import annotations

import json
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from pydantic import ValidationError

from streams.core.domain.rating import (
    Aggregation,
    FixedFee,
    Graduated,
    MinimumCommitment,
    Package,
    PassThrough,
    PerUnit,
    PriceBook,
    PriceBookError,
    Volume,
    book_yaml,
    load_price_book,
    price_book_from_data,
)
from streams.devtools.schemas.render import PRICE_BOOK_FILE, render_schemas

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "pricing" / "price-book.yaml"
SCHEMA = ROOT / "schemas" / PRICE_BOOK_FILE

MINIMAL = """\
metrics:
  - {code: api_calls, aggregation: count}
plans:
  - code: basic
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: api, model: per_unit, metric: api_calls, unit_price: 0.1}
"""


def issues(text: str) -> list[str]:
    with pytest.raises(PriceBookError) as caught:
        load_price_book(text, source="book.yaml")
    assert str(caught.value).startswith(f"book.yaml: {len(caught.value.issues)} error(s)")
    return [str(issue) for issue in caught.value.issues]


def with_charges(
    *charges: str, metrics: str = "  - {code: api_calls, aggregation: count}\n"
) -> str:
    lines = "".join(f"          - {charge}\n" for charge in charges)
    return (
        "metrics:\n" + metrics + "plans:\n  - code: basic\n    versions:\n      - version: 1\n"
        "        effective_from: 2024-01-01\n        currency: USD\n        charges:\n" + lines
    )


# --------------------------------------------------------------------------- the example


def test_the_example_price_book_loads() -> None:
    book = load_price_book(EXAMPLE.read_text(encoding="utf-8"), source=str(EXAMPLE))
    assert [plan.code for plan in book.plans] == ["starter", "growth"]
    growth = book.plan("growth")
    assert growth is not None
    assert [v.version for v in growth.versions] == [1, 2]
    assert [v.effective_from for v in growth.versions] == [date(2024, 1, 1), date(2024, 7, 1)]
    models = {type(c) for plan in book.plans for v in plan.versions for c in v.charges}
    assert models == {FixedFee, PerUnit, Graduated, Volume, Package, MinimumCommitment, PassThrough}
    aggregations = {metric.aggregation for metric in book.metrics}
    assert aggregations == set(Aggregation)
    seats = book.metric("seats")
    assert seats is not None and seats.aggregation is Aggregation.UNIQUE_COUNT
    storage = book.metric("storage_gb")
    assert storage is not None and storage.aggregation is Aggregation.MAX
    v1 = book.plan_version("growth", 1)
    assert v1 is not None and v1.minimum is not None and v1.minimum.amount == Decimal(500)
    assert v1.pass_through is not None and v1.pass_through.markup_percent == Decimal(5)
    assert book.plan_version("growth", 3) is None
    assert book.plan_version("enterprise", 1) is None


def _as_json_document(text: str) -> Any:
    """The YAML as an editor's YAML language server sees it: dates are strings."""
    return json.loads(json.dumps(yaml.safe_load(text), default=str))


def test_the_example_validates_against_the_committed_json_schema() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    Draft202012Validator(schema).validate(_as_json_document(EXAMPLE.read_text(encoding="utf-8")))
    assert schema["$id"].endswith(PRICE_BOOK_FILE)


def test_the_committed_schema_is_what_the_models_render() -> None:
    assert SCHEMA.read_text(encoding="utf-8") == render_schemas()[Path(PRICE_BOOK_FILE)]


def test_the_schema_refuses_a_float_free_misspelled_field() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    document = _as_json_document(MINIMAL)
    document["plans"][0]["versions"][0]["charges"][0]["unit_prise"] = 1
    assert not Draft202012Validator(schema).is_valid(document)


def test_a_book_round_trips_through_json_exactly() -> None:
    """What publishing will put on a topic: decimals as strings, same book back."""
    book = load_price_book(EXAMPLE.read_text(encoding="utf-8"))
    wire = json.loads(json.dumps(book.model_dump(mode="json")))
    assert price_book_from_data(wire) == book
    price = wire["plans"][1]["versions"][0]["charges"][1]["tiers"][1]["unit_price"]
    assert price == "0.0015"


# --------------------------------------------------------------------------- exact numbers


def test_yaml_numbers_are_read_as_their_text_never_as_floats() -> None:
    book = load_price_book(
        with_charges(
            "{code: api, model: graduated, metric: api_calls, tiers: "
            "[{up_to: 1_000, unit_price: 0.1}, {up_to: 1000.5, unit_price: '0.000000000001'}, "
            "{up_to: .inf, unit_price: 0.30000000000}]}"
        )
    )
    charge = book.plans[0].versions[0].charges[0]
    assert isinstance(charge, Graduated)
    assert [t.up_to for t in charge.tiers] == [Decimal(1000), Decimal("1000.5"), None]
    assert charge.tiers[0].unit_price == Decimal("0.1")  # not 0.1000000000000000055511151231257827
    assert str(charge.tiers[1].unit_price) == "1E-12"
    assert str(charge.tiers[2].unit_price) == "0.30000000000"


@pytest.mark.parametrize("open_bound", ["null", "~", "inf", "'inf'", ".inf", "Infinity"])
def test_the_open_bound_may_be_written_null_or_inf(open_bound: str) -> None:
    text = with_charges(
        "{code: api, model: volume, metric: api_calls, tiers: "
        f"[{{up_to: 10, unit_price: 1}}, {{up_to: {open_bound}, unit_price: 0.5}}]}}"
    )
    charge = load_price_book(text).plans[0].versions[0].charges[0]
    assert isinstance(charge, Volume)
    assert charge.tiers[-1].up_to is None


def test_parsed_data_with_floats_is_refused_with_its_path() -> None:
    data = yaml.safe_load(MINIMAL)  # plain safe_load makes 0.1 a float
    with pytest.raises(PriceBookError) as caught:
        price_book_from_data(data)
    [issue] = caught.value.issues
    assert issue.path == "plans[0].versions[0].charges[0].unit_price"
    assert "not float" in issue.message
    assert issue.line is None


# --------------------------------------------------------------------------- every error, with its path


def test_every_error_is_reported_with_its_path_and_line_in_document_order() -> None:
    text = """\
metrics:
  - {code: api_calls, aggregation: count}
  - {code: storage, aggregation: max}
  - {code: api_calls, aggregation: sum, property: n}
  - {code: seats, aggregation: count, property: user}
plans:
  - code: growth
    versions:
      - version: 1
        effective_from: 2024-01-01
        currency: USD
        charges:
          - {code: platform, model: fixed, amount: 49.0000000000001}
          - code: api
            model: graduated
            metric: api_calls
            tiers:
              - {up_to: 1000, unit_price: 0.10}
              - {up_to: 1000, unit_price: -0.05}
              - {up_to: null, unit_price: 0.01}
              - {up_to: 5000, unit_price: 0.01}
          - {code: api, model: per_unit, metric: nope, unit_price: 1}
          - {code: x, model: bogus}
          - {code: y, model: package, metric: storage, package_size: 0, price: 5}
          - {code: min1, model: minimum, amount: 1}
          - {code: min2, model: minimum, amount: 2}
          - {code: dup, model: per_unit, metric: storage, unit_price: 1}
          - {code: cloud, model: pass_through, markup_percent: -101}
      - version: 1
        effective_from: 2023-01-01
        currency: XXX
        charges: []
        colour: red
  - code: growth
    versions: []
  - code: lite
    versions:
      - {version: 1, effective_from: 2024-01-01, currency: USD, currency: EUR}
"""
    assert issues(text) == [
        "metrics[1].property (line 3): required for aggregation max",
        "metrics[2].code (line 4): duplicate metric code 'api_calls' (also metrics[0])",
        "metrics[3].property (line 5): count takes no property",
        "plans[0].versions[0].charges[0].amount (line 13): at most 12 decimal places",
        "plans[0].versions[0].charges[1].tiers[1].up_to (line 19): must be greater than 1000",
        "plans[0].versions[0].charges[1].tiers[1].unit_price (line 19): must not be negative",
        "plans[0].versions[0].charges[1].tiers[2].up_to (line 20): "
        "only the last tier may be open (up_to: null)",
        "plans[0].versions[0].charges[1].tiers[3].up_to (line 21): "
        "the last tier must be open (up_to: null)",
        "plans[0].versions[0].charges[2].code (line 22): "
        "duplicate charge code 'api' (also charges[1])",
        "plans[0].versions[0].charges[2].metric (line 22): unknown metric 'nope' (not in metrics)",
        "plans[0].versions[0].charges[3] (line 23): Input tag 'bogus' found using 'model' does "
        "not match any of the expected tags: 'fixed', 'per_unit', 'graduated', 'volume', "
        "'package', 'minimum', 'pass_through'",
        "plans[0].versions[0].charges[4].package_size (line 24): must be greater than 0",
        "plans[0].versions[0].charges[6].model (line 26): "
        "at most one minimum charge per version (also charges[5])",
        "plans[0].versions[0].charges[7].metric (line 27): "
        "metric 'storage' is already priced by charges[4]",
        "plans[0].versions[0].charges[8].markup_percent (line 28): "
        "must be at least -100 (a 100 % discount)",
        "plans[0].versions[1].version (line 29): must be greater than 1",
        "plans[0].versions[1].effective_from (line 30): must not be before 2024-01-01 (version 1)",
        "plans[0].versions[1].currency (line 31): unknown or unsupported currency 'XXX' "
        "(known: AUD, BHD, CAD, CHF, EUR, GBP, JPY, KRW, KWD, USD)",
        "plans[0].versions[1].colour (line 33): unknown field",
        "plans[1].code (line 34): duplicate plan code 'growth' (also plans[0])",
        "plans[1].versions (line 35): Tuple should have at least 1 item after validation, not 0",
        "plans[2].versions[0].currency (line 38): duplicate key 'currency' (first at line 38)",
    ]


@pytest.mark.parametrize(
    ("charge", "expected"),
    [
        (
            "{code: api, model: graduated, metric: api_calls, tiers: []}",
            "tiers (line 10): Tuple should have at least 1 item after validation, not 0",
        ),
        (
            "{code: api, model: volume, metric: api_calls, tiers: [{up_to: 5, unit_price: 1}]}",
            "tiers[0].up_to (line 10): the last tier must be open (up_to: null)",
        ),
        (
            "{code: api, model: volume, metric: api_calls, tiers: [{unit_price: 1}]}",
            "tiers[0].up_to (line 10): required",
        ),
        (
            "{code: api, model: graduated, metric: api_calls, tiers: "
            "[{up_to: 10, unit_price: 1}, {up_to: 9.5, unit_price: 1}, {up_to: null}]}",
            "tiers[1].up_to (line 10): must be greater than 10",
        ),
        (
            "{code: api, model: graduated, metric: api_calls, tiers: [{up_to: 0}, {up_to: null}]}",
            "tiers[0].up_to (line 10): must be greater than 0",
        ),
        (
            "{code: api, model: per_unit, metric: api_calls, unit_price: 0.0000000000001}",
            "unit_price (line 10): at most 12 decimal places",
        ),
        (
            "{code: api, model: per_unit, metric: api_calls, unit_price: abc}",
            "unit_price (line 10): price 'abc' is not a decimal number",
        ),
        ("{code: api, model: per_unit, metric: api_calls}", "unit_price (line 10): required"),
        ("{code: 'bad code', model: fixed, amount: 1}", "code (line 10): String should match"),
    ],
)
def test_charge_errors_name_their_path(charge: str, expected: str) -> None:
    [issue] = issues(with_charges(charge))
    assert issue.startswith("plans[0].versions[0].charges[0]." + expected), issue


def test_twelve_decimal_places_are_allowed() -> None:
    book = load_price_book(
        with_charges("{code: api, model: per_unit, metric: api_calls, unit_price: 0.123456789012}")
    )
    charge = book.plans[0].versions[0].charges[0]
    assert isinstance(charge, PerUnit)
    assert charge.unit_price == Decimal("0.123456789012")
    # Trailing zeros are not precision; digits beyond the default 28 are checked exactly.
    trailing = load_price_book(
        with_charges(
            "{code: api, model: per_unit, metric: api_calls, unit_price: 0.50000000000000}"
        )
    )
    charge = trailing.plans[0].versions[0].charges[0]
    assert isinstance(charge, PerUnit) and charge.unit_price == Decimal("0.5")
    [issue] = issues(
        with_charges(
            "{code: api, model: per_unit, metric: api_calls, "
            "unit_price: 12345678901234567890.0000000000001}"
        )
    )
    assert issue.endswith("unit_price (line 10): at most 12 decimal places")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n- b\n", ["(document): must be a mapping, not list"]),
        ("metrics: [\n", None),  # not YAML: one issue with its line
        ("schema_version: 2\n", ["schema_version (line 1): Input should be 1"]),
        ("unknown: 1\n", ["unknown (line 1): unknown field"]),
    ],
)
def test_documents_that_are_not_price_books(text: str, expected: list[str] | None) -> None:
    found = issues(text)
    if expected is None:
        assert len(found) == 1 and found[0].startswith("(document) (line 2): not YAML")
    else:
        assert found == expected


def test_an_empty_document_is_an_empty_book() -> None:
    assert load_price_book("") == PriceBook()
    assert load_price_book("metrics: []\nplans: []\n") == PriceBook()


def test_alias_bombs_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(book_yaml, "MAX_NODES", 5_000)  # the same walk, smaller and fast
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 8):
        refs = ", ".join([f"*a{level - 1}"] * 10)
        lines.append(f"a{level}: &a{level} [{refs}]")
    found = issues("\n".join(lines) + "\n")
    assert found == ["(document): document expands to more than 5000 nodes (aliases?)"]
    assert book_yaml.MAX_NODES == 5_000


def test_models_are_frozen() -> None:
    book = load_price_book(MINIMAL)
    with pytest.raises(ValidationError):
        book.plans[0].versions[0].charges[0].code = "other"  # type: ignore[misc]
