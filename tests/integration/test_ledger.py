"""The example subscriber (examples/ledger) against a real pipeline in a sandbox.

FOCUS sample → 2 invoicing workers + email sender → close every period → 73
invoices on billing.invoices.v1 (through the outbox and Debezium). The ledger, run
as its own process (``python -m examples.ledger``) in its own consumer group from
the beginning of the topic, must end with the invoices table's issued totals;
redelivered and republished events must count once; credit notes, new revisions
and voids must leave each (customer, period) at its current revision's total.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from streams.bootstrap import run_import_focus
from streams.core.billing import store
from streams.core.domain.events import (
    CreditNoteIssued,
    InvoiceIssued,
    InvoiceVoided,
    deterministic_id,
    invoice_id_for,
)
from streams.settings import Settings
from tests.integration.test_main_job import (
    SAMPLE,
    run_period_close,
    wait_invoiced_and_emailed,
)
from tests.support.kafka import ProduceHeaders, drain, headers_of
from tests.support.pipeline import Pipeline, isolated_pipeline

ROOT = Path(__file__).resolve().parents[2]
Balances = dict[tuple[str, str, str], Decimal]


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        yield p


def run_ledger(p: Pipeline, group: str) -> dict[str, int]:
    """Run the ledger process until it has caught up; its outcome counts."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.ledger",
            "--bootstrap",
            p.settings.kafka.bootstrap_servers,
            "--topic",
            p.invoices_topic,
            "--group",
            group,
            "--dsn",
            p.settings.postgres.dsn("owner"),
            "--until-caught-up",
            "--max-seconds",
            "120",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    outcomes: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcomes


def ledger_balances(p: Pipeline) -> Balances:
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, billing_period, currency, balance FROM ledger.balances"
        ).fetchall()
    return {(r[0], r[1], r[2]): r[3] for r in rows}


def issued_totals(p: Pipeline) -> Balances:
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, billing_period, currency, total FROM invoices "
            "WHERE status = 'issued'"
        ).fetchall()
    return {(r[0], r[1], r[2].strip()): r[3] for r in rows}


def per_customer(balances: Balances) -> dict[tuple[str, str], Decimal]:
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for (customer, _period, currency), amount in balances.items():
        totals[(customer, currency)] += amount
    return dict(totals)


def table_count(p: Pipeline, table: str) -> int:
    with p.connect() as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_ledger_matches_the_issued_invoices_and_counts_each_event_once(
    pipeline: Pipeline, unique: str
) -> None:
    p = pipeline
    run_import_focus(SAMPLE, p.settings, progress=False)
    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)
    run_period_close(p)
    wait_invoiced_and_emailed(p, 73)
    p.workers.stop()
    records = drain(p.settings.kafka, p.invoices_topic, expected=73, timeout_s=60)
    assert len(records) == 73

    # 1. From the beginning, in its own group: the ledger equals the invoices table.
    assert run_ledger(p, f"ledger-{unique}") == {"applied": 73}
    issued = issued_totals(p)
    balances = ledger_balances(p)
    assert len(issued) == 73
    assert balances == issued
    assert per_customer(balances) == per_customer(issued)
    assert table_count(p, "ledger.inbox") == 73
    assert table_count(p, "ledger.entries") == 73

    # 2. A redelivered copy (same headers, same ce_id) and a republished document
    #    (new ce_id, as reconciliation does): both count once.
    original = records[0]
    headers: ProduceHeaders = list(headers_of(original))
    new_id = str(uuid.uuid4()).encode()
    republished: ProduceHeaders = [
        (name, new_id if name in ("ce_id", "id") else value) for name, value in headers
    ]
    partition = original.partition()
    assert partition is not None
    producer = Producer({"bootstrap.servers": p.settings.kafka.bootstrap_servers})
    for copy_headers in (headers, republished):
        producer.produce(
            p.invoices_topic,
            key=original.key(),
            value=original.value(),
            headers=copy_headers,
            partition=partition,
        )
    assert producer.flush(10) == 0
    assert run_ledger(p, f"ledger-{unique}") == {"duplicate_event": 1, "duplicate_document": 1}
    assert ledger_balances(p) == issued
    assert table_count(p, "ledger.entries") == 73
    with p.connect() as conn:
        outcome = conn.execute(
            "SELECT outcome FROM ledger.inbox WHERE event_id = %s", (new_id.decode(),)
        ).fetchone()
    assert outcome == ("duplicate_document",)

    # 3. A credit note and a corrected revision for one customer, a void for another
    #    (published through the outbox like the pipeline does): each (customer,
    #    period) ends at its current revision's total, or zero when voided.
    (corrected, voided), expected = corrections(p, issued)
    assert run_ledger(p, f"ledger-{unique}") == {"applied": 3}
    after = ledger_balances(p)
    assert after == expected
    assert after[corrected] == issued[corrected] + Decimal("1.00")
    assert after[voided] == 0

    # 4. A second ledger group re-reading everything into the same tables changes nothing.
    assert run_ledger(p, f"ledger-again-{unique}") == {"duplicate_event": 78}
    assert ledger_balances(p) == expected


def corrections(
    p: Pipeline, issued: Balances
) -> tuple[tuple[tuple[str, str, str], tuple[str, str, str]], Balances]:
    """Publish credit note + revision 2 for the first customer and a void for the second;
    wait until Debezium routed them. Returns the two keys and the expected balances."""
    [first, second] = sorted(issued)[:2]
    with p.connect() as conn:
        rows = {
            (r[0], r[1]): r
            for r in conn.execute(
                "SELECT customer_id, billing_period, invoice_id::text, invoice_number, "
                "customer_name, email, subtotal, tax_total, total, currency FROM invoices "
                "WHERE status = 'issued'"
            ).fetchall()
        }
    now = datetime.now(UTC)
    customer, period, currency = first
    row = rows[(customer, period)]
    credit_note_id = deterministic_id("credit_note", row[2])
    revision_2 = invoice_id_for(customer, period, 2)
    credit = CreditNoteIssued(
        credit_note_id=credit_note_id,
        credit_note_number=f"CN-{period}-000001",
        invoice_id=row[2],
        invoice_number=row[3],
        revision=1,
        customer_id=customer,
        customer_name=row[4],
        email=row[5],
        billing_period=period,
        currency=currency,
        subtotal=row[6],
        tax_total=row[7],
        total=row[8],
        reason="test: corrected usage",
        issued_at=now,
    )
    reissued = InvoiceIssued(
        invoice_id=revision_2,
        invoice_number=f"INV-{period}-999999",
        revision=2,
        customer_id=customer,
        customer_name=row[4],
        email=row[5],
        billing_period=period,
        currency=currency,
        line_count=1,
        subtotal=row[6] + Decimal("1.00"),
        tax_total=row[7],
        total=row[8] + Decimal("1.00"),
        issued_at=now,
        supersedes_invoice_id=row[2],
    )
    void_customer, void_period, _ = second
    void_row = rows[(void_customer, void_period)]
    void = InvoiceVoided(
        invoice_id=void_row[2],
        invoice_number=void_row[3],
        revision=1,
        customer_id=void_customer,
        billing_period=void_period,
        reason="test: duplicate account",
        voided_at=now,
    )
    documents: list[tuple[Any, str]] = [
        (credit, credit_note_id),
        (reissued, revision_2),
        (void, void_row[2]),
    ]
    with p.connect() as conn, conn.transaction():
        for event, document_id in documents:
            store.invoices.insert_outbox(
                conn,
                event_id=deterministic_id("outbox", event.event_type, document_id),
                topic=p.invoices_topic,
                customer_id=event.customer_id,
                event=event,
                source="/tests/ledger",
                time=now,
                document_id=document_id,
            )
    assert len(drain(p.settings.kafka, p.invoices_topic, expected=78, timeout_s=90)) == 78
    expected = dict(issued)
    expected[first] = row[8] + Decimal("1.00")
    expected[second] = Decimal("0")
    return (first, second), expected
