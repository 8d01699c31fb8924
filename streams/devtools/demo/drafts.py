"""``invoicing demo --scenario drafts``: a draft's life end to end on the local stack
(docs/invoices.md "Drafts and finalisation").

1. brings the local stack up; starts 2 invoicing workers and 1 email sender;
2. produces two customers of a new run id with a grace period — ``command`` (1000 h)
   and ``timer`` (0.002 h, 7.2 s) — and two usage lines each, then closes the period;
3. waits for both drafts and checks that neither has a number, an invoice row or an
   email;
4. produces late usage for ``command`` and waits for its draft to be re-rated;
5. finalises ``command`` with ``invoicing invoice finalize``'s logic and waits for the
   timer to finalise ``timer``;
6. waits for both emails and compares each invoice's subtotal with the sum of the amounts
   this demo produced, rounded once half-even to cents (computed here, not by the
   invoicing code), and counts the emails (exactly one each).

What an issued invoice goes through next (a partial credit note, a void) is the
lifecycle demo's (:mod:`streams.devtools.demo.lifecycle`).

Exit status 1 on any mismatch, a draft that was numbered or emailed early, or a missing
or duplicate email. Each run uses new customer ids, so it can run on a stack that holds
earlier runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

import psycopg
from confluent_kafka import Producer
from rich.console import Console

from streams.apps.ops.finalize import finalize_draft
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    EventData,
    UsageRecorded,
    invoice_id_for,
)
from streams.devtools.sandbox.processes import WorkerGroup
from streams.settings import RoleName, Settings
from streams.topics import ACCOUNT_EVENTS

__all__ = ["DraftsDemoClients", "DraftsReport", "run_drafts_demo"]

PERIOD = "2024-12"
#: customer → (grace hours, the amounts at the close, the late amount or None)
CUSTOMERS: dict[str, tuple[Decimal, tuple[Decimal, ...], Decimal | None]] = {
    "command": (Decimal(1000), (Decimal("40.125"), Decimal("12.5")), Decimal("7.25")),
    "timer": (Decimal("0.002"), (Decimal("19.995"), Decimal("0.01")), None),
}


@dataclass(frozen=True)
class DraftsDemoClients:
    """What the demo runs through, wired by :func:`streams.bootstrap.drafts_demo_clients`.

    Attributes:
        close_period: close-period with its clients.
        database: a new autocommit connection of a role given by name (the demo reads as
            ``operator`` and finalises as ``admin``).
        producer: a new murmur2 producer.
    """

    close_period: Callable[..., Any]
    database: Callable[[Settings, RoleName], psycopg.Connection[Any]]
    producer: Callable[[Settings], Producer]


@dataclass
class DraftsReport:
    """One row per customer (name → what was seen) and the problems found; ``ok`` when none."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems


def _produce(producer: Producer, topic: str, items: list[tuple[EventData, str]]) -> None:
    for data, event_id in items:
        record = encode(Envelope.wrap(data, id=event_id, source="/demo/drafts"))
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=[(name, value) for name, value in record.headers],
        )
    if producer.flush(30):
        raise RuntimeError("the demo's events were not delivered")


def _usage(customer: str, n: int, amount: Decimal) -> tuple[EventData, str]:
    return (
        UsageRecorded(
            customer_id=customer,
            billing_period=PERIOD,
            amount=amount,
            currency="USD",
            description=f"usage {n}",
            event_time=datetime(2024, 12, 2 + n, tzinfo=UTC),
        ),
        f"{customer}-usage-{n}",
    )


def _one(conn: psycopg.Connection[Any], sql: str, *params: object) -> Any:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def _wait(what: str, check: Callable[[], Any], timeout_s: float, report: DraftsReport) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    report.problems.append(f"timed out waiting for {what}")
    return None


def run_drafts_demo(
    settings: Settings,
    *,
    clients: DraftsDemoClients,
    timeout_s: float = 180.0,
    console: Console | None = None,
) -> DraftsReport:
    """The drafts scenario (module docstring). Returns the report; the CLI prints it."""
    from streams.devtools.stack.maildir import list_messages
    from streams.devtools.stack.manager import Stack

    console = console or Console(stderr=True)
    started = time.monotonic()
    stack = Stack(settings, report=lambda m: console.print(f"[cyan]stack[/]: {m}"))
    stack.up()
    topic = ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name
    run = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    ids = {name: f"drafts-{run}-{name}" for name in CUSTOMERS}
    invoice = {name: invoice_id_for(ids[name], PERIOD, 1) for name in CUSTOMERS}
    report = DraftsReport({name: {"customer": ids[name]} for name in CUSTOMERS})
    log_dir = stack.layout.logs / "demo-drafts"
    producer = clients.producer(settings)
    with (
        WorkerGroup(log_dir) as group,
        clients.database(settings, "operator") as conn,
    ):
        group.start("invoicing", 2)
        group.start("email", 1)
        items: list[tuple[EventData, str]] = []
        for name, (grace, amounts, _late) in CUSTOMERS.items():
            items.append(
                (
                    CustomerUpserted(
                        customer_id=ids[name],
                        name=f"Drafts demo {name}",
                        email=f"ap-{name}@customer.example",
                        currency="USD",
                        invoice_grace_hours=grace,
                    ),
                    f"{ids[name]}-upsert",
                )
            )
            items += [_usage(ids[name], n, a) for n, a in enumerate(amounts)]
            report.rows[name]["grace (h)"] = grace
        _produce(producer, topic, items)
        clients.close_period(PERIOD, settings, progress=False)
        console.print(f"closed {PERIOD} for {', '.join(ids.values())}")

        def draft(name: str) -> tuple[Any, ...] | None:
            row = conn.execute(
                "SELECT status, subtotal, rerated, invoice_number FROM invoice_drafts "
                "WHERE invoice_id = %s",
                (invoice[name],),
            ).fetchone()
            return None if row is None else tuple(row)

        def issued(name: str) -> int:
            return int(
                _one(conn, "SELECT count(*) FROM invoices WHERE invoice_id = %s", invoice[name])
            )

        first = _wait("the command customer's draft", lambda: draft("command"), timeout_s, report)
        if first is not None:
            report.rows["command"]["draft subtotal"] = first[1]
            if first[3] is not None or issued("command"):
                report.problems.append("the draft was numbered at the close")
            console.print(f"draft {invoice['command']}: no number, subtotal {first[1]}")
            late = CUSTOMERS["command"][2]
            assert late is not None
            _produce(producer, topic, [_usage(ids["command"], 9, late)])
            rerated = _wait(
                "the draft re-rated with the late usage",
                lambda: (d := draft("command")) is not None and d[2] >= 1 and d,
                timeout_s,
                report,
            )
            if rerated:
                report.rows["command"]["re-rated subtotal"] = rerated[1]
                console.print(f"late usage re-rated the draft: subtotal {rerated[1]}")
            with clients.database(settings, "admin") as admin:
                done = finalize_draft(admin, producer, topic, invoice["command"], wait_s=timeout_s)
            report.rows["command"]["finalised by"] = "invoice finalize"
            console.print(f"finalized by command as {done.invoice_number}")
        timed = _wait(
            "the grace timer's finalisation",
            lambda: (d := draft("timer")) is not None and d[0] == "finalized" and d,
            timeout_s,
            report,
        )
        if timed:
            report.rows["timer"]["finalised by"] = "grace timer"
            console.print(f"finalized by the grace timer as {timed[3]}")
        for name, (_grace, amounts, late_amount) in CUSTOMERS.items():
            exact = sum(amounts, Decimal(0)) + (late_amount or Decimal(0))
            expected = exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
            row = report.rows[name]
            row["expected subtotal"] = expected
            row["number"] = _one(
                conn, "SELECT invoice_number FROM invoices WHERE invoice_id = %s", invoice[name]
            )
            row["invoiced subtotal"] = _one(
                conn, "SELECT subtotal FROM invoices WHERE invoice_id = %s", invoice[name]
            )
            if row["invoiced subtotal"] != expected:
                report.problems.append(f"{name}: subtotal {row['invoiced subtotal']} ≠ {expected}")
            _wait(
                f"the email of {name}",
                lambda n=name: _one(  # type: ignore[misc]
                    conn,
                    "SELECT count(*) FROM email_deliveries WHERE document_id = %s "
                    "AND status = 'sent'",
                    invoice[n],
                ),
                timeout_s,
                report,
            )
        for name in CUSTOMERS:
            emails = [
                m for m in list_messages(stack.layout.maildir) if m["X-Invoice-Id"] == invoice[name]
            ]
            report.rows[name]["emails"] = len(emails)
            if len(emails) != 1:
                report.problems.append(f"{name}: {len(emails)} emails, expected 1")
    report.seconds = time.monotonic() - started
    return report
