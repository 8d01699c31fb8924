"""The main job, end to end, on the bundled FOCUS sample, against the real stack.

FOCUS CSV → billing.account-events.v1 → invoicing workers (separate processes)
→ invoices + outbox → Debezium → billing.invoices.v1 → email sender → SMTP sink.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Producer

from streams.apps.ops.focus_expected import expected_from_file
from streams.bootstrap import run_close_period, run_import_focus
from streams.core.domain.codec import decode
from streams.core.domain.events import InvoiceIssued
from streams.core.domain.money import round_money
from streams.devtools.demo.run import progress_counts
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.support.barriers import plus_sentinel, sentinel_invoice
from tests.support.kafka import (
    ProduceHeaders,
    drain,
    headers_of,
    read_to_end,
    text,
    wait_for_no_lag,
)
from tests.support.pipeline import Pipeline, isolated_pipeline

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
EXPECTED = expected_from_file(SAMPLE)


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


def run_period_close(p: Pipeline) -> None:
    for period in EXPECTED.periods:
        run_close_period(period, p.settings, progress=False)


def wait_invoiced_and_emailed(p: Pipeline, wanted: int, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    counts = (0, 0)
    with p.connect() as conn:
        while time.monotonic() < deadline:
            counts = progress_counts(conn, EXPECTED)
            if counts == (wanted, wanted):
                return
            dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
            assert not dead, f"workers died: {dead}\n{p.worker_logs()}"
            time.sleep(0.5)
    raise AssertionError(
        f"after {timeout_s}s: (invoiced, emailed) = {counts}, wanted {wanted}\n{p.worker_logs()}"
    )


def invoice_rows(p: Pipeline) -> dict[tuple[str, str], tuple[Decimal, Decimal, Decimal, str, int]]:
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, billing_period, subtotal, tax_total, total, invoice_id::text, line_count "
            "FROM invoices WHERE status = 'issued'"
        ).fetchall()
    return {(r[0], r[1]): (r[2], r[3], r[4], r[5], r[6]) for r in rows}


def state_counts(p: Pipeline) -> dict[str, int]:
    with p.connect() as conn:
        return {
            table: int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]
            for table in (
                "invoices",
                "invoice_lines",
                "outbox",
                "email_deliveries",
                "usage_lines",
                "period_closes",
            )
        }


def test_focus_sample_end_to_end_exactly_once(pipeline: Pipeline) -> None:
    p = pipeline
    summary = run_import_focus(SAMPLE, p.settings, progress=False)
    assert summary.produced == 1000 and not summary.skipped
    p.workers.start("invoicing", 3)
    p.workers.start("email", 1)
    run_period_close(p)
    wait_invoiced_and_emailed(p, 73)

    invoices = invoice_rows(p)
    assert len(invoices) == 73
    for key, exact in EXPECTED.sums.items():
        assert invoices[key][0] == round_money(exact, "USD"), key
    with p.connect() as conn:
        lines = conn.execute(
            "SELECT count(*), count(DISTINCT event_id) FROM invoice_lines"
        ).fetchone()
        assert lines == (1000, 1000)  # no usage line lost or counted twice
        # Every invoice traces to its events: (topic, partition, offset) of each line and the close marker.
        untraced = conn.execute(
            "SELECT count(*) FROM invoices WHERE source_topic <> %s OR close_offset IS NULL",
            (p.topic,),
        ).fetchone()
        assert untraced == (0,)

    # Exactly one invoice.issued per invoice on billing.invoices.v1 (Debezium outbox route).
    records = drain(p.settings.kafka, p.invoices_topic, expected=73, timeout_s=60)
    issued = [decode(r.key(), r.value(), headers_of(r), allowed=(InvoiceIssued,)) for r in records]
    per_invoice = Counter(e.data.invoice_id for e in issued)
    assert set(per_invoice) == {v[3] for v in invoices.values()}
    assert set(per_invoice.values()) == {1}

    # Exactly one email per emailed invoice (non-zero total), none for zero totals.
    messages = list_messages(p.maildir)
    by_invoice = Counter(m["X-Invoice-Id"] for m in messages)
    nonzero = {v[3] for v in invoices.values() if v[2] != 0}
    assert set(by_invoice) == nonzero
    assert set(by_invoice.values()) == {1}
    with p.connect() as conn:
        skipped = conn.execute(
            "SELECT count(*) FROM email_deliveries WHERE status = 'skipped'"
        ).fetchone()
        assert skipped == (73 - len(nonzero),)

    # Importing the same file again and closing again changes nothing.
    before = state_counts(p)
    run_import_focus(SAMPLE, p.settings, progress=False)
    run_period_close(p)
    wait_for_no_lag(p.settings.kafka, p.settings.worker.invoicing_group, p.topic)
    # A sentinel invoice through the whole pipeline: once its email is in, anything the
    # second import and close would have caused has happened (tests/support/barriers.py).
    sentinel_invoice(p)
    assert state_counts(p) == plus_sentinel(before)
    assert len(read_to_end(p.settings.kafka, p.invoices_topic)) == 73 + 1
    assert len(list_messages(p.maildir)) == len(nonzero) + 1


def test_a_close_after_the_workers_stored_everything_reads_no_record(pipeline: Pipeline) -> None:
    """The month-end order: the imports are stored, then the period is closed. The close
    reads no record of the topic (its customers come from the database, below the
    workers' committed offsets) and every customer is invoiced once."""
    p = pipeline
    assert run_import_focus(SAMPLE, p.settings, progress=False).produced == 1000
    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)
    wait_for_no_lag(p.settings.kafka, p.settings.worker.invoicing_group, p.topic)
    first, *others = EXPECTED.periods
    summary = run_close_period(first, p.settings, progress=False)
    assert summary.ok
    assert (summary.scanned_records, summary.from_topic) == (0, 0)
    assert summary.stored_records == 1073  # 1,000 usage lines and 73 customers
    assert set(summary.customers) == {c for c, period in EXPECTED.sums if period == first}
    for period in others:
        run_close_period(period, p.settings, progress=False)
    wait_invoiced_and_emailed(p, 73)
    assert len(invoice_rows(p)) == 73


def test_one_worker_and_three_workers_give_the_same_invoices(
    settings: Settings, unique: str, tmp_path: Path
) -> None:
    results = []
    for workers in (1, 3):
        with isolated_pipeline(settings, f"{unique}w{workers}", tmp_path / f"w{workers}") as p:
            run_import_focus(SAMPLE, p.settings, progress=False)
            p.workers.start("invoicing", workers)
            p.workers.start("email", 1)
            run_period_close(p)
            wait_invoiced_and_emailed(p, 73)
            rows = invoice_rows(p)
            results.append({k: (v[0], v[1], v[2], v[4]) for k, v in rows.items()})
    assert results[0] == results[1]
    assert len(results[0]) == 73


def test_bad_record_is_dead_lettered_its_customer_held_others_invoiced(pipeline: Pipeline) -> None:
    p = pipeline
    run_import_focus(SAMPLE, p.settings, progress=False)
    victim = "51738928782"  # first row's account in the sample
    producer = Producer(
        {"bootstrap.servers": p.settings.kafka.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    bad_value = json.dumps(
        {
            "schema_version": 1,
            "customer_id": victim,
            "billing_period": "2024-09",
            "amount": 12.5,
            "currency": "USD",
            "event_time": "2024-09-03T00:00:00Z",
        }
    ).encode()
    headers: ProduceHeaders = [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"poison-1"),
        ("ce_source", b"/tests"),
        ("ce_type", b"usage.recorded"),
        ("ce_time", b"2024-09-03T00:00:00Z"),
        ("ce_subject", victim.encode()),
        ("content-type", b"application/json"),
    ]
    producer.produce(p.topic, key=victim.encode(), value=bad_value, headers=headers)
    producer.produce(p.topic, key=b"garbage-key", value=b"\x00not json", headers=[])
    assert producer.flush(10) == 0

    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)
    run_period_close(p)
    wanted = 72
    deadline = time.monotonic() + 180
    with p.connect() as conn:
        while time.monotonic() < deadline:
            invoiced, emailed = progress_counts(conn, EXPECTED)
            held = conn.execute(
                "SELECT count(*) FROM period_closes WHERE outcome = 'held'"
            ).fetchone()
            if invoiced == wanted and emailed == wanted and held == (1,):
                break
            time.sleep(0.5)
        invoices = invoice_rows(p)
        assert len(invoices) == 72, p.worker_logs()
        assert (victim, "2024-09") not in invoices
        hold = conn.execute(
            "SELECT customer_id, billing_period, reason, source_topic, source_offset FROM invoice_holds "
            "WHERE released_at IS NULL ORDER BY customer_id"
        ).fetchall()
        assert {(h[0], h[1]) for h in hold} == {(victim, "2024-09"), ("garbage-key", None)}
        assert "amount" in next(h[2] for h in hold if h[0] == victim)
        closes = conn.execute(
            "SELECT outcome FROM period_closes WHERE customer_id = %s", (victim,)
        ).fetchall()
        assert closes == [("held",)]

    dead = drain(p.settings.kafka, p.dlq_topic, expected=2, timeout_s=30)
    assert len(dead) == 2
    for record in dead:
        meta = {k: text(v) for k, v in headers_of(record) if k.startswith("dlq.")}
        assert meta["dlq.source.topic"] == p.topic
        assert int(meta["dlq.source.offset"]) >= 0
        assert meta["dlq.reason"]
    reasons = {r.key(): text(dict(headers_of(r))["dlq.reason"]) for r in dead}
    assert "float" in reasons[victim.encode()] or "decimal" in reasons[victim.encode()]
    assert "JSON" in reasons[b"garbage-key"] or "header" in reasons[b"garbage-key"]
