"""The fast canonical JSON of usage data is the reference text, so stored hashes hold."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

from streams.billing.rows import (
    PAYLOAD_HASH_KEYS,
    SourceCoordinates,
    UsageRecord,
    canonical_json,
    payload_hash,
    payload_hash_reference,
)
from streams.domain.events import UsageRecorded
from streams.domain.focus import FocusUsage, iter_focus_rows

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"

TEXTS = [None, "", "plain", 'quote " and \\ slash /', "Café — 東京 😀", "tab\tnew\nline\r\u2029 😀"]
DECIMALS = [Decimal("0"), Decimal("-0.00"), Decimal("1E+3"), Decimal("1.50"), Decimal("-12.3e-15")]


def test_it_names_every_field_of_the_model_in_sorted_order() -> None:
    assert list(PAYLOAD_HASH_KEYS) == sorted(UsageRecorded.model_fields)


def test_sample_rows_hash_as_the_reference() -> None:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        usages = [r.usage for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]
    assert len(usages) > 900
    for usage in usages:
        assert payload_hash(usage) == payload_hash_reference(usage)


def test_unusual_values_hash_as_the_reference() -> None:
    rng = random.Random(7)
    start = datetime(2024, 9, 1, tzinfo=UTC)
    for i in range(400):
        offset = timezone(timedelta(hours=rng.choice([0, 2, -5])))
        data = UsageRecorded(
            customer_id=rng.choice(["c-1", "/subscriptions/x", "a.b:c"]),
            billing_period="2024-09",
            amount=rng.choice(DECIMALS),
            currency="USD",
            quantity=rng.choice([None, *DECIMALS]),
            unit=rng.choice(TEXTS),
            consumed_quantity=rng.choice([None, *DECIMALS]),
            consumed_unit=rng.choice(TEXTS),
            sku_id=rng.choice(TEXTS),
            description=rng.choice(TEXTS),
            region_id=rng.choice(TEXTS),
            charge_category=rng.choice(TEXTS),
            event_time=(
                start + timedelta(seconds=i * 3601, microseconds=rng.choice([0, 5, 123456]))
            ).astimezone(offset),
            provider=rng.choice(TEXTS),
        )
        assert payload_hash(data) == payload_hash_reference(data), canonical_json(data)
        record = UsageRecord(f"e{i}", data, SourceCoordinates("t", 0, i))
        assert record.payload_sha256 == payload_hash_reference(data)
