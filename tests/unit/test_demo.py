"""The demo's independent reading of a FOCUS file (the reconciliation's "expected" side)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from streams.apps.ops.focus_expected import expected_from_file

HEADER = "Id,SubAccountId,BillingPeriodStart,BilledCost,BillingCurrency,ChargePeriodStart\n"


def test_sums_per_account_and_utc_month_and_reports_unreadable_rows(tmp_path: Path) -> None:
    csv_file = tmp_path / "f.csv"
    csv_file.write_text(
        HEADER
        + "1,a,2024-09-01 00:00:00,0.00000080000,USD,2024-09-02 00:00:00\n"
        + "2,a,2024-09-01 00:00:00,-0.5,USD,NULL\n"  # the importer would skip it: still expected
        + "3,a,2024-10-01T01:00:00+02:00,1.25,USD,2024-09-30 23:00:00\n"  # 23:00 UTC in September
        + "4,b,2024-10-01 00:00:00,2,USD,2024-10-01 00:00:00\n"
        + "5,NULL,2024-10-01 00:00:00,3,USD,2024-10-01 00:00:00\n"
        + "6,b,2024-10-01 00:00:00,abc,USD,2024-10-01 00:00:00\n"
        + "7,b,not a date,1,USD,2024-10-01 00:00:00\n",
        encoding="utf-8",
    )
    expected = expected_from_file(csv_file, customer_prefix="x-")
    assert expected.sums == {
        ("x-a", "2024-09"): Decimal("0.7500008"),
        ("x-b", "2024-10"): Decimal("2"),
    }
    assert expected.rows == 4
    assert expected.currency[("x-a", "2024-09")] == "USD"
    assert [line for line, _ in expected.unreadable] == [6, 7, 8]
    assert "SubAccountId" in expected.unreadable[0][1]


def test_the_bundled_sample_matches_its_published_facts() -> None:
    expected = expected_from_file(Path(__file__).parents[2] / "examples/focus/focus_sample.csv")
    assert expected.rows == 1000 and not expected.unreadable
    assert len(expected.sums) == 73
    assert sum(1 for (_, period) in expected.sums if period == "2024-10") == 1
    assert max(expected.sums.values()) == Decimal("13.61648254970")
