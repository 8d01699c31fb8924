"""``invoicing import focus``: the FOCUS sample into a topic of its own, read back."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Message
from typer.testing import CliRunner

from streams.adapters.kafka import ensure_topics
from streams.apps.importers import TopicMissing
from streams.bootstrap import run_import_focus
from streams.core.domain.codec import decode
from streams.core.domain.events import CustomerUpserted, UsageRecorded
from streams.core.domain.focus import FocusUsage, iter_focus_rows
from streams.entrypoints.app import app
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS, TopicSpec
from tests.support.kafka import drain, headers_of, java_partition

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
PARTITIONS = 12


def with_prefix(settings: Settings, prefix: str) -> Settings:
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    return settings.model_copy(update={"kafka": kafka})


@pytest.fixture
def prefixed(settings: Settings, unique: str) -> Settings:
    """Settings whose account-events topic is a fresh 12-partition topic of this test."""
    prefix = f"test-import-{unique}."
    ensure_topics(settings.kafka, (ACCOUNT_EVENTS.with_prefix(prefix),))
    return with_prefix(settings, prefix)


def topic_of(settings: Settings) -> str:
    return settings.kafka.topic_prefix + ACCOUNT_EVENTS.name


def sample_usages() -> list[FocusUsage]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        return [r for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]


def corrupt_billed_cost(tmp_path: Path, line_number: int, value: str = "12.3.4") -> Path:
    """A copy of the sample whose physical line ``line_number`` has a bad BilledCost."""
    lines = SAMPLE.read_text(encoding="utf-8").splitlines(keepends=True)
    header = next(csv.reader([lines[0]]))
    row = next(csv.reader([lines[line_number - 1]]))
    row[header.index("BilledCost")] = value
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(row)
    lines[line_number - 1] = buffer.getvalue()
    path = tmp_path / "focus_bad_row.csv"
    path.write_text("".join(lines), encoding="utf-8")
    return path


def check_topic(messages: list[Message], usages: list[FocusUsage]) -> None:
    """Every record decodes, sits on Java's murmur2 partition of its key, and each
    customer's customer.upserted precedes its first usage on that partition."""
    types: Counter[str] = Counter()
    first_customer: dict[str, int] = {}
    first_usage: dict[str, int] = {}
    usage_ids: set[str] = set()
    partitions: dict[str, set[int]] = defaultdict(set)
    for msg in messages:
        assert msg.error() is None
        key = msg.key()
        assert key is not None
        envelope = decode(key, msg.value(), headers_of(msg))
        types[envelope.type] += 1
        partition, offset = msg.partition(), msg.offset()
        assert partition is not None and offset is not None
        assert partition == java_partition(key, PARTITIONS), envelope.subject
        partitions[envelope.subject].add(partition)
        if isinstance(envelope.data, CustomerUpserted):
            first_customer.setdefault(envelope.subject, offset)
            first_customer[envelope.subject] = min(first_customer[envelope.subject], offset)
        else:
            assert isinstance(envelope.data, UsageRecorded)
            usage_ids.add(envelope.id)
            assert envelope.source.startswith("/importers/focus/")
            first_usage[envelope.subject] = min(first_usage.get(envelope.subject, offset), offset)
    customers = {u.usage.customer_id for u in usages}
    assert types == {"usage.recorded": len(usages), "customer.upserted": len(customers)}
    assert usage_ids == {u.event_id for u in usages}
    assert set(first_customer) == customers == set(first_usage)
    assert all(len(p) == 1 for p in partitions.values())
    for customer in customers:
        assert first_customer[customer] < first_usage[customer], customer


def test_sample_import_reads_back_in_order_on_murmur2_partitions(prefixed: Settings) -> None:
    summary = run_import_focus(SAMPLE, prefixed, progress=False)
    print(
        f"\nFOCUS import: {summary.rows} rows in {summary.elapsed_s:.3f}s = "
        f"{summary.rows_per_s:.0f} rows/s (1073 records, flush included)"
    )
    assert summary.ok, summary.delivery_failures
    assert (summary.rows, summary.produced, summary.customers_produced) == (1000, 1000, 73)
    assert summary.skipped == ()
    assert summary.customers == 73
    assert dict(summary.periods) == {"2024-09": 999, "2024-10": 1}
    assert summary.topic == topic_of(prefixed)

    messages = drain(prefixed.kafka, summary.topic, expected=1073, timeout_s=60)
    assert len(messages) == 1073
    check_topic(messages, sample_usages())


def test_a_bad_row_is_reported_with_its_line_and_the_rest_is_produced(
    prefixed: Settings, tmp_path: Path
) -> None:
    bad = corrupt_billed_cost(tmp_path, line_number=500)
    summary = run_import_focus(bad, prefixed, progress=False)
    assert summary.ok
    assert (summary.rows, summary.produced) == (1000, 999)
    assert len(summary.skipped) == 1
    skipped = summary.skipped[0]
    assert skipped.line_number == 500
    assert "BilledCost" in skipped.reason and "12.3.4" in skipped.reason
    assert dict(summary.skipped_by_reason) == {"BilledCost '…' is not a decimal number": 1}

    messages = drain(prefixed.kafka, summary.topic, expected=999 + summary.customers_produced)
    with bad.open(newline="", encoding="utf-8") as handle:
        usages = [r for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]
    assert len(usages) == 999
    check_topic(messages, usages)


def test_cli_prints_skipped_line_exits_0_and_3_with_strict(
    prefixed: Settings, tmp_path: Path
) -> None:
    bad = corrupt_billed_cost(tmp_path, line_number=17)
    env = {"INVOICING_KAFKA__TOPIC_PREFIX": prefixed.kafka.topic_prefix}
    runner = CliRunner()
    result = runner.invoke(app, ["import", "focus", str(bad), "--json", "--no-progress"], env=env)
    assert result.exit_code == 0, result.output
    assert "line 17: BilledCost '12.3.4' is not a decimal number" in result.stderr
    report = json.loads(result.stdout)
    assert report["produced"] == 999 and report["skipped"] == 1
    assert report["skipped_rows"][0]["line"] == 17
    assert report["skipped_by_reason"] == {"BilledCost '…' is not a decimal number": 1}

    strict = runner.invoke(app, ["import", "focus", str(bad), "--strict", "--no-progress"], env=env)
    assert strict.exit_code == 3, strict.output


def test_delivery_failures_are_errors_in_the_summary_and_exit_1(
    settings: Settings, unique: str
) -> None:
    # A topic whose broker-side record-batch limit is below any batch: every delivery fails.
    prefix = f"test-import-tiny-{unique}."
    spec = ACCOUNT_EVENTS.with_prefix(prefix)
    tiny = TopicSpec(
        name=spec.name,
        partitions=spec.partitions,
        key=spec.key,
        description=spec.description,
        extra_config={"max.message.bytes": "64"},
    )
    ensure_topics(settings.kafka, (tiny,))
    prefixed = with_prefix(settings, prefix)
    summary = run_import_focus(SAMPLE, prefixed, progress=False)
    assert not summary.ok
    assert summary.produced == 0
    assert len(summary.delivery_failures) == 1073
    assert {f.event_type for f in summary.delivery_failures} == {
        "usage.recorded",
        "customer.upserted",
    }
    assert all("MSG_SIZE_TOO_LARGE" in f.error for f in summary.delivery_failures)

    env = {"INVOICING_KAFKA__TOPIC_PREFIX": prefix}
    result = CliRunner().invoke(app, ["import", "focus", str(SAMPLE), "--no-progress"], env=env)
    assert result.exit_code == 1, result.output
    assert "delivery failure" in result.stderr


def test_missing_topic_produces_nothing(settings: Settings, unique: str) -> None:
    prefixed = with_prefix(settings, f"test-import-none-{unique}.")
    with pytest.raises(TopicMissing):
        run_import_focus(SAMPLE, prefixed, progress=False)
