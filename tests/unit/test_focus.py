"""FOCUS 1.0 CSV rows → usage.recorded / customer.upserted, against the real sample."""

from __future__ import annotations

import csv
import hashlib
import io
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from streams.core.domain.errors import FocusFormatError
from streams.core.domain.events import deterministic_id
from streams.core.domain.focus import (
    FocusRowError,
    FocusRowResult,
    FocusUsage,
    iter_focus_rows,
    placeholder_email,
)

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
SAMPLE_SHA256 = "e91e5ac7edf01ed2c9d926f37ef7dc1ae2aae97956fea8da6c9ee488b1c2839e"


def read_sample() -> list[FocusRowResult]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        return list(iter_focus_rows(handle))


def sample_table() -> tuple[list[str], list[list[str]]]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    return rows[0], rows[1:]


def to_csv(header: list[str], rows: list[list[str]]) -> list[str]:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().splitlines(keepends=True)


def with_values(header: list[str], row: list[str], **values: str) -> list[str]:
    changed = list(row)
    for column, value in values.items():
        changed[header.index(column)] = value
    return changed


def usages(results: list[FocusRowResult]) -> list[FocusUsage]:
    return [r for r in results if isinstance(r, FocusUsage)]


def errors(results: list[FocusRowResult]) -> list[FocusRowError]:
    return [r for r in results if isinstance(r, FocusRowError)]


def test_the_shipped_sample_is_byte_identical_to_upstream() -> None:
    assert hashlib.sha256(SAMPLE.read_bytes()).hexdigest() == SAMPLE_SHA256


def test_mapping_of_a_real_row() -> None:
    first = read_sample()[0]
    assert isinstance(first, FocusUsage)
    assert first.line_number == 2
    assert first.event_id == "11472"
    assert first.event_time == datetime(2024, 9, 18, 22, tzinfo=UTC)
    usage = first.usage
    assert usage.customer_id == "51738928782"
    assert usage.billing_period == "2024-09"
    assert usage.amount == Decimal("0.00000080000")
    assert usage.amount.as_tuple().exponent == -11  # every decimal kept
    assert usage.currency == "USD"
    assert usage.quantity == Decimal("2.00000000000")
    assert usage.unit == "Requests"
    assert str(usage.consumed_quantity) == "2.000000000000000"
    assert usage.consumed_unit == "Requests"
    assert usage.sku_id == "G95FST5FTYV3JSRX"
    assert usage.description == (
        "$0.40 per million Amazon SQS standard requests in Tier1 in US West (Oregon)"
    )
    assert usage.region_id == "us-west-2"
    assert usage.charge_category == "Usage"
    assert usage.event_time == datetime(2024, 9, 18, 22, tzinfo=UTC)
    assert usage.provider == "AWS"
    assert '"amount":"0.00000080000"' in usage.model_dump_json()

    customer = first.customer
    assert customer.customer_id == "51738928782"
    assert customer.name == "Atlas Nimbus"
    assert customer.email == "billing+51738928782@customers.invalid"
    assert customer.currency == "USD"
    assert customer.billing_account_id == "1234567890123"
    assert first.customer_event_id == deterministic_id(
        "customer.upserted",
        "51738928782",
        "Atlas Nimbus",
        "billing+51738928782@customers.invalid",
        "USD",
    )


def test_null_means_missing() -> None:
    results = usages(read_sample())
    no_region = [r for r in results if r.usage.region_id is None]
    assert len(no_region) == 7  # the sample's RegionId NULLs
    no_consumed = [r for r in results if r.usage.consumed_quantity is None]
    assert len(no_consumed) == 1
    assert no_consumed[0].usage.consumed_unit is None
    assert all("NULL" not in (r.usage.region_id or "") for r in results)


def test_a_missing_account_name_falls_back_to_the_account_id() -> None:
    header, rows = sample_table()
    row = with_values(header, rows[0], SubAccountName="NULL", RegionId="", SkuId="NULL")
    [result] = iter_focus_rows(to_csv(header, [row]))
    assert isinstance(result, FocusUsage)
    assert result.customer.name == "51738928782"
    assert result.usage.region_id is None
    assert result.usage.sku_id is None


def test_a_bad_billed_cost_is_reported_with_its_line_and_the_rest_proceeds() -> None:
    header, rows = sample_table()
    bad = with_values(header, rows[1], BilledCost="0.0000x16")
    results = list(iter_focus_rows(to_csv(header, [rows[0], bad, rows[2]])))
    assert [type(r).__name__ for r in results] == ["FocusUsage", "FocusRowError", "FocusUsage"]
    error = results[1]
    assert isinstance(error, FocusRowError)
    assert error.line_number == 3
    assert "BilledCost" in error.reason and "'0.0000x16'" in error.reason
    assert error.raw_id == rows[1][header.index("Id")]
    assert results[2].line_number == 4


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("BilledCost", "1_000", "BilledCost '1_000'"),
        ("BilledCost", "NaN", "BilledCost 'NaN'"),
        ("BilledCost", "NULL", "BilledCost is missing"),
        ("PricingQuantity", "two", "PricingQuantity 'two'"),
        ("ChargePeriodStart", "2024-09-31 00:00:00", "ChargePeriodStart '2024-09-31 00:00:00'"),
        ("BillingPeriodStart", "yesterday", "BillingPeriodStart 'yesterday'"),
        # before year 1 or after 9999 once in UTC: a row error, not a failed import
        (
            "ChargePeriodStart",
            "0001-01-01 00:00:00+01:00",
            "ChargePeriodStart '0001-01-01 00:00:00+01:00' is out of range in UTC",
        ),
        (
            "BillingPeriodStart",
            "9999-12-31 23:00:00-05:00",
            "BillingPeriodStart '9999-12-31 23:00:00-05:00' is out of range in UTC",
        ),
        ("BillingCurrency", "XXX", "BillingCurrency 'XXX'"),
        ("BillingCurrency", "NULL", "BillingCurrency is missing"),
        ("SubAccountId", "NULL", "SubAccountId is missing"),
        ("SubAccountId", "has space", "SubAccountId 'has space'"),
        ("Id", "", "Id is missing"),
    ],
)
def test_malformed_values_become_row_errors_naming_column_and_value(
    column: str, value: str, expected: str
) -> None:
    header, rows = sample_table()
    results = list(
        iter_focus_rows(to_csv(header, [with_values(header, rows[0], **{column: value}), rows[1]]))
    )
    error = results[0]
    assert isinstance(error, FocusRowError), error
    assert expected in error.reason
    assert error.line_number == 2
    assert isinstance(results[1], FocusUsage)


def test_wrong_column_count_is_a_row_error() -> None:
    header, rows = sample_table()
    results = list(iter_focus_rows(to_csv(header, [rows[0][:-3], [*rows[1], "extra"], rows[2]])))
    assert [r.line_number for r in errors(results)] == [2, 3]
    assert "fields, the header has 44" in errors(results)[0].reason
    assert errors(results)[0].raw_id == rows[0][header.index("Id")]
    assert [r.line_number for r in usages(results)] == [4]


def test_a_quoted_multi_line_field_keeps_line_numbers_right() -> None:
    header, rows = sample_table()
    multi = with_values(header, rows[1], ChargeDescription="first line\nsecond line\nthird line")
    bad = with_values(header, rows[3], BilledCost="oops")
    lines = to_csv(header, [rows[0], multi, rows[2], bad])
    assert len(lines) == 7  # header, row, 3-line row, row, row
    results = list(iter_focus_rows(lines))
    assert [r.line_number for r in results] == [2, 3, 6, 7]
    assert isinstance(results[1], FocusUsage)
    assert results[1].usage.description == "first line\nsecond line\nthird line"
    assert isinstance(results[3], FocusRowError)
    assert results[3].line_number == 7


def test_blank_lines_are_skipped_but_counted() -> None:
    header, rows = sample_table()
    lines = to_csv(header, [rows[0], rows[1]])
    lines.insert(2, "\n")
    assert [r.line_number for r in iter_focus_rows(lines)] == [2, 4]


def test_a_text_file_object_is_accepted_and_a_bom_is_ignored() -> None:
    header, rows = sample_table()
    text = "\ufeff" + "".join(to_csv(header, rows[:2]))
    assert len(usages(list(iter_focus_rows(io.StringIO(text, newline=""))))) == 2


def test_missing_required_columns_raise_a_format_error_naming_them() -> None:
    header, rows = sample_table()
    keep = [i for i, name in enumerate(header) if name not in ("BilledCost", "SubAccountName")]
    lines = to_csv([header[i] for i in keep], [[rows[0][i] for i in keep]])
    with pytest.raises(FocusFormatError, match="SubAccountName, BilledCost") as caught:
        iter_focus_rows(lines)  # raised at call time, before any row
    assert caught.value.missing == ("SubAccountName", "BilledCost")


def test_an_empty_file_or_repeated_header_column_is_a_format_error() -> None:
    with pytest.raises(FocusFormatError, match="empty"):
        iter_focus_rows([])
    header, rows = sample_table()
    with pytest.raises(FocusFormatError, match="repeats column"):
        iter_focus_rows(to_csv([*header, "Id"], [[*rows[0], "x"]]))


def test_malformed_quoting_is_a_row_error_and_the_rest_proceeds() -> None:
    header, rows = sample_table()
    lines = to_csv(header, rows[:3])
    lines[2] = '"11111"x,' + lines[2].split(",", 1)[1]  # text after a closing quote
    results = list(iter_focus_rows(lines))
    assert [type(r).__name__ for r in results] == ["FocusUsage", "FocusRowError", "FocusUsage"]
    assert results[1].line_number == 3
    assert isinstance(results[1], FocusRowError) and "malformed CSV" in results[1].reason


def test_an_unterminated_quote_is_reported_with_the_lines_it_swallowed() -> None:
    header, rows = sample_table()
    lines = [*to_csv(header, rows[:1]), '"unterminated,\n', "more text\n", "and more\n"]
    results = list(iter_focus_rows(lines))
    assert len(results) == 2
    assert isinstance(results[0], FocusUsage)
    error = results[1]
    assert isinstance(error, FocusRowError)
    assert error.line_number == 3
    assert "lines 3-5" in error.reason


def test_a_malformed_header_is_a_format_error() -> None:
    with pytest.raises(FocusFormatError, match="unreadable"):
        iter_focus_rows(['"Id"x,BilledCost\n'])


def test_optional_columns_may_be_absent_from_the_header() -> None:
    header, rows = sample_table()
    keep = [i for i, name in enumerate(header) if name not in ("RegionId", "PricingQuantity")]
    [result] = iter_focus_rows(to_csv([header[i] for i in keep], [[rows[0][i] for i in keep]]))
    assert isinstance(result, FocusUsage)
    assert result.usage.region_id is None and result.usage.quantity is None


def test_placeholder_email_is_deterministic_and_undeliverable() -> None:
    assert placeholder_email("51738928782") == "billing+51738928782@customers.invalid"
    azure = placeholder_email("/subscriptions/64e355d7-997c-491d-b0c1-8414dccfcf42")
    assert azure == placeholder_email("/subscriptions/64e355d7-997c-491d-b0c1-8414dccfcf42")
    assert azure != placeholder_email("/subscriptions/73c0021f-a37d-433f-8baa-7450cb54eea6")
    assert azure.endswith("@customers.invalid") and "/" not in azure
    long_id = "ocid6.tenancy.oc6..aaaaaaaamz7ywh2epitrng9d8a7rj7o6thfwjvz79n1hg9apiq7mvj8rpoia"
    assert len(placeholder_email(long_id).split("@")[0]) <= 64


def test_billing_month_comes_from_billing_period_start() -> None:
    [late] = [r for r in usages(read_sample()) if r.usage.billing_period == "2024-10"]
    assert late.usage.event_time == datetime(2024, 9, 30, 22, tzinfo=UTC)
    assert late.usage.provider == "Oracle"


def test_the_whole_sample() -> None:
    results = read_sample()
    assert errors(results) == []
    mapped = usages(results)
    assert len(mapped) == 1000
    assert len({r.event_id for r in mapped}) == 1000
    assert [r.line_number for r in mapped] == list(range(2, 1002))
    assert len({r.usage.customer_id for r in mapped}) == 73
    assert len({(r.usage.customer_id, r.usage.billing_period) for r in mapped}) == 73
    assert len({r.customer_event_id for r in mapped}) == 73  # one customer.upserted per account

    ours: defaultdict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for r in mapped:
        ours[(r.usage.customer_id, r.usage.billing_period)] += r.usage.amount

    # Independent answer: csv.DictReader + Decimal, nothing from streams.
    expected: defaultdict[tuple[str, str], Decimal] = defaultdict(Decimal)
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            month = row["BillingPeriodStart"][:7]
            expected[(row["SubAccountId"], month)] += Decimal(row["BilledCost"])
    assert dict(ours) == dict(expected)
    biggest = max(
        expected,
        key=lambda pair: sum(
            1 for r in mapped if (r.usage.customer_id, r.usage.billing_period) == pair
        ),
    )
    assert expected[biggest] == Decimal("13.61648254970")
    assert sum(1 for total in expected.values() if total.quantize(Decimal("0.01")) == 0) == 28


def test_rows_sharing_texts_are_still_refused_for_their_numbers_and_texts() -> None:
    """The mapper remembers which texts passed the model's rules; a later row with the
    same texts is still checked for its numbers, and a refused text is refused every time."""
    header, rows = sample_table()
    good = rows[0]
    too_many_digits = with_values(header, good, BilledCost="1234567890123456789.5")
    bad_text = with_values(header, good, ChargeCategory="Usage\x07")
    results = list(
        iter_focus_rows(to_csv(header, [good, too_many_digits, bad_text, bad_text, good]))
    )
    assert [type(r).__name__ for r in results] == [
        "FocusUsage",
        "FocusRowError",
        "FocusRowError",
        "FocusRowError",
        "FocusUsage",
    ]
    assert "BilledCost" in results[1].reason  # type: ignore[union-attr]
    assert results[2].reason == results[3].reason  # type: ignore[union-attr]


def test_a_quantity_out_of_bounds_is_refused_naming_its_focus_column() -> None:
    """Even when every text of the row was seen before; the model's field names are
    translated to the FOCUS columns (PricingQuantity, not quantity)."""
    header, rows = sample_table()
    good = with_values(header, rows[0], PricingQuantity="2.5", ConsumedQuantity="2.5")
    long_quantity = with_values(header, good, PricingQuantity="1" * 19)
    long_consumed = with_values(header, good, ConsumedQuantity="0." + "1" * 21)
    results = list(
        iter_focus_rows(to_csv(header, [good, long_quantity, long_consumed, good, good]))
    )
    assert [type(r).__name__ for r in results] == [
        "FocusUsage",
        "FocusRowError",
        "FocusRowError",
        "FocusUsage",
        "FocusUsage",
    ]
    assert "PricingQuantity" in results[1].reason  # type: ignore[union-attr]
    assert "ConsumedQuantity" in results[2].reason  # type: ignore[union-attr]
    kept = usages(results)
    assert {u.fields.quantity for u in kept} == {Decimal("2.5")}
