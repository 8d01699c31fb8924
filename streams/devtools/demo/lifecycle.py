"""``invoicing demo --scenario lifecycle``: an invoice's life after the close, end to end on
the local stack (docs/invoices.md, "Partial credit notes" and "Void").

Two customers of this run (ids ``life-<run>-credit`` and ``life-<run>-void``, new each run,
so the demo can be run again on the same stack) send three pre-priced usage lines each in
the billing period :data:`PERIOD`. Then:

1. the period is closed; one invoicing worker issues both invoices and one email sender
   emails each (with its PDF);
2. a partial credit note credits half of the first invoice's line 1 (the admin role's
   ``credit_invoice_lines()``, as ``invoicing credit-note create`` does): the invoice stays
   issued, the note gets its ``CN-`` number and one email;
3. the second invoice is voided (``void_invoice()``, as ``invoicing invoice void`` does):
   it becomes ``voided`` for good and the customer gets one email saying so.

The demo checks what a billing team would check, from the database and the SMTP sink's
Maildir: each invoice issued once and emailed once, the credit note's total and its one
email, the void's one email, the statuses, and no other email for these documents. Exit 1
(:attr:`LifecycleReport.ok` false) when any of it is off.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from rich.console import Console

from streams.adapters.kafka import make_producer
from streams.apps.ops.credit import credit_invoice
from streams.apps.ops.void import void_invoice
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    EventData,
    UsageRecorded,
    invoice_id_for,
)
from streams.devtools.sandbox.processes import WorkerGroup
from streams.devtools.stack.maildir import list_messages
from streams.errors import InvoicingError
from streams.settings import RoleName, Settings
from streams.topics import ACCOUNT_EVENTS, INVOICES

if TYPE_CHECKING:
    from streams.apps.importers.close_period import ClosePeriodRun

#: The billing period of the demo's usage (no other demo bills it).
PERIOD = "2025-06"
#: The usage lines of each customer (USD).
AMOUNTS = (Decimal("120.50"), Decimal("42.125"), Decimal("7.30"))
SOURCE = "/demo/lifecycle"


class LifecycleDemoError(InvoicingError):
    """A step of the lifecycle demo did not happen in time (the message says which)."""


@dataclass(frozen=True)
class LifecycleClients:
    """What the demo runs through, wired by the composition root
    (:func:`streams.bootstrap.lifecycle_demo_clients`).

    Attributes:
        close_period: close-period with its clients.
        database: a new autocommit connection of a role (``operator`` to read,
            ``admin`` for the credit note and the void); closed by the demo.
    """

    close_period: ClosePeriodRun
    database: Callable[[Settings, RoleName], psycopg.Connection[Any]]


@dataclass
class LifecycleReport:
    """What the demo saw; ``ok`` is what the exit status says.

    ``documents`` rows: (what, number, status, emails of it in the sink).
    """

    run: str = ""
    documents: list[tuple[str, str, str, int]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def _events(run: str) -> list[tuple[EventData, str]]:
    items: list[tuple[EventData, str]] = []
    for role in ("credit", "void"):
        customer = f"life-{run}-{role}"
        items.append(
            (
                CustomerUpserted(
                    customer_id=customer,
                    name=f"Lifecycle {role.title()} Ltd",
                    email=f"ap-{role}@lifecycle.example",
                    currency="USD",
                ),
                f"{customer}-upsert",
            )
        )
        for n, amount in enumerate(AMOUNTS):
            items.append(
                (
                    UsageRecorded(
                        customer_id=customer,
                        billing_period=PERIOD,
                        amount=amount,
                        currency="USD",
                        description=f"Compute line {n + 1}",
                        event_time=datetime(2025, 6, 3 + n, tzinfo=UTC),
                    ),
                    f"{customer}-usage-{n}",
                )
            )
    return items


def _produce(settings: Settings, items: list[tuple[EventData, str]]) -> None:
    topic = ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name
    producer = make_producer(settings.kafka)
    for data, event_id in items:
        record = encode(Envelope.wrap(data, id=event_id, source=SOURCE))
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=list[tuple[str, str | bytes | None]](record.headers),
        )
    if producer.flush(30) != 0:
        raise LifecycleDemoError(f"the usage was not delivered to {topic} within 30 s")


def _wait(what: str, check: Callable[[], bool], group: WorkerGroup, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        dead = [w.name for w in group.processes if w.process.poll() is not None]
        if dead:
            raise LifecycleDemoError(f"{what}: worker(s) exited: {', '.join(dead)}")
        time.sleep(0.5)
    raise LifecycleDemoError(f"{what}: not within {timeout_s:.0f} s")


def run_lifecycle_demo(
    settings: Settings,
    *,
    clients: LifecycleClients,
    timeout_s: float = 300.0,
    console: Console | None = None,
    env: Mapping[str, str] | None = None,
    maildir: Path | None = None,
    stack_up: bool = True,
) -> LifecycleReport:
    """The demo of the module docstring. Returns the report; the CLI prints it.

    Args:
        timeout_s: how long each step may take (seconds).
        env: ``INVOICING_…`` overrides for the worker processes (a test's sandbox).
        maildir: the SMTP sink's Maildir (default: the stack's).
        stack_up: bring the local stack up first (the CLI); a test's stack is up.

    Raises:
        LifecycleDemoError: a step did not happen within ``timeout_s`` or a worker exited.
        psycopg.Error, KafkaException: a service failed.
    """
    from streams.devtools.stack.manager import Stack

    console = console or Console(stderr=True)
    report = LifecycleReport(run=uuid.uuid4().hex[:8])
    t0 = time.monotonic()
    stack = Stack(settings, report=lambda m: console.print(f"[cyan]stack[/]: {m}"))
    if stack_up:
        stack.up()
    mails = maildir or stack.layout.maildir
    topic = INVOICES.with_prefix(settings.kafka.topic_prefix).name
    credited = invoice_id_for(f"life-{report.run}-credit", PERIOD, 1)
    voided = invoice_id_for(f"life-{report.run}-void", PERIOD, 1)

    def emails(header: str, value: str) -> int:
        return sum(1 for m in list_messages(mails) if m[header] == value)

    def status(invoice_id: str) -> str | None:
        with clients.database(settings, "operator") as conn:
            row = conn.execute(
                "SELECT status FROM invoices WHERE invoice_id = %s", (invoice_id,)
            ).fetchone()
        return None if row is None else str(row[0])

    log_dir = stack.layout.logs / "demo-lifecycle"
    with WorkerGroup(log_dir, env or {}) as group:
        group.start("invoicing", 1)
        group.start("email", 1)
        console.print(f"run {report.run}: 1 invoicing worker, 1 email sender (logs: {log_dir})")
        _produce(settings, _events(report.run))
        clients.close_period(PERIOD, settings, progress=False)
        console.print(f"1. closed {PERIOD}: two invoices to issue and email")
        _wait(
            "both invoices issued and emailed",
            lambda: emails("X-Invoice-Id", credited) >= 1 and emails("X-Invoice-Id", voided) >= 1,
            group,
            timeout_s,
        )
        report.timings["close → both emails"] = time.monotonic() - t0

        with clients.database(settings, "admin") as conn:
            line = conn.execute(
                "SELECT amount FROM invoice_lines WHERE invoice_id = %s AND line_no = 1",
                (credited,),
            ).fetchone()
            if line is None:
                raise LifecycleDemoError(f"invoice {credited} has no line 1")
            half = (Decimal(line[0]) / 2).quantize(Decimal("0.01"))
            note = credit_invoice(
                conn, credited, [(1, half)], "half of line 1: service credit", topic=topic
            )
        console.print(
            f"2. credit note {note.credit_note_number}: {half} USD of line 1 "
            f"({note.total} USD with tax) on invoice {credited}"
        )
        _wait(
            "the credit note's email",
            lambda: emails("X-Credit-Note-Id", note.credit_note_id) >= 1,
            group,
            timeout_s,
        )
        with clients.database(settings, "admin") as conn:
            void = void_invoice(conn, voided, "issued to the wrong legal entity", topic=topic)
        console.print(f"3. voided {void.invoice_number} by {void.voided_by}: {void.reason}")
        _wait(
            "the void's email",
            lambda: emails("X-Voided-Invoice-Id", voided) >= 1,
            group,
            timeout_s,
        )
        time.sleep(2.0)  # a second email of any of them would have arrived by now
    report.timings["total"] = time.monotonic() - t0

    with clients.database(settings, "operator") as conn:
        numbers = dict(
            conn.execute(
                "SELECT invoice_id::text, invoice_number FROM invoices WHERE invoice_id = ANY(%s)",
                ([credited, voided],),
            ).fetchall()
        )
    checks = [
        (
            "invoice (then credited in part)",
            numbers.get(credited, "?"),
            status(credited),
            emails("X-Invoice-Id", credited),
            "issued",
        ),
        (
            "partial credit note",
            note.credit_note_number,
            "issued",
            emails("X-Credit-Note-Id", note.credit_note_id),
            "issued",
        ),
        (
            "invoice (then voided)",
            numbers.get(voided, "?"),
            status(voided),
            emails("X-Invoice-Id", voided),
            "voided",
        ),
        (
            "void notice",
            numbers.get(voided, "?"),
            "sent",
            emails("X-Voided-Invoice-Id", voided),
            "sent",
        ),
    ]
    for what, number, state, count, want in checks:
        report.documents.append((what, number, state or "missing", count))
        if state != want:
            report.problems.append(f"{what} {number}: status {state}, expected {want}")
        if count != 1:
            report.problems.append(f"{what} {number}: {count} emails, expected exactly 1")
    if note.total <= 0:
        report.problems.append(f"credit note {note.credit_note_number}: total {note.total}")
    return report
