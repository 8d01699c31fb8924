"""``invoicing invoice void``, end to end on the real stack (docs/invoices.md "Void").

One sandbox for the module (database, topics, groups, connector, SMTP sink, tax service):
usage of four customers produced to Kafka, invoiced by an invoicing worker process and
emailed by an email sender process. Each test then works on a customer of its own:

- a void through the CLI (the admin role, ``void_invoice()`` of migration 0020): the
  revision ``voided``, the reason and who/when stored, one ``invoice.voided`` outbox row
  routed by Debezium to the invoices topic, exactly one email saying so; a second void
  refused with a clear message and nothing written;
- refusals: an unknown id or number, a superseded revision, an invalid reason;
- only the admin role may call the function (every other runtime role gets
  ``InsufficientPrivilege``), and two voids at once: one wins, the other is refused;
- a replay after a void (late usage arrived) reissues nothing (docs/replay.md).

Oracles: the ids this test derives (``invoice_id_for``, the outbox id of the void), the
records Debezium published, the SMTP sink's Maildir, the owner's view of the rows.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
import pytest
from confluent_kafka import Message
from psycopg import errors
from typer.testing import CliRunner

from streams.apps.ops.void import InvoiceNotVoidable, Voided, void_invoice
from streams.apps.replay import Mode
from streams.bootstrap import replay_period, run_close_period
from streams.core.billing.issuance import outbox_event_id
from streams.core.domain.codec import decode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    EventData,
    InvoiceIssued,
    InvoiceVoided,
    UsageRecorded,
    invoice_id_for,
)
from streams.devtools.stack.maildir import list_messages
from streams.entrypoints.app import app
from streams.settings import RoleName, Settings
from streams.topics import INVOICES
from tests.support.documents_flow import cli, one, produce, sent_emails, wait_for
from tests.support.kafka import drain, headers_of
from tests.support.pipeline import Pipeline, isolated_pipeline

# one sandbox for the module: its tests stay on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), pytest.mark.xdist_group("void")]

PERIOD = "2026-10"
CUSTOMERS = ("cli", "refused", "roles", "racing", "replayed")
ALLOWED = (InvoiceIssued, InvoiceVoided)


@dataclass
class Scenario:
    p: Pipeline
    unique: str

    def customer(self, name: str) -> str:
        return f"{self.unique}-{name}"

    def invoice_id(self, name: str) -> str:
        return invoice_id_for(self.customer(name), PERIOD, 1)


@pytest.fixture(scope="module")
def scenario(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    unique = f"void{uuid.uuid4().hex[:8]}"
    with isolated_pipeline(settings, unique, tmp_path_factory.mktemp("void")) as p:
        s = Scenario(p, unique)
        items: list[tuple[EventData, str]] = []
        for name in CUSTOMERS:
            customer = s.customer(name)
            items.append(
                (
                    CustomerUpserted(
                        customer_id=customer,
                        name=f"Customer {name}",
                        email=f"ap-{name}@customer.example",
                        currency="USD",
                    ),
                    f"{customer}-upsert",
                )
            )
            for n, amount in enumerate((Decimal("40.125"), Decimal("12.5"))):
                items.append(
                    (
                        UsageRecorded(
                            customer_id=customer,
                            billing_period=PERIOD,
                            amount=amount,
                            currency="USD",
                            description=f"usage {n}",
                            event_time=datetime(2026, 10, 3 + n, tzinfo=UTC),
                        ),
                        f"{customer}-usage-{n}",
                    )
                )
        produce(p, items, source="/test/void")
        p.workers.start("invoicing", 1)
        p.workers.start("email", 1)
        run_close_period(PERIOD, p.settings, progress=False)
        wanted = {s.invoice_id(name) for name in CUSTOMERS}
        wait_for(
            "every invoice emailed",
            lambda: {m["X-Invoice-Id"] for m in list_messages(p.maildir)} >= wanted,
            p,
        )
        yield s


def invoice_records(s: Scenario, expected: int) -> list[tuple[Message, Envelope]]:
    records = drain(s.p.settings.kafka, s.p.invoices_topic, expected=expected, timeout_s=90)
    return [(r, decode(r.key(), r.value(), headers_of(r), allowed=ALLOWED)) for r in records]


# --------------------------------------------------------------------------- tests


def test_a_void_stores_the_reason_sends_one_event_and_one_email(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("cli")
    number = one(p, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", invoice_id)
    started = datetime.now(UTC)

    done = cli(s, "invoice", "void", number, "--reason", "billed to the wrong entity")

    assert done.exit_code == 0, done.output
    assert f"voided invoice {number}" in done.output
    with p.connect() as conn:
        status = conn.execute(
            "SELECT status FROM invoices WHERE invoice_id = %s", (invoice_id,)
        ).fetchone()
        void = conn.execute(
            "SELECT reason, voided_by, voided_at, outbox_id::text FROM invoice_voids "
            "WHERE invoice_id = %s",
            (invoice_id,),
        ).fetchone()
        outbox = conn.execute(
            "SELECT id::text, type, aggregatetype, aggregateid FROM outbox WHERE document_id = %s "
            "ORDER BY created_at",
            (invoice_id,),
        ).fetchall()
    assert status == ("voided",)
    assert void is not None
    reason, voided_by, voided_at, outbox_id = void
    assert reason == "billed to the wrong entity"
    assert voided_by == p.settings.postgres.admin.user  # session_user, not the owner
    assert voided_at >= started
    void_id = outbox_event_id("invoice.voided", invoice_id)
    assert outbox_id == void_id
    topic = INVOICES.with_prefix(p.settings.kafka.topic_prefix).name
    assert [tuple(row) for row in outbox] == [
        (outbox_event_id("invoice.issued", invoice_id), "invoice.issued", topic, s.customer("cli")),
        (void_id, "invoice.voided", topic, s.customer("cli")),
    ]

    # Debezium routes the row once: one invoice.voided record, keyed by the customer
    def voided_records() -> list[Envelope]:
        return [
            env
            for _, env in invoice_records(s, len(CUSTOMERS) + 1)
            if isinstance(env.data, InvoiceVoided)
        ]

    [event] = wait_for("the invoice.voided record", voided_records, p, timeout_s=90)
    assert event.id == void_id
    assert isinstance(event.data, InvoiceVoided)
    assert (event.data.invoice_id, event.data.invoice_number, event.data.revision) == (
        invoice_id,
        number,
        1,
    )
    assert (event.data.customer_id, event.data.billing_period) == (s.customer("cli"), PERIOD)
    assert event.data.reason == "billed to the wrong entity"
    assert abs((event.data.voided_at - voided_at).total_seconds()) < 1e-3

    # one email, saying so, to the address the invoice was issued to, with its PDF
    [message] = wait_for(
        "the void's email",
        lambda: sent_emails(p, "X-Voided-Invoice-Id", invoice_id),
        p,
        timeout_s=90,
    )
    assert str(message["To"]).endswith("<ap-cli@customer.example>")
    assert str(message["Subject"]) == f"Invoice {number} for {PERIOD} voided"
    assert message["X-Outbox-Event-Id"] == void_id
    body = message.get_body(("plain",))
    assert body is not None
    text = body.get_content()
    assert "has been voided" in text and "billed to the wrong entity" in text
    [pdf] = list(message.iter_attachments())
    assert pdf.get_filename() == f"{number}.pdf"
    row = one(
        p,
        "SELECT status FROM email_deliveries WHERE document_key = %s",
        f"invoice_void:{invoice_id}:r1",
    )
    assert row == "sent"

    # `invoicing explain` (the read-only operator) shows the void and both emails
    shown = CliRunner().invoke(app, ["explain", invoice_id, "--json"], env=p.env)
    assert shown.exit_code == 0, shown.output
    lineage = json.loads(shown.stdout)
    assert lineage["document"]["status"] == "voided"
    assert lineage["void"]["reason"] == "billed to the wrong entity"
    assert lineage["void"]["voided_by"] == p.settings.postgres.admin.user
    assert lineage["void"]["outbox_id"] == void_id
    assert sorted(e["message_id"] for e in lineage["emails"]) == sorted(
        [f"<invoice-{invoice_id}-r1@invoicing.local>", f"<void-{invoice_id}-r1@invoicing.local>"]
    )

    # voiding again is refused, clearly, and writes nothing
    again = cli(s, "invoice", "void", invoice_id, "--reason", "twice")
    assert again.exit_code == 2, again.output
    assert "is voided: only an issued invoice can be voided" in " ".join(again.output.split())
    assert one(p, "SELECT count(*) FROM outbox WHERE document_id = %s", invoice_id) == 2
    assert one(p, "SELECT count(*) FROM invoice_voids WHERE invoice_id = %s", invoice_id) == 1
    assert len(sent_emails(p, "X-Voided-Invoice-Id", invoice_id)) == 1
    assert len(sent_emails(p, "X-Invoice-Id", invoice_id)) == 1  # the invoice's own email


def test_unknown_superseded_and_invalid_reasons_are_refused(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    unknown = cli(s, "invoice", "void", str(uuid.uuid4()), "--reason", "x")
    assert unknown.exit_code == 2 and "no invoice has the id" in unknown.output, unknown.output
    no_number = cli(s, "invoice", "void", "INV-1999-01-000001", "--reason", "x")
    assert no_number.exit_code == 2 and "no invoice has" in no_number.output, no_number.output

    invoice_id = s.invoice_id("refused")
    for reason, says in (("   ", "needs a reason"), ("x" * 2001, "2000"), ("a\x07b", "invalid")):
        bad = cli(s, "invoice", "void", invoice_id, "--reason", reason)
        assert bad.exit_code == 2, bad.output
        assert says in bad.output, bad.output
    # the function keeps the rule itself, whatever the caller checked
    with p.connect("admin") as conn, pytest.raises(errors.InvalidParameterValue):
        conn.execute(
            "SELECT * FROM void_invoice(%s, %s, %s, 'topic', '/test')",
            (invoice_id, "bell\x07", str(uuid.uuid4())),
        )

    # a superseded revision (what a replay's correction leaves) cannot be voided
    # (as the owner, with the successor check of migration 0018 off for this one update:
    # a replay would have inserted the next revision in the same transaction)
    with p.connect() as conn:
        conn.execute("ALTER TABLE invoices DISABLE TRIGGER invoices_superseded_has_successor")
        conn.execute(
            "UPDATE invoices SET status = 'superseded' WHERE invoice_id = %s", (invoice_id,)
        )
        conn.execute("ALTER TABLE invoices ENABLE TRIGGER invoices_superseded_has_successor")
        conn.commit()
    superseded = cli(s, "invoice", "void", invoice_id, "--reason", "late")
    assert superseded.exit_code == 2, superseded.output
    assert "is superseded: only an issued invoice can be voided" in " ".join(
        superseded.output.split()
    )
    assert one(p, "SELECT count(*) FROM invoice_voids WHERE invoice_id = %s", invoice_id) == 0
    assert one(p, "SELECT count(*) FROM outbox WHERE document_id = %s", invoice_id) == 1
    assert one(p, "SELECT status FROM invoices WHERE invoice_id = %s", invoice_id) == "superseded"


@pytest.mark.parametrize("role", ["worker", "replay", "email", "close", "operator", "portal"])
def test_no_role_but_the_admin_may_void(scenario: Scenario, role: RoleName) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("roles")
    with p.connect(role) as conn:
        with pytest.raises(errors.InsufficientPrivilege, match="void_invoice"):
            conn.execute(
                "SELECT * FROM void_invoice(%s, 'not mine', %s, 'topic', '/test')",
                (invoice_id, str(uuid.uuid4())),
            )
        conn.rollback()
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO invoice_voids (invoice_id, reason, voided_by, voided_at, outbox_id) "
                "VALUES (%s, 'x', 'me', now(), %s)",
                (invoice_id, str(uuid.uuid4())),
            )
    assert one(p, "SELECT status FROM invoices WHERE invoice_id = %s", invoice_id) == "issued"


def test_two_voids_at_once_one_wins_the_other_is_refused(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("racing")
    topic = INVOICES.with_prefix(p.settings.kafka.topic_prefix).name
    barrier = threading.Barrier(2)
    results: list[object] = []

    def attempt(n: int) -> None:
        with psycopg.connect(p.settings.postgres.dsn("admin"), autocommit=True) as conn:
            barrier.wait(30)
            try:
                results.append(void_invoice(conn, invoice_id, f"attempt {n}", topic=topic))
            except InvoiceNotVoidable as exc:
                results.append(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2, results
    won = [r for r in results if isinstance(r, Voided)]
    lost = [r for r in results if isinstance(r, InvoiceNotVoidable)]
    assert len(won) == 1 and len(lost) == 1, results
    assert "is voided" in str(lost[0])
    assert one(p, "SELECT reason FROM invoice_voids WHERE invoice_id = %s", invoice_id) == (
        won[0].reason
    )
    assert (
        one(
            p,
            "SELECT count(*) FROM outbox WHERE document_id = %s AND type = 'invoice.voided'",
            invoice_id,
        )
        == 1
    )
    wait_for(
        "the void's one email",
        lambda: sent_emails(p, "X-Voided-Invoice-Id", invoice_id),
        p,
        timeout_s=90,
    )


def test_a_replay_after_a_void_reissues_nothing(scenario: Scenario) -> None:
    """docs/replay.md: periods whose revisions were all voided are skipped (``voided``)."""
    s, p = scenario, scenario.p
    customer, invoice_id = s.customer("replayed"), s.invoice_id("replayed")
    topic = INVOICES.with_prefix(p.settings.kafka.topic_prefix).name
    with psycopg.connect(p.settings.postgres.dsn("admin"), autocommit=True) as conn:
        void_invoice(conn, invoice_id, "customer left before the period", topic=topic)
    late = f"{customer}-late"
    produce(
        p,
        [
            (
                UsageRecorded(
                    customer_id=customer,
                    billing_period=PERIOD,
                    amount=Decimal("5"),
                    currency="USD",
                    description="late usage",
                    event_time=datetime(2026, 10, 30, tzinfo=UTC),
                ),
                late,
            )
        ],
        source="/test/void",
    )
    wait_for(
        "the late usage stored",
        lambda: one(p, "SELECT count(*) FROM usage_lines WHERE event_id = %s", late) == 1,
        p,
    )
    for mode in (Mode.DRY_RUN, Mode.APPLY):
        report = replay_period(PERIOD, p.settings, mode=mode, progress=False)
        [skipped] = [o for o in report.skipped if o.customer_id == customer]
        assert skipped.reason is not None and skipped.reason.startswith("voided"), skipped
        assert [o for o in report.differences if o.customer_id == customer] == []
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT revision, status FROM invoices WHERE customer_id = %s", (customer,)
        ).fetchall()
        notes = conn.execute(
            "SELECT count(*) FROM credit_notes WHERE customer_id = %s", (customer,)
        ).fetchone()
        types = conn.execute(
            "SELECT type FROM outbox WHERE aggregateid = %s ORDER BY created_at", (customer,)
        ).fetchall()
    assert [tuple(r) for r in rows] == [(1, "voided")]
    assert notes == (0,)
    assert [t for (t,) in types] == ["invoice.issued", "invoice.voided"]
    # `invoicing status` counts the voided revisions of the period
    shown = cli(s, "status", "--json")
    [period] = [r for r in json.loads(shown.stdout)["periods"] if r["period"] == PERIOD]
    with p.connect() as conn:
        voided = conn.execute("SELECT count(*) FROM invoices WHERE status = 'voided'").fetchone()
    assert voided is not None and period["voided"] == voided[0] >= 1
