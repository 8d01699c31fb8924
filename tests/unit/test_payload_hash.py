"""The fast canonical JSON of usage data is the reference text, so stored hashes hold."""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

from streams.core.billing.rows import (
    PAYLOAD_HASH_KEYS,
    SourceCoordinates,
    UsageRecord,
    canonical_json,
    payload_hash,
    payload_hash_reference,
)
from streams.core.domain.events import UsageRecorded
from streams.core.domain.focus import FocusUsage, iter_focus_rows

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


#: A usage payload and its canonical text, written by hand from the rule of
#: :func:`streams.core.billing.rows.payload_hash` (sorted keys, no spaces, ASCII escapes, decimals as plain strings
#: without trailing fractional zeros, times in UTC with ``Z``, schema_version included).
PINNED_USAGE = UsageRecorded(
    customer_id="acct-1",
    billing_period="2024-09",
    amount=Decimal("1.50"),
    currency="USD",
    quantity=Decimal("2"),
    unit="Hours",
    description="Café — 東京",
    event_time=datetime(2024, 9, 3, 12, 0, tzinfo=UTC),
)
PINNED_TEXT = (
    '{"amount":"1.5","billing_period":"2024-09","charge_category":null,'
    '"consumed_quantity":null,"consumed_unit":null,"currency":"USD","customer_id":"acct-1",'
    '"description":"Caf\\u00e9 \\u2014 \\u6771\\u4eac","event_time":"2024-09-03T12:00:00Z",'
    '"provider":null,"quantity":"2","region_id":null,"schema_version":1,"sku_id":null,'
    '"unit":"Hours"}'
)
#: sha256 of PINNED_TEXT, as stored in ``usage_lines.payload_hash`` since the hash was
#: defined: a change here changes every stored hash (every resend becomes a conflict).
PINNED_HASH = "7afbc368a8303fe653e9a1a8632066841717ddfa72c79dc1a9839f91799e3de9"


def test_a_known_payload_keeps_its_pinned_hash() -> None:
    assert hashlib.sha256(PINNED_TEXT.encode()).hexdigest() == PINNED_HASH
    assert payload_hash(PINNED_USAGE) == PINNED_HASH
    assert payload_hash_reference(PINNED_USAGE) == PINNED_HASH
