"""Drafts and finalisation, end to end on the real stack (docs/invoices.md "Drafts and
finalisation").

One sandbox for the module (database, topics, groups, connector, SMTP sink, tax
service): customers with different grace periods (``customer.upserted``'s
``invoice_grace_hours``), their usage produced to Kafka, one invoicing worker process and
one email sender process, then one close-period. Each test works on a customer of its own:

- grace 0 (stated) and no grace at all: issued at the close, numbered, one outbox row,
  one email — the behaviour before drafts;
- a long grace period: a draft — no number, no outbox row, no email, no ``invoices`` row
  — shown by ``invoicing status`` and ``invoicing invoice show``; late usage re-rates it in
  place (its total moves, no credit note, no revision); ``invoicing invoice finalize``
  makes the owner issue it: one number from the gapless series, one outbox row, one
  email, the late usage included; a second finalize is refused;
- a grace period of 0.002 h (7.2 s: the field takes fractions of an hour, which is how
  this test shortens the timer; no test-only clock): the owner's timer finalises it;
- finalize of an issued invoice, or of an unknown id, is refused with a clear message.

Oracles: the ids this test derives (``invoice_id_for``, the outbox id), sums computed
here from the amounts it produced, the SMTP sink's Maildir, the owner's view of the rows.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.bootstrap import run_close_period
from streams.core.billing.issuance import outbox_event_id
from streams.core.domain.events import (
    CustomerUpserted,
    EventData,
    InvoiceIssued,
    UsageRecorded,
    invoice_id_for,
)
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.support.documents_flow import cli, one, produce, sent_emails, wait_for
from tests.support.pipeline import Pipeline, isolated_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), pytest.mark.xdist_group("drafts")]

PERIOD = "2026-11"
#: customer name → its invoice_grace_hours (None: not stated)
GRACE: dict[str, Decimal | None] = {
    "zero": Decimal(0),
    "unset": None,
    "command": Decimal(1000),
    "timer": Decimal("0.002"),
}
AMOUNTS = (Decimal("40.125"), Decimal("12.5"))
LATE = Decimal("7.25")


@dataclass
class Scenario:
    p: Pipeline
    unique: str

    def customer(self, name: str) -> str:
        return f"{self.unique}-{name}"

    def invoice_id(self, name: str) -> str:
        return invoice_id_for(self.customer(name), PERIOD, 1)


def _usage(customer: str, n: int, amount: Decimal) -> tuple[EventData, str]:
    return (
        UsageRecorded(
            customer_id=customer,
            billing_period=PERIOD,
            amount=amount,
            currency="USD",
            description=f"usage {n}",
            event_time=datetime(2026, 11, 3 + n, tzinfo=UTC),
        ),
        f"{customer}-usage-{n}",
    )


@pytest.fixture(scope="module")
def scenario(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    unique = f"draft{uuid.uuid4().hex[:8]}"
    with isolated_pipeline(settings, unique, tmp_path_factory.mktemp("drafts")) as p:
        s = Scenario(p, unique)
        items: list[tuple[EventData, str]] = []
        for name, grace in GRACE.items():
            customer = s.customer(name)
            items.append(
                (
                    CustomerUpserted(
                        customer_id=customer,
                        name=f"Customer {name}",
                        email=f"ap-{name}@customer.example",
                        currency="USD",
                        invoice_grace_hours=grace,
                    ),
                    f"{customer}-upsert",
                )
            )
            items += [_usage(customer, n, a) for n, a in enumerate(AMOUNTS)]
        produce(p, items, source="/test/drafts")
        p.workers.start("invoicing", 1)
        p.workers.start("email", 1)
        run_close_period(PERIOD, p.settings, progress=False)
        wait_for(
            "the immediate invoices emailed",
            lambda: (
                {m["X-Invoice-Id"] for m in list_messages(p.maildir)}
                >= {s.invoice_id("zero"), s.invoice_id("unset")}
            ),
            p,
        )
        wait_for(
            "the draft of the long grace period",
            lambda: _draft(p, s.invoice_id("command")) is not None,
            p,
        )
        yield s


def _draft(p: Pipeline, invoice_id: str) -> tuple[str, Decimal, int, str | None] | None:
    with p.connect() as conn:
        row = conn.execute(
            "SELECT status, subtotal, rerated, invoice_number FROM invoice_drafts "
            "WHERE invoice_id = %s",
            (invoice_id,),
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


def _count(p: Pipeline, sql: str, *params: object) -> int:
    return int(one(p, sql, *params))


def _issued(s: Scenario, name: str) -> int:
    return _count(s.p, "SELECT count(*) FROM invoices WHERE invoice_id = %s", s.invoice_id(name))


def _outbox(s: Scenario, name: str) -> int:
    event_id = outbox_event_id(InvoiceIssued.event_type, s.invoice_id(name))
    return _count(s.p, "SELECT count(*) FROM outbox WHERE id = %s", event_id)


def _text(output: str) -> str:
    """The CLI's output on one line (the console wraps long lines)."""
    return " ".join(output.split())


def _emails(s: Scenario, name: str) -> int:
    return len(sent_emails(s.p, "X-Invoice-Id", s.invoice_id(name)))


# --------------------------------------------------------------------------- tests


def test_grace_zero_or_unset_issues_at_the_close_as_before(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    subtotal = Decimal("52.62")  # round_half_even(40.125 + 12.5)
    for name in ("zero", "unset"):
        number = one(
            p, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", s.invoice_id(name)
        )
        assert number.startswith(f"INV-{PERIOD}-"), number
        assert (
            one(p, "SELECT subtotal FROM invoices WHERE invoice_id = %s", s.invoice_id(name))
            == subtotal
        )
        assert _outbox(s, name) == 1
        assert _emails(s, name) == 1
        assert _draft(p, s.invoice_id(name)) is None, f"{name}: no draft with grace 0"
        assert (
            one(
                p,
                "SELECT outcome FROM period_closes WHERE customer_id = %s",
                s.customer(name),
            )
            == "invoiced"
        )


def test_a_draft_has_no_number_event_or_email_and_is_shown(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    draft = _draft(p, s.invoice_id("command"))
    assert draft is not None and draft[0] == "draft" and draft[3] is None
    assert _issued(s, "command") == 0
    assert _outbox(s, "command") == 0
    assert _emails(s, "command") == 0
    assert (
        one(p, "SELECT outcome FROM period_closes WHERE customer_id = %s", s.customer("command"))
        == "drafted"
    )

    shown = cli(s, "invoice", "show", s.invoice_id("command"), "--json")
    assert shown.exit_code == 0, shown.output
    body = json.loads(shown.output)
    assert body["status"] == "draft" and body["invoice_number"] is None
    assert body["grace_source"] == "customer" and Decimal(body["grace_hours"]) == 1000

    status = cli(s, "status", "--json")
    drafts = json.loads(status.output)["drafts"]
    assert s.invoice_id("command") in {d["draft"] for d in drafts}, status.output


def test_late_usage_re_rates_the_draft_then_finalize_issues_it_once(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    customer = s.customer("command")
    before = _draft(p, s.invoice_id("command"))
    assert before is not None and before[1] == Decimal("52.62")

    produce(p, [_usage(customer, 9, LATE)], source="/test/drafts")
    rerated = wait_for(
        "the draft re-rated with the late usage",
        lambda: (d := _draft(p, s.invoice_id("command"))) is not None and d[2] >= 1 and d,
        p,
    )
    assert rerated[0] == "draft" and rerated[1] == Decimal("59.88")  # 40.125 + 12.5 + 7.25
    assert _issued(s, "command") == 0 and _outbox(s, "command") == 0
    assert _count(p, "SELECT count(*) FROM credit_notes WHERE customer_id = %s", customer) == 0

    done = cli(s, "invoice", "finalize", s.invoice_id("command"), "--wait", "120")
    assert done.exit_code == 0, done.output + p.worker_logs()
    number = one(
        p, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", s.invoice_id("command")
    )
    assert number in done.output
    assert one(
        p, "SELECT subtotal FROM invoices WHERE invoice_id = %s", s.invoice_id("command")
    ) == Decimal("59.88")
    assert (
        _count(
            p, "SELECT count(*) FROM invoice_lines WHERE invoice_id = %s", s.invoice_id("command")
        )
        == 3
    )
    final = _draft(p, s.invoice_id("command"))
    assert final is not None and final[0] == "finalized" and final[3] == number
    assert _outbox(s, "command") == 1
    wait_for("the finalised invoice emailed", lambda: _emails(s, "command") >= 1, p)

    again = cli(s, "invoice", "finalize", s.invoice_id("command"), "--wait", "0")
    assert again.exit_code == 2, again.output
    assert "no draft any more" in _text(again.output) and number in _text(again.output)
    shown = json.loads(cli(s, "invoice", "show", number, "--json").output)
    assert shown["status"] == "issued" and shown["invoice_number"] == number
    assert _emails(s, "command") == 1 and _issued(s, "command") == 1


def test_the_grace_timer_finalises_the_draft(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    wait_for(
        "the timer's finalisation",
        lambda: (d := _draft(p, s.invoice_id("timer"))) is not None and d[0] == "finalized",
        p,
        timeout_s=120,
    )
    assert _issued(s, "timer") == 1 and _outbox(s, "timer") == 1
    wait_for("the timer's invoice emailed", lambda: _emails(s, "timer") >= 1, p)
    assert _emails(s, "timer") == 1
    assert "finalisation requested" in p.worker_logs()


def test_finalize_of_a_non_draft_is_refused(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    number = one(
        p, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", s.invoice_id("zero")
    )
    for ident in (s.invoice_id("zero"), number):
        refused = cli(s, "invoice", "finalize", ident, "--wait", "0")
        assert refused.exit_code == 2, refused.output
        assert "is issued, not a draft: only a draft can be finalized" in _text(refused.output)
    unknown = cli(s, "invoice", "finalize", str(uuid.uuid4()), "--wait", "0")
    assert unknown.exit_code == 2 and "no draft or invoice" in _text(unknown.output)
    assert _issued(s, "zero") == 1 and _emails(s, "zero") == 1
