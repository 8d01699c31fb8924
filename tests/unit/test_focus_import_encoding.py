"""The importer's fast path (no pydantic object per row) against the models.

Its per-row record is the record ``encode(Envelope.wrap(UsageRecorded(...)))`` gives,
byte for byte, and it refuses exactly what the models refuse, with their messages.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from pydantic import ValidationError

from streams.apps.importers.focus_import import UsageEncoder
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, UsageRecorded
from streams.core.domain.focus import FocusRowError, FocusUsage, UsageFields, iter_focus_rows

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
SOURCE = "/importers/focus/focus_sample.csv"


def sample_usages() -> list[FocusUsage]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        return [r for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]


def wrapped(row: FocusUsage, source: str = SOURCE) -> Envelope:
    return Envelope.wrap(row.usage, id=row.event_id, source=source, time=row.event_time)


def sample_rows() -> tuple[list[str], list[dict[str, str]]]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or ()), list(reader)


def csv_of(rows: list[dict[str, str]]) -> list[str]:
    fieldnames, _ = sample_rows()
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=fieldnames)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue().splitlines(keepends=True)


def test_usage_fields_follow_the_model_field_order() -> None:
    model_fields = [name for name in UsageRecorded.model_fields if name != "schema_version"]
    assert list(UsageFields._fields) == model_fields


def test_every_sample_row_encodes_as_the_validated_envelope_would() -> None:
    usages = sample_usages()
    assert len(usages) > 900
    encoder = UsageEncoder(SOURCE)
    for row in usages:
        assert row.usage == UsageRecorded(**row.fields._asdict())
        assert encoder.encode(row) == encode(wrapped(row))


def test_unusual_values_encode_as_the_models_do() -> None:
    _, rows = sample_rows()
    base = rows[0]
    variants = [
        {
            "ChargeDescription": 'Café ☕ naïve — 東京 \u2028 tab\there \u2029 "quoted" back\\slash /'
        },
        {"BilledCost": "1E+3", "PricingQuantity": "-0.0", "ConsumedQuantity": ".5"},
        {"BilledCost": "+0.00000000000000000001", "PricingQuantity": "123456789012345678"},
        {"ChargePeriodStart": "2024-09-18T22:00:00.123456+02:00"},
        {"ChargePeriodStart": "2024-09-18T22:00:00.5"},
        {"SkuId": "NULL", "RegionId": "", "ProviderName": "NULL", "PricingUnit": ""},
        {"SubAccountId": "/subscriptions/0f0e0d0c-aaaa-bbbb-cccc-000000000000"},
    ]
    lines = csv_of([{**base, **v, "Id": f"id-{i}"} for i, v in enumerate(variants)])
    results = list(iter_focus_rows(lines))
    assert all(isinstance(r, FocusUsage) for r in results), results
    encoder = UsageEncoder(SOURCE)
    for row in results:
        assert isinstance(row, FocusUsage)
        assert encoder.encode(row) == encode(wrapped(row))


def test_a_row_the_model_refuses_is_refused_on_every_row_with_the_models_message() -> None:
    _, rows = sample_rows()
    good = rows[0]["SubAccountId"]
    bad_ids = ["has space", "x" * 129, "ünïcode"]
    plan = [good, *bad_ids, good, *bad_ids]
    lines = csv_of([{**rows[0], "Id": f"r{i}", "SubAccountId": s} for i, s in enumerate(plan)])
    results = list(iter_focus_rows(lines))
    for customer_id, result in zip(plan, results, strict=True):
        if customer_id == good:
            assert isinstance(result, FocusUsage)
            continue
        assert isinstance(result, FocusRowError)
        assert result.reason.startswith(f"SubAccountId {customer_id!r}: ")
        first = results[plan.index(customer_id)]
        assert isinstance(first, FocusRowError)
        assert result.reason == first.reason  # not remembered as valid after a failure
        with pytest.raises(ValidationError):
            fields = results[0]
            assert isinstance(fields, FocusUsage)
            UsageRecorded(**{**fields.fields._asdict(), "customer_id": customer_id})


@pytest.mark.parametrize("event_id", ["x" * 257, ""])
def test_an_id_the_envelope_refuses_is_refused(event_id: str) -> None:
    row = sample_usages()[0]
    bad = FocusUsage(row.line_number, row.fields, row.customer, event_id, row.event_time)
    with pytest.raises(ValidationError):
        wrapped(bad)
    with pytest.raises(ValidationError):
        UsageEncoder(SOURCE).encode(bad)


def test_an_id_at_the_bounds_is_accepted_by_both() -> None:
    row = sample_usages()[0]
    for event_id in ("x", "x" * 256):
        ok = FocusUsage(row.line_number, row.fields, row.customer, event_id, row.event_time)
        assert UsageEncoder(SOURCE).encode(ok) == encode(wrapped(ok))


def test_a_source_the_envelope_refuses_is_refused() -> None:
    with pytest.raises(ValidationError):
        UsageEncoder("")


def test_a_later_row_of_a_known_customer_is_held_to_the_contract_bounds() -> None:
    """Every row meets the model's bounds, not only a customer's first: a
    later row with too many digits or a control character is refused on its line."""
    _, rows = sample_rows()
    base = rows[0]
    variants = [
        {},
        {"BilledCost": "+0.000000000000000000001"},
        {"PricingQuantity": "12345678901234567890"},
        {"ChargeDescription": "bell \x07 here"},
        {},
    ]
    lines = csv_of([{**base, **v, "Id": f"id-{i}"} for i, v in enumerate(variants)])
    results = list(iter_focus_rows(lines))
    assert [type(r).__name__ for r in results] == [
        "FocusUsage",
        "FocusRowError",
        "FocusRowError",
        "FocusRowError",
        "FocusUsage",
    ]
    assert [r.line_number for r in results if isinstance(r, FocusRowError)] == [3, 4, 5]
