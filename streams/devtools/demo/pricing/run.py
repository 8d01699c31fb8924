"""``invoicing demo --scenario pricing``: the API platform's month, end to end.

1. brings the local stack up (idempotent);
2. generates the scenario's events (:mod:`streams.devtools.demo.pricing.generator`: N
   customers, seeded) into a CloudEvents JSON-lines file, and computes the
   **independent answer** from that file and the price book's YAML
   (:mod:`streams.devtools.demo.pricing.expected`, no rating code);
3. publishes ``examples/pricing/price-book.yaml`` with ``invoicing plans publish``
   (the operator's command, run as a process; publishing the same book again
   changes nothing);
4. starts the invoicing workers (default 3, separate processes) and one email sender;
5. produces the events with ``invoicing import events``'s importer (binary
   CloudEvents, murmur2, in file order: resent duplicates included);
6. closes the period (``close-period``);
7. waits, with a progress bar, until every customer's invoice is issued (or held)
   and its email settled;
8. reconciles every invoice against the answer: the subtotal, and every line
   (rated charge lines: plan, version, charge, group, quantity, amount;
   pass-through lines: event id and billed amount). Exit status 1 on any mismatch,
   missing or held invoice, email not sent, or duplicate email.

Running it again changes nothing: the same seed gives the same event ids, the
workers deduplicate them, the close markers have the same ids, the invoices
exist. Customer ids carry the seed and the period, so another seed or period on
the same stack is a separate set of customers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import class_row
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from streams.devtools.demo.pricing.expected import (
    ExpectedInvoice,
    ExpectedLine,
    expected_invoices,
    read_events,
)
from streams.devtools.demo.pricing.generator import (
    GeneratedCustomer,
    Scenario,
    ScenarioConfig,
    generate,
)
from streams.devtools.sandbox.processes import WorkerGroup
from streams.errors import InvoicingError
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.apps.importers.close_period import ClosePeriodRun
    from streams.apps.importers.events_import import ImportEventsRun

#: The scenario's price book, relative to the project root.
DEFAULT_BOOK = Path("examples/pricing/price-book.yaml")

__all__ = [
    "DEFAULT_BOOK",
    "CustomerResult",
    "PricingDemoClients",
    "PricingDemoError",
    "PricingReport",
    "publish_with_cli",
    "run_pricing_demo",
]


class PricingDemoError(InvoicingError, RuntimeError):
    """A step of the pricing demo failed (publishing the book, producing the events);
    the message says which and why."""


def publish_with_cli(book: Path, env: Mapping[str, str]) -> str:
    """``invoicing plans publish BOOK --json`` as a process with ``env`` over this
    process's environment; returns what it did in a few words (``3 new, 4 unchanged``,
    from its JSON summary; its first line of output when that cannot be read).

    Raises:
        PricingDemoError: the command failed (its exit code and output in the message).
    """
    result = subprocess.run(
        [sys.executable, "-m", "streams.entrypoints", "plans", "publish", str(book), "--json"],
        env={**os.environ, **env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise PricingDemoError(
            f"invoicing plans publish {book} exited {result.returncode}: {output}"
        )
    try:
        summary = json.loads(result.stdout)
        return f"{len(summary['new'])} new, {len(summary['unchanged'])} unchanged"
    except (ValueError, KeyError, TypeError):
        lines = (result.stderr or result.stdout).strip().splitlines()
        return lines[0] if lines else "published"


@dataclass(frozen=True)
class PricingDemoClients:
    """What the pricing demo runs through, wired by the composition root
    (:func:`streams.bootstrap.pricing_demo_clients`).

    Attributes:
        import_events: the events import with its producer.
        close_period: close-period with its clients.
        database: a new autocommit connection of the application role (closed by the demo).
        publish: publishes a price book file with the environment given (default:
            :func:`publish_with_cli`).
    """

    import_events: ImportEventsRun
    close_period: ClosePeriodRun
    database: Callable[[Settings], psycopg.Connection[Any]]
    publish: Callable[[Path, Mapping[str, str]], str] = publish_with_cli


#: Verdicts of one customer: ``match``; ``mismatch`` (subtotal or lines);
#: ``missing`` (no invoice, no hold); ``held`` (held, the answer expected an invoice);
#: ``held as expected`` (the answer expected a hold too).
VERDICTS = ("match", "mismatch", "missing", "held", "held as expected")


@dataclass
class CustomerResult:
    """One customer's invoice against the answer."""

    customer: GeneratedCustomer
    expected: ExpectedInvoice
    subtotal: Decimal | None = None
    invoice_number: str | None = None
    invoice_lines: int | None = None
    #: ``(expected, invoiced)`` pairs of the lines that differ (``None``: absent)
    line_differences: list[tuple[str | None, str | None]] = field(default_factory=list)
    hold_reason: str | None = None
    verdict: str = "missing"


@dataclass(frozen=True)
class _Issued:
    """A customer's current issued invoice of the period and its email delivery, if any."""

    customer_id: str
    invoice_id: str
    invoice_number: str
    subtotal: Decimal
    total: Decimal
    currency: str
    line_count: int
    revision: int
    status: str | None
    message_id: str | None
    skip_reason: str | None


@dataclass
class PricingReport:
    """The pricing demo's outcome; ``ok`` is what the exit status says."""

    config: ScenarioConfig
    events_file: str = ""
    events_in_file: int = 0
    distinct_events: int = 0
    duplicates_resent: int = 0
    events_by_type: dict[str, int] = field(default_factory=dict)
    starts_in_period: int = 0
    changes_in_period: int = 0
    ends_in_period: int = 0
    results: list[CustomerResult] = field(default_factory=list)
    invoices: int = 0
    revisions_above_one: int = 0
    emails_sent: int = 0
    #: invoices with a non-zero total that were not emailed: (invoice number, status/reason)
    emails_not_sent: list[tuple[str, str]] = field(default_factory=list)
    duplicate_emails: int = 0
    total_by_currency: dict[str, Decimal] = field(default_factory=dict)
    publish_output: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    def count(self, verdict: str) -> int:
        return sum(1 for result in self.results if result.verdict == verdict)

    @property
    def ok(self) -> bool:
        return (
            bool(self.results)
            and all(r.verdict in ("match", "held as expected") for r in self.results)
            and not self.emails_not_sent
            and self.duplicate_emails == 0
            and self.revisions_above_one == 0
        )


# --------------------------------------------------------------------------- reconciliation


def _line_key(line: ExpectedLine) -> tuple[str, ...]:
    if line.model == "pass_through":
        return ("pass_through", line.event_id or "")
    return (line.plan or "", str(line.version), line.charge, line.group or "")


def _expected_lines(invoice: ExpectedInvoice) -> dict[tuple[str, ...], str]:
    """Line key → what the line must say (``"<quantity> <amount>"``, or the amount), exact."""
    result = {}
    for line in invoice.lines:
        quantity = (
            "" if line.quantity is None or line.model == "pass_through" else f"{line.quantity:f} "
        )
        result[_line_key(line)] = f"{quantity}{line.amount:f}".strip()
    return result


def _has_table(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone() == (True,)


def _invoiced_lines(conn: psycopg.Connection[Any], invoice_id: str) -> dict[tuple[str, ...], str]:
    """The same keys and texts as :func:`_expected_lines`, from the issued invoice: rated
    charge lines (``invoice_charges``) and pre-priced lines (``invoice_lines``)."""
    result: dict[tuple[str, ...], str] = {}
    if _has_table(conn, "invoice_charges"):
        for plan, version, charge, group, model, quantity, amount in conn.execute(
            "SELECT plan_code, plan_version, charge_code, group_value, charge_model, quantity, "
            "amount FROM invoice_charges WHERE invoice_id = %s",
            (invoice_id,),
        ).fetchall():
            shown = (
                "" if quantity is None or model in ("fixed", "minimum") else f"{_plain(quantity)} "
            )
            result[(plan, str(version), charge, group or "")] = f"{shown}{_plain(amount)}".strip()
    for event_id, amount in conn.execute(
        "SELECT event_id, amount FROM invoice_lines WHERE invoice_id = %s", (invoice_id,)
    ).fetchall():
        result[("pass_through", event_id)] = _plain(amount)
    return result


def _plain(value: Decimal) -> str:
    """A decimal without trailing fractional zeros or exponent (NUMERIC keeps the scale)."""
    text = format(value, "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def _describe(key: tuple[str, ...]) -> str:
    if key[0] == "pass_through":
        return f"pass-through {key[1][:8]}…"
    plan, version, charge, group = key
    return f"{plan} v{version} {charge}" + (f" ({group})" if group else "")


def reconcile(
    conn: psycopg.Connection[Any],
    scenario: Scenario,
    answer: Mapping[str, ExpectedInvoice],
    maildir: Path | None,
) -> PricingReport:
    """Compare every customer's issued invoice (current revision) with the answer, and
    count emails (and duplicates in ``maildir``, the SMTP sink's, when given)."""
    report = PricingReport(config=scenario.config)
    period = scenario.config.period
    ids = [c.customer_id for c in scenario.customers]
    with conn.cursor(row_factory=class_row(_Issued)) as cur:
        cur.execute(
            """
            SELECT i.customer_id, i.invoice_id::text AS invoice_id, i.invoice_number,
                   i.subtotal, i.total, btrim(i.currency) AS currency, i.line_count, i.revision,
                   d.status, d.message_id, d.skip_reason
              FROM invoices i
              LEFT JOIN email_deliveries d
                     ON d.document_id = i.invoice_id AND d.document_type = 'invoice'
             WHERE i.status = 'issued' AND i.billing_period = %s AND i.customer_id = ANY(%s)
            """,
            (period, ids),
        )
        invoices = {row.customer_id: row for row in cur.fetchall()}
    holds = dict(
        conn.execute(
            "SELECT customer_id, string_agg(reason, '; ') FROM invoice_holds "
            "WHERE released_at IS NULL AND billing_period = %s AND customer_id = ANY(%s) "
            "GROUP BY customer_id",
            (period, ids),
        ).fetchall()
    )
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for customer in scenario.customers:
        expected = answer[customer.customer_id]
        result = CustomerResult(customer, expected)
        report.results.append(result)
        invoice = invoices.get(customer.customer_id)
        if invoice is None:
            result.hold_reason = holds.get(customer.customer_id)
            if result.hold_reason is None:
                result.verdict = "missing"
            else:
                result.verdict = "held as expected" if expected.gaps else "held"
            continue
        result.subtotal = invoice.subtotal
        result.invoice_number = invoice.invoice_number
        result.invoice_lines = invoice.line_count
        want = _expected_lines(expected)
        got = _invoiced_lines(conn, invoice.invoice_id)
        for key in sorted(set(want) | set(got)):
            if want.get(key) != got.get(key):
                result.line_differences.append(
                    (
                        None if key not in want else f"{_describe(key)}: {want[key]}",
                        None if key not in got else f"{_describe(key)}: {got[key]}",
                    )
                )
        same = expected.subtotal is not None and invoice.subtotal == expected.subtotal
        result.verdict = "match" if same and not result.line_differences else "mismatch"
        totals[invoice.currency] += invoice.total
        if invoice.revision > 1:
            report.revisions_above_one += 1
        if invoice.status == "sent":
            report.emails_sent += 1
        elif not (invoice.status == "skipped" and invoice.skip_reason == "zero_total"):
            state = (
                f"{invoice.status} ({invoice.skip_reason})"
                if invoice.status
                else "no delivery recorded"
            )
            report.emails_not_sent.append((invoice.invoice_number, state))
    report.invoices = len(invoices)
    report.total_by_currency = dict(totals)
    if maildir is not None and maildir.exists():
        from streams.devtools.stack.maildir import count_by_header

        message_ids = {
            i.message_id for i in invoices.values() if i.status == "sent" and i.message_id
        }
        counts = count_by_header(maildir, "Message-ID")
        report.duplicate_emails = sum(max(0, counts.get(mid, 0) - 1) for mid in message_ids)
        for mid in message_ids:
            if counts.get(mid, 0) == 0:
                report.emails_not_sent.append((mid, "recorded as sent, not in the SMTP sink"))
    return report


def settled(
    conn: psycopg.Connection[Any], period: str, customers: Sequence[str]
) -> tuple[int, int]:
    """(customers invoiced or held, invoices whose email is settled)."""
    row = conn.execute(
        """
        SELECT (SELECT count(DISTINCT customer_id) FROM invoices
                 WHERE status = 'issued' AND billing_period = %(p)s AND customer_id = ANY(%(c)s))
             + (SELECT count(DISTINCT customer_id) FROM invoice_holds h
                 WHERE released_at IS NULL AND billing_period = %(p)s AND customer_id = ANY(%(c)s)
                   AND NOT EXISTS (SELECT 1 FROM invoices i WHERE i.customer_id = h.customer_id
                                     AND i.billing_period = %(p)s AND i.status = 'issued')),
               (SELECT count(*) FROM invoices i
                 WHERE status = 'issued' AND billing_period = %(p)s AND customer_id = ANY(%(c)s)
                   AND EXISTS (SELECT 1 FROM email_deliveries d WHERE d.document_id = i.invoice_id
                                  AND d.status IN ('sent', 'skipped')))
        """,
        {"p": period, "c": list(customers)},
    ).fetchone()
    assert row is not None
    done, emailed = row
    return int(done), int(emailed)


# --------------------------------------------------------------------------- the run


def run_pricing_demo(
    settings: Settings,
    *,
    clients: PricingDemoClients,
    config: ScenarioConfig | None = None,
    book: Path | None = None,
    events_file: Path | None = None,
    workers: int = 3,
    timeout_s: float = 600.0,
    env: Mapping[str, str] | None = None,
    maildir: Path | None = None,
    stack_up: bool = True,
    console: Console | None = None,
) -> PricingReport:
    """The pricing demo (see the module docstring). Returns the report; the CLI prints it.

    Args:
        config: the scenario (default :class:`ScenarioConfig`: 30 customers, seed 1, 2024-11).
        book: the price book (default ``examples/pricing/price-book.yaml`` of the project).
        events_file: where the events are written (default ``.local/demo/pricing-<…>.jsonl``).
        env: ``INVOICING_…`` overrides for the processes started (workers, ``plans
            publish``): a sandbox's; ``None`` for the process's own environment.
        maildir: the SMTP sink's Maildir to count emails in (default: the stack's).
        stack_up: bring the local stack up first (the CLI); a test's stack is up.

    Raises:
        PricingDemoError: ``plans publish`` failed, or an event was not delivered.
        ImporterError: the events could not be produced (see the importer).
    """
    from streams.devtools.stack.manager import Stack

    console = console or Console(stderr=True)
    config = config or ScenarioConfig()
    book = book or settings.stack.home / DEFAULT_BOOK
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    stack = Stack(settings, report=lambda m: console.print(f"[cyan]stack[/]: {m}"))
    if stack_up:
        stack.up()
    timings["stack up"] = time.monotonic() - t0
    maildir = maildir or stack.layout.maildir
    name = f"pricing-s{config.seed}-{config.period}-{config.customers}.jsonl"
    events_file = events_file or stack.layout.local / "demo" / name

    t_generate = time.monotonic()
    scenario = generate(config)
    scenario.write(events_file)
    events = read_events(events_file)
    answer = expected_invoices(book.read_text(encoding="utf-8"), events, config.period)
    timings["generate + answer"] = time.monotonic() - t_generate
    console.print(
        f"generated {len(scenario.events)} events for {config.customers} customers "
        f"(seed {config.seed}, {config.period}) → {events_file}; the answer computed"
    )
    t_publish = time.monotonic()
    published = clients.publish(book, env or {})
    timings["publish"] = time.monotonic() - t_publish
    console.print(f"invoicing plans publish {book}: {published}")

    log_dir = stack.layout.logs / "demo-pricing"
    with WorkerGroup(log_dir, env or {}) as group:
        t1 = time.monotonic()
        group.start("invoicing", workers)
        group.start("email", 1)
        console.print(f"started {workers} invoicing workers and 1 email sender (logs: {log_dir})")
        summary = clients.import_events(events_file, settings, progress=True)
        timings["import"] = time.monotonic() - t1
        if not summary.ok:
            raise PricingDemoError(f"events import incomplete: {summary.delivery_failures[:3]}")
        console.print(
            f"imported {summary.produced} events ({summary.produced / max(summary.elapsed_s, 1e-9):.0f}"
            f"/s), {len(summary.skipped)} skipped"
        )
        clients.close_period(config.period, settings, progress=False)
        console.print(f"closed billing period {config.period}")

        t2 = time.monotonic()
        ids = [c.customer_id for c in scenario.customers]
        wanted = len(ids)
        deadline = time.monotonic() + timeout_s
        with (
            clients.database(settings) as conn,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
            ) as progress,
        ):
            invoiced_task = progress.add_task("invoices issued (or held)", total=wanted)
            emailed_task = progress.add_task("emails settled", total=wanted)
            while time.monotonic() < deadline:
                done, emailed = settled(conn, config.period, ids)
                progress.update(invoiced_task, completed=done)
                progress.update(emailed_task, completed=emailed)
                if done >= wanted and emailed >= wanted - _held(conn, config.period, ids):
                    break
                dead = [w.name for w in group.processes if w.process.poll() is not None]
                if dead:
                    console.print(f"[red]worker(s) exited: {', '.join(dead)}; see {log_dir}[/]")
                    break
                time.sleep(0.5)
        timings["invoice+email"] = time.monotonic() - t2
        with clients.database(settings) as conn:
            report = reconcile(conn, scenario, answer, maildir)
    counts = Counter(event["type"] for event in scenario.events)
    report.events_file = str(events_file)
    report.events_in_file = len(scenario.events)
    report.distinct_events = len(events)
    report.duplicates_resent = scenario.duplicates
    report.events_by_type = dict(sorted(counts.items()))
    report.starts_in_period = scenario.in_period("subscription.started")
    report.changes_in_period = scenario.in_period("subscription.changed")
    report.ends_in_period = scenario.in_period("subscription.ended")
    report.publish_output = published
    timings["total"] = time.monotonic() - t0
    report.timings = timings
    return report


def _held(conn: psycopg.Connection[Any], period: str, customers: Sequence[str]) -> int:
    row = conn.execute(
        "SELECT count(DISTINCT customer_id) FROM invoice_holds WHERE released_at IS NULL "
        "AND billing_period = %s AND customer_id = ANY(%s)",
        (period, list(customers)),
    ).fetchone()
    if row is None:
        return 0
    (held,) = row
    return int(held)
