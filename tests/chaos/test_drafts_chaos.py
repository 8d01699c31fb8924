"""Exactly once through a draft's finalisation (docs/invoices.md "Drafts and finalisation").

An invoicing worker makes the drafts of three customers (grace period 1000 h) and stops.
Then ``invoicing invoice finalize`` asks for one draft and its finalising worker dies:

- **after the commit**: a worker with the fault hook
  ``INVOICING_FAULT__KILL_AFTER_DB_COMMIT`` (SIGKILL after an invoice job's database
  commit, before its offset commit) finalises it — number, invoice, outbox row, draft
  ``finalized``, one transaction — and kills itself before committing the marker's
  offset. The next worker gets the marker again and must find the invoice written;
- **before the commit**: the worker is SIGKILLed while the finalisation waits on its
  (slow) committed tax call; nothing is written, the next worker finalises the same
  usage under the same idempotency key.

Asserted in both: one invoice with one number (the period's series has exactly one
number, no gap), one outbox row, one email; the draft finalised under that number; the
other drafts still drafts, unnumbered.

Oracles: the ids this test derives, the owner's view of the rows, the SMTP sink's Maildir.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from streams.adapters.tax.wire import chunk_key
from streams.bootstrap import run_close_period
from streams.core.billing.issuance import outbox_event_id, tax_idempotency_key
from streams.core.domain.events import (
    CustomerUpserted,
    EventData,
    InvoiceIssued,
    UsageRecorded,
    invoice_id_for,
)
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.chaos.harness import kill_worker, stop_workers_and_collect_stats
from tests.support.documents_flow import cli, one, produce, wait_for
from tests.support.kafka import group_lag
from tests.support.pipeline import Pipeline, isolated_pipeline

PERIOD = "2026-09"
#: Slow enough that the finalisation is still waiting on its tax call when it is killed.
SLOW_TAX_S = 5.0
FAST_TAX_S = 0.02
NAMES = ("first", "second", "third")


class _Scenario:
    def __init__(self, p: Pipeline) -> None:
        self.p = p


def _count(p: Pipeline, sql: str, *params: object) -> int:
    return int(one(p, sql, *params))


def _drafts(p: Pipeline) -> int:
    return _count(p, "SELECT count(*) FROM invoice_drafts WHERE status = 'draft'")


def _drafts_of_three(p: Pipeline, unique: str) -> list[str]:
    """Three customers' drafts made by a first worker, which then stops; returns the ids."""
    customers = [f"{unique}-{name}" for name in NAMES]
    items: list[tuple[EventData, str]] = []
    for customer in customers:
        items.append(
            (
                CustomerUpserted(
                    customer_id=customer,
                    name=f"Customer {customer}",
                    email=f"ap-{customer}@customer.example",
                    currency="USD",
                    invoice_grace_hours=Decimal(1000),
                ),
                f"{customer}-upsert",
            )
        )
        items.append(
            (
                UsageRecorded(
                    customer_id=customer,
                    billing_period=PERIOD,
                    amount=Decimal("19.995"),
                    currency="USD",
                    event_time=datetime(2026, 9, 4, tzinfo=UTC),
                ),
                f"{customer}-usage",
            )
        )
    produce(p, items, source="/test/drafts-chaos")
    first = p.workers.start("invoicing", 1)[0]
    p.workers.start("email", 1)
    run_close_period(PERIOD, p.settings, progress=False)
    wait_for("three drafts", lambda: _drafts(p) == len(NAMES), p)
    first.process.terminate()
    assert first.process.wait(45) == 0, p.worker_logs()
    return customers


def _issued_once(p: Pipeline, target: str) -> None:
    """Once the next owner committed past the marker: one invoice, one number, one
    outbox row, one email; the other drafts untouched."""
    wait_for(
        "the redelivered finalisation marker committed",
        lambda: group_lag(p.settings.kafka, p.settings.worker.invoicing_group, p.topic) == 0,
        p,
        timeout_s=120,
    )
    number = one(p, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", target)
    assert _count(p, "SELECT count(*) FROM invoices") == 1
    assert number == f"INV-{PERIOD}-000001", number
    assert (
        one(p, "SELECT last_value FROM document_counters WHERE series = %s", f"INV-{PERIOD}") == 1
    )
    event_id = outbox_event_id(InvoiceIssued.event_type, target)
    assert _count(p, "SELECT count(*) FROM outbox WHERE id = %s", event_id) == 1
    assert _count(p, "SELECT count(*) FROM outbox") == 1
    assert one(p, "SELECT invoice_number FROM invoice_drafts WHERE invoice_id = %s", target) == (
        number
    )
    assert _drafts(p) == len(NAMES) - 1
    wait_for("the finalised invoice's email sent", lambda: _emails_settled(p, target), p)
    assert [m["X-Invoice-Id"] for m in list_messages(p.maildir)] == [target]


@pytest.mark.timeout(300)
def test_a_worker_killed_between_finalising_and_committing_issues_once(
    settings: Settings, unique: str, tmp_path: Path
) -> None:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        customers = _drafts_of_three(p, unique)
        hooked = p.workers.start(
            "invoicing", 1, extra_env={"INVOICING_FAULT__KILL_AFTER_DB_COMMIT": "1"}
        )[0]
        target = invoice_id_for(customers[0], PERIOD, 1)
        asked = cli(_Scenario(p), "invoice", "finalize", target, "--wait", "0")
        assert asked.exit_code == 0, asked.output
        try:
            code = hooked.process.wait(90)
        except Exception as exc:
            raise AssertionError(
                f"the hooked worker did not kill itself\n{p.worker_logs()}"
            ) from exc
        assert code == -9, p.worker_logs()
        assert "fault injection: SIGKILL after the invoice's database commit" in (
            hooked.log.read_text()
        )
        # committed before the kill: the invoice, its number, the finalised draft
        assert _count(p, "SELECT count(*) FROM invoices WHERE invoice_id = %s", target) == 1

        p.workers.start("invoicing", 1)
        _issued_once(p, target)
        stats = stop_workers_and_collect_stats(p)
        assert stats["invoicing-3"].get("invoice_already_invoiced", 0) >= 1, stats
        assert stats["invoicing-3"].get("invoice_invoiced", 0) == 0, stats


@pytest.mark.timeout(300)
def test_a_worker_killed_while_finalising_before_its_commit_issues_once(
    settings: Settings, unique: str, tmp_path: Path
) -> None:
    with isolated_pipeline(settings, unique, tmp_path) as p:
        customers = _drafts_of_three(p, unique)
        victim = p.workers.start("invoicing", 1)[0]
        target = invoice_id_for(customers[0], PERIOD, 1)
        p.tax.admin.configure(base_latency_s=SLOW_TAX_S)
        asked = cli(_Scenario(p), "invoice", "finalize", target, "--wait", "0")
        assert asked.exit_code == 0, asked.output
        wait_for(
            "the finalisation's committed tax call in flight",
            lambda: any(r.commit and r.customer_id == customers[0] for r in p.tax.admin.requests()),
            p,
            timeout_s=60,
        )
        kill_worker(victim)  # before its database commit: the tax answer is seconds away
        p.tax.admin.configure(base_latency_s=FAST_TAX_S)
        assert _count(p, "SELECT count(*) FROM invoices") == 0, "nothing committed yet"

        p.workers.start("invoicing", 1)
        _issued_once(p, target)
        asked_keys = [
            r.idempotency_key
            for r in p.tax.admin.requests()
            if r.commit and r.customer_id == customers[0]
        ]
        # the same document (its one chunk), asked by the killed worker and again
        assert set(asked_keys) == {chunk_key(tax_idempotency_key(target, 1), 0)}, asked_keys
        assert len(asked_keys) >= 2, asked_keys
        stats = stop_workers_and_collect_stats(p)
        assert stats["invoicing-3"].get("invoice_invoiced", 0) == 1, stats


def _emails_settled(p: Pipeline, invoice_id: str) -> bool:
    return (
        _count(
            p,
            "SELECT count(*) FROM email_deliveries WHERE document_id = %s AND status = 'sent'",
            invoice_id,
        )
        == 1
    )
