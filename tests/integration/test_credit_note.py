"""``invoicing credit-note create``, end to end on the real stack (docs/invoices.md
"Partial credit notes").

One sandbox for the module (database, topics, groups, connector, SMTP sink, tax service):
usage of several customers produced to Kafka, invoiced by an invoicing worker process and
emailed by an email sender process. Each test then works on a customer of its own:

- a partial credit through the CLI (the admin role, ``credit_invoice_lines()`` of
  migration 0021): the ``credit_notes`` row (``partial``), its ``credit_note_lines``, the
  tax pro rata as :func:`streams.core.domain.credit.credit_line` computes it, one
  ``credit_note.issued`` outbox row with the lines routed by Debezium, exactly one email
  saying what it credits; the invoice stays ``issued``;
- bounds: more than what is still creditable on a line, and on the invoice, refused with
  a clear message and nothing written; bad lines, amounts, invoices refused;
- two credits at once that together exceed a line: one wins, the other is refused;
- only the admin role may call the function;
- a replay after a partial credit credits only the remainder;
- the ``CN-<period>`` numbers stay gapless through every refusal.

Oracles: the rows (owner's view), the records Debezium published, the SMTP sink's Maildir,
the Python statement of the rule.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Message
from psycopg import errors

from streams.apps.ops.credit import (
    CreditExceedsOpen,
    CreditNoteIssuedResult,
    InvoiceNotCreditable,
    credit_invoice,
)
from streams.apps.replay import Mode
from streams.bootstrap import replay_period, run_close_period
from streams.core.billing.issuance import outbox_event_id
from streams.core.domain.codec import decode
from streams.core.domain.credit import credit_line
from streams.core.domain.events import (
    CreditNoteIssued,
    CustomerUpserted,
    Envelope,
    EventData,
    InvoiceIssued,
    InvoiceVoided,
    UsageRecorded,
    invoice_id_for,
)
from streams.devtools.stack.maildir import list_messages
from streams.settings import RoleName, Settings
from streams.topics import INVOICES
from tests.support.documents_flow import cli, one, produce, sent_emails, wait_for
from tests.support.kafka import drain, headers_of
from tests.support.pipeline import Pipeline, isolated_pipeline

# one sandbox for the module: its tests stay on one xdist worker
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("credit_note"),
]

PERIOD = "2026-11"
AMOUNTS: dict[str, tuple[Decimal, ...]] = {
    "cli": (Decimal("40.125"), Decimal("12.5")),
    "bounds": (Decimal("40.125"), Decimal("12.5")),
    "tiny": (Decimal("0.015"), Decimal("0.015")),
    "roles": (Decimal("40.125"), Decimal("12.5")),
    "racing": (Decimal("40.125"), Decimal("12.5")),
    "replayed": (Decimal("40.125"), Decimal("12.5")),
    "gapless": (Decimal("40.125"), Decimal("12.5")),
}
ALLOWED = (InvoiceIssued, InvoiceVoided, CreditNoteIssued)


@dataclass
class Scenario:
    p: Pipeline
    unique: str

    def customer(self, name: str) -> str:
        return f"{self.unique}-{name}"

    def invoice_id(self, name: str) -> str:
        return invoice_id_for(self.customer(name), PERIOD, 1)

    @property
    def topic(self) -> str:
        return INVOICES.with_prefix(self.p.settings.kafka.topic_prefix).name


@pytest.fixture(scope="module")
def scenario(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    unique = f"cn{uuid.uuid4().hex[:8]}"
    with isolated_pipeline(settings, unique, tmp_path_factory.mktemp("credit")) as p:
        s = Scenario(p, unique)
        items: list[tuple[EventData, str]] = []
        for name, amounts in AMOUNTS.items():
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
            for n, amount in enumerate(amounts):
                items.append(
                    (
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
                )
        produce(p, items, source="/test/credit")
        p.workers.start("invoicing", 1)
        p.workers.start("email", 1)
        run_close_period(PERIOD, p.settings, progress=False)
        wanted = {s.invoice_id(name) for name in AMOUNTS}
        wait_for(
            "every invoice emailed",
            lambda: {m["X-Invoice-Id"] for m in list_messages(p.maildir)} >= wanted,
            p,
        )
        yield s


def invoice_records(s: Scenario, expected: int) -> list[tuple[Message, Envelope]]:
    records = drain(s.p.settings.kafka, s.p.invoices_topic, expected=expected, timeout_s=90)
    return [(r, decode(r.key(), r.value(), headers_of(r), allowed=ALLOWED)) for r in records]


def line(p: Pipeline, invoice_id: str, line_no: int) -> tuple[Decimal, Decimal]:
    """The charged amount and tax of an invoice line."""
    with p.connect() as conn:
        row = conn.execute(
            "SELECT amount, tax FROM invoice_lines WHERE invoice_id = %s AND line_no = %s",
            (invoice_id, line_no),
        ).fetchone()
    assert row is not None
    return Decimal(row[0]), Decimal(row[1])


def counts(p: Pipeline, invoice_id: str) -> tuple[int, int, int]:
    """credit notes, credit note lines, outbox rows of the invoice's credit notes."""
    with p.connect() as conn:
        row = conn.execute(
            """
            SELECT (SELECT count(*) FROM credit_notes WHERE invoice_id = %(i)s),
                   (SELECT count(*) FROM credit_note_lines WHERE invoice_id = %(i)s),
                   (SELECT count(*) FROM outbox o JOIN credit_notes c
                       ON c.credit_note_id = o.document_id WHERE c.invoice_id = %(i)s)
            """,
            {"i": invoice_id},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def refused(s: Scenario, *args: str) -> str:
    done = cli(s, "credit-note", "create", *args)
    assert done.exit_code == 2, done.output
    return " ".join(done.output.split())


# --------------------------------------------------------------------------- tests


def test_a_partial_credit_writes_the_note_its_lines_one_event_and_one_email(
    scenario: Scenario,
) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("cli")
    number = one(p, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", invoice_id)
    charged, charged_tax = line(p, invoice_id, 1)
    expected = credit_line(
        charged_amount=charged,
        charged_tax=charged_tax,
        credited_amount=Decimal(0),
        credited_tax=Decimal(0),
        amount=Decimal("10.00"),
        exponent=2,
    )

    done = cli(
        s,
        "credit-note",
        "create",
        number,
        "--line",
        "1",
        "--amount",
        "10.00",
        "--reason",
        "one seat unused",
    )

    assert done.exit_code == 0, done.output
    assert "credit note CN-" in done.output
    with p.connect() as conn:
        note = conn.execute(
            "SELECT credit_note_id::text, credit_note_number, kind, subtotal, tax_total, total, "
            "reason FROM credit_notes WHERE invoice_id = %s",
            (invoice_id,),
        ).fetchall()
        [(note_id, cn_number, kind, subtotal, tax_total, total, reason)] = note
        lines = conn.execute(
            "SELECT line_no, amount, tax FROM credit_note_lines WHERE credit_note_id = %s",
            (note_id,),
        ).fetchall()
        status = conn.execute(
            "SELECT status FROM invoices WHERE invoice_id = %s", (invoice_id,)
        ).fetchone()
        outbox = conn.execute(
            "SELECT id::text, type FROM outbox WHERE document_id = %s", (note_id,)
        ).fetchall()
    assert kind == "partial" and reason == "one seat unused"
    assert str(cn_number).startswith(f"CN-{PERIOD}-")
    assert [tuple(r) for r in lines] == [(1, Decimal("10.00"), expected.tax)]
    assert (subtotal, tax_total, total) == (
        Decimal("10.00"),
        expected.tax,
        Decimal("10.00") + expected.tax,
    )
    assert status == ("issued",)  # a partial note leaves the invoice standing
    event_id = outbox_event_id("credit_note.issued", note_id)
    assert [tuple(r) for r in outbox] == [(event_id, "credit_note.issued")]

    def credit_records() -> list[Envelope]:
        return [
            env
            for _, env in invoice_records(s, len(AMOUNTS) + 1)
            if isinstance(env.data, CreditNoteIssued)
        ]

    [event] = wait_for("the credit_note.issued record", credit_records, p, timeout_s=90)
    assert event.id == event_id
    assert isinstance(event.data, CreditNoteIssued)
    assert event.data.credit_note_number == cn_number
    assert event.data.invoice_id == invoice_id
    assert event.data.total == Decimal("10.00") + expected.tax
    assert event.data.lines is not None
    assert [(ln.line_no, ln.amount, ln.tax) for ln in event.data.lines] == [
        (1, Decimal("10.00"), expected.tax)
    ]

    [message] = wait_for(
        "the credit note's email",
        lambda: sent_emails(p, "X-Credit-Note-Id", note_id),
        p,
        timeout_s=90,
    )
    assert str(message["To"]).endswith("<ap-cli@customer.example>")
    body = message.get_body(("plain",))
    assert body is not None
    text = body.get_content()
    assert f"credits part of invoice {number}" in " ".join(text.split()), text
    assert "cancels" not in text
    assert "line 1" in text
    assert len(sent_emails(p, "X-Credit-Note-Id", note_id)) == 1


def test_more_than_creditable_per_line_and_per_invoice_is_refused(
    scenario: Scenario, tmp_path: Path
) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("bounds")
    # line 2 charged 12.5: 12.51 is more than it
    says = refused(s, invoice_id, "--line", "2", "--amount", "12.51", "--reason", "x")
    assert "12.51 is more than the 12.50 still creditable" in says, says
    assert counts(p, invoice_id) == (0, 0, 0)
    # line 1 charged 40.125 (creditable 40.12, half-even): all of it, then one cent more
    ok = cli(
        s,
        "credit-note",
        "create",
        invoice_id,
        "--line",
        "1",
        "--amount",
        "40.12",
        "--reason",
        "all of line 1",
    )
    assert ok.exit_code == 0, ok.output
    charged, charged_tax = line(p, invoice_id, 1)
    taxes = one(p, "SELECT tax FROM credit_note_lines WHERE invoice_id = %s", invoice_id)
    assert (
        taxes
        == credit_line(
            charged_amount=charged,
            charged_tax=charged_tax,
            credited_amount=Decimal(0),
            credited_tax=Decimal(0),
            amount=Decimal("40.12"),
            exponent=2,
        ).tax
    )
    says = refused(s, invoice_id, "--line", "1", "--amount", "0.01", "--reason", "x")
    assert "0.01 is more than the 0.00 still creditable" in says, says
    # several lines from a file: refused whole when one of them is over
    csv = tmp_path / "lines.csv"
    csv.write_text("line,amount\n2,5.00\n1,1.00\n", encoding="utf-8")
    says = refused(s, invoice_id, "--lines", str(csv), "--reason", "x")
    assert "line 1" in says and "still creditable" in says, says
    assert counts(p, invoice_id) == (1, 1, 1)
    csv.write_text("2,5.00\n", encoding="utf-8")
    ok = cli(s, "credit-note", "create", invoice_id, "--lines", str(csv), "--reason", "five")
    assert ok.exit_code == 0, ok.output
    assert counts(p, invoice_id) == (2, 2, 2)

    # per invoice: two lines of 0.015 each round to 0.02, the invoice's subtotal to 0.03
    tiny = s.invoice_id("tiny")
    assert one(p, "SELECT subtotal FROM invoices WHERE invoice_id = %s", tiny) == Decimal("0.03")
    ok = cli(
        s, "credit-note", "create", tiny, "--line", "1", "--amount", "0.02", "--reason", "tiny"
    )
    assert ok.exit_code == 0, ok.output
    says = refused(s, tiny, "--line", "2", "--amount", "0.02", "--reason", "x")
    assert "0.02 is more than the 0.01 still creditable on it (subtotal 0.03" in says, says
    assert counts(p, tiny) == (1, 1, 1)

    # malformed requests
    for args, text in (
        (("--line", "9", "--amount", "1"), "has no line 9"),
        (("--line", "1", "--amount", "0"), "must be positive"),
        (("--line", "2", "--amount", "1.001"), "more than 2 decimals"),
        (("--line", "2", "--amount", "abc"), "is not a decimal amount"),
        (("--line", "2"), "give --line and --amount"),
    ):
        says = refused(s, invoice_id, *args, "--reason", "x")
        assert text in says, (args, says)
    says = refused(s, invoice_id, "--line", "2", "--amount", "1", "--reason", "  ")
    assert "needs a reason" in says, says
    says = refused(s, str(uuid.uuid4()), "--line", "1", "--amount", "1", "--reason", "x")
    assert "no invoice has the id" in says, says
    assert counts(p, invoice_id) == (2, 2, 2)


@pytest.mark.parametrize("role", ["worker", "replay", "email", "close", "operator", "portal"])
def test_no_role_but_the_admin_may_credit(scenario: Scenario, role: RoleName) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("roles")
    with p.connect(role) as conn:
        with pytest.raises(errors.InsufficientPrivilege, match="credit_invoice_lines"):
            conn.execute(
                'SELECT * FROM credit_invoice_lines(%s, %s, \'[{"line_no": 1, '
                "\"amount\": \"1\"}]'::jsonb, 'not mine', 2, %s, 'topic', '/test')",
                (invoice_id, str(uuid.uuid4()), str(uuid.uuid4())),
            )
        conn.rollback()
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO credit_note_lines (credit_note_id, invoice_id, line_no, amount, tax) "
                "VALUES (%s, %s, 1, 1, 0)",
                (str(uuid.uuid4()), invoice_id),
            )
    assert counts(p, invoice_id) == (0, 0, 0)


def test_two_credits_at_once_that_exceed_a_line_one_wins(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("racing")
    barrier = threading.Barrier(2)
    results: list[object] = []

    def attempt(n: int) -> None:
        with psycopg.connect(p.settings.postgres.dsn("admin"), autocommit=True) as conn:
            barrier.wait(30)
            try:
                results.append(
                    credit_invoice(
                        conn, invoice_id, [(1, Decimal("30.00"))], f"attempt {n}", topic=s.topic
                    )
                )
            except CreditExceedsOpen as exc:
                results.append(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(results) == 2, results
    won = [r for r in results if isinstance(r, CreditNoteIssuedResult)]
    lost = [r for r in results if isinstance(r, CreditExceedsOpen)]
    assert len(won) == 1 and len(lost) == 1, results
    assert "30.00 is more than the 10.12 still creditable" in str(lost[0])
    assert counts(p, invoice_id) == (1, 1, 1)
    assert one(
        p, "SELECT sum(amount) FROM credit_note_lines WHERE invoice_id = %s", invoice_id
    ) == (Decimal("30.00"))
    wait_for(
        "the credit note's one email",
        lambda: sent_emails(p, "X-Credit-Note-Id", won[0].credit_note_id),
        p,
        timeout_s=90,
    )


def test_a_replay_after_a_partial_credit_credits_only_the_remainder(scenario: Scenario) -> None:
    s, p = scenario, scenario.p
    customer, invoice_id = s.customer("replayed"), s.invoice_id("replayed")
    with psycopg.connect(p.settings.postgres.dsn("admin"), autocommit=True) as conn:
        partial = credit_invoice(
            conn,
            invoice_id,
            [(1, Decimal("10.00")), (2, Decimal("2.50"))],
            "goodwill",
            topic=s.topic,
        )
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
                    event_time=datetime(2026, 11, 30, tzinfo=UTC),
                ),
                late,
            )
        ],
        source="/test/credit",
    )
    wait_for(
        "the late usage stored",
        lambda: one(p, "SELECT count(*) FROM usage_lines WHERE event_id = %s", late) == 1,
        p,
    )
    replay_period(PERIOD, p.settings, mode=Mode.APPLY, progress=False)
    with p.connect() as conn:
        head = conn.execute(
            "SELECT subtotal, tax_total, total, status FROM invoices WHERE invoice_id = %s",
            (invoice_id,),
        ).fetchone()
        full = conn.execute(
            "SELECT subtotal, tax_total, total FROM credit_notes "
            "WHERE invoice_id = %s AND kind = 'full'",
            (invoice_id,),
        ).fetchall()
        event = conn.execute(
            "SELECT o.payload FROM outbox o JOIN credit_notes c ON c.credit_note_id = o.document_id "
            "WHERE c.invoice_id = %s AND c.kind = 'full'",
            (invoice_id,),
        ).fetchone()
    assert head is not None
    subtotal, tax_total, total, status = head
    assert status == "superseded"
    assert [tuple(r) for r in full] == [
        (
            subtotal - partial.subtotal,
            tax_total - partial.tax_total,
            total - partial.total,
        )
    ]
    assert event is not None
    payload = event[0]
    assert Decimal(payload["total"]) == total - partial.total
    assert "lines" not in payload
    # the superseded revision takes no further partial credit
    with (
        psycopg.connect(p.settings.postgres.dsn("admin"), autocommit=True) as conn,
        pytest.raises(InvoiceNotCreditable, match="is superseded"),
    ):
        credit_invoice(conn, invoice_id, [(1, Decimal("1.00"))], "late", topic=s.topic)


def test_credit_note_numbers_stay_gapless(scenario: Scenario) -> None:
    """Refusals roll their number back: the period's series is 1..n.

    The test makes its own notes (refused, issued, refused, issued) so that it holds whatever
    other tests of the module ran before it, and on whichever worker.
    """
    s, p = scenario, scenario.p
    invoice_id = s.invoice_id("gapless")
    for amount, accepted in (("12.51", False), ("2.00", True), ("10.51", False), ("3.00", True)):
        args = (invoice_id, "--line", "2", "--amount", amount, "--reason", "gapless")
        if accepted:
            ok = cli(s, "credit-note", "create", *args)
            assert ok.exit_code == 0, ok.output
        else:
            assert "still creditable" in refused(s, *args)
    assert counts(p, invoice_id) == (2, 2, 2)
    with p.connect() as conn:
        numbers = [
            r[0]
            for r in conn.execute(
                "SELECT credit_note_number FROM credit_notes WHERE billing_period = %s "
                "ORDER BY credit_note_number",
                (PERIOD,),
            ).fetchall()
        ]
        mine = [
            r[0]
            for r in conn.execute(
                "SELECT credit_note_number FROM credit_notes WHERE invoice_id = %s "
                "ORDER BY credit_note_number",
                (invoice_id,),
            ).fetchall()
        ]
        last = conn.execute(
            "SELECT last_value FROM document_counters WHERE series = %s", (f"CN-{PERIOD}",)
        ).fetchone()
    assert len(mine) == 2 and set(mine) <= set(numbers)
    assert numbers == [f"CN-{PERIOD}-{n:06d}" for n in range(1, len(numbers) + 1)]
    assert last == (len(numbers),)
