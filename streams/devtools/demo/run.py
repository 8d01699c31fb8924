"""The demo's run (steps 1-6 of :mod:`streams.devtools.demo`) and its reconciliation."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import class_row
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from streams.apps.ops.focus_expected import DEFAULT_SAMPLE, Expected, expected_from_file
from streams.devtools.sandbox.processes import WorkerGroup
from streams.settings import Settings

if TYPE_CHECKING:
    from streams.apps.importers.close_period import ClosePeriodRun
    from streams.apps.importers.focus_import import ImportFocusRun


@dataclass(frozen=True)
class DemoClients:
    """What the demo runs through, wired by the composition root
    (:func:`streams.bootstrap.demo_clients`); each builds its clients when called,
    after the stack is up.

    Attributes:
        import_focus: the FOCUS import with its producer.
        close_period: close-period with its clients.
        database: a new autocommit connection of the read-only operator role (closed by the demo).
    """

    import_focus: ImportFocusRun
    close_period: ClosePeriodRun
    database: Callable[[Settings], psycopg.Connection[Any]]


@dataclass(frozen=True)
class _Emailed:
    """An issued invoice of the file's pairs and its email delivery, if any."""

    customer_id: str
    billing_period: str
    total: Decimal
    currency: str
    invoice_id: str
    status: str | None
    message_id: str | None
    skip_reason: str | None


@dataclass
class DemoReport:
    """The demo's outcome; ``ok`` is what the exit status says."""

    customers: int = 0
    invoices: int = 0
    emails_sent: int = 0
    emails_skipped_zero_total: int = 0
    #: invoices with a non-zero total that were not emailed: (invoice id, status/reason)
    emails_not_sent: list[tuple[str, str]] = field(default_factory=list)
    total_by_currency: dict[str, Decimal] = field(default_factory=dict)
    matches: int = 0
    mismatches: list[tuple[str, str, Decimal, Decimal | None]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    #: per (customer, period): exact Σ BilledCost, that sum rounded, the invoice subtotal
    pairs: list[tuple[str, str, Decimal, Decimal, Decimal | None]] = field(default_factory=list)
    #: rows of the file that could not be reconciled (line number, reason)
    unreadable_rows: tuple[tuple[int, str], ...] = ()
    duplicate_emails: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            not self.mismatches
            and not self.missing
            and not self.emails_not_sent
            and self.duplicate_emails == 0
        )


def progress_counts(conn: psycopg.Connection[Any], expected: Expected) -> tuple[int, int]:
    """(invoices issued, invoices whose email is settled) for the expected (customer, period) pairs."""
    customers = sorted({c for c, _ in expected.sums})
    periods = expected.periods
    row = conn.execute(
        """
        SELECT count(*),
               count(*) FILTER (WHERE EXISTS (
                   SELECT 1 FROM email_deliveries d
                    WHERE d.document_id = i.invoice_id AND d.status IN ('sent', 'skipped')))
          FROM invoices i
         WHERE i.status = 'issued' AND i.customer_id = ANY(%s) AND i.billing_period = ANY(%s)
        """,
        (customers, periods),
    ).fetchone()
    assert row is not None
    invoiced, emailed = row
    return int(invoiced), int(emailed)


def reconcile(
    conn: psycopg.Connection[Any], expected: Expected, maildir: Path | None
) -> DemoReport:
    """Compare the invoices with the file's exact sums
    (:func:`streams.apps.ops.focus_reconcile.reconcile_focus`, the comparison of ``invoicing
    reconcile --focus``), and count emails. Invoices of customers the file does not
    have are not the demo's (the stack may hold others)."""
    from streams.apps.ops.focus_reconcile import reconcile_focus

    report = DemoReport(unreadable_rows=expected.unreadable)
    compared = reconcile_focus(conn, expected)
    for pair in sorted(compared.pairs, key=lambda pair: (pair.customer_id, pair.period)):
        if pair.verdict == "unexpected" or pair.exact is None or pair.rounded is None:
            continue
        report.pairs.append(
            (pair.customer_id, pair.period, pair.exact, pair.rounded, pair.subtotal)
        )
        if pair.verdict == "missing":
            report.missing.append((pair.customer_id, pair.period))
        elif pair.verdict == "match":
            report.matches += 1
        else:
            report.mismatches.append((pair.customer_id, pair.period, pair.rounded, pair.subtotal))
    customers = sorted({c for c, _ in expected.sums})
    with conn.cursor(row_factory=class_row(_Emailed)) as cur:
        cur.execute(
            """
            SELECT i.customer_id, i.billing_period, i.total, btrim(i.currency) AS currency,
                   i.invoice_id::text AS invoice_id, d.status, d.message_id, d.skip_reason
              FROM invoices i
              LEFT JOIN email_deliveries d
                     ON d.document_id = i.invoice_id AND d.document_type = 'invoice'
             WHERE i.status = 'issued' AND i.customer_id = ANY(%s) AND i.billing_period = ANY(%s)
            """,
            (customers, expected.periods),
        )
        invoices = {
            (row.customer_id, row.billing_period): row
            for row in cur.fetchall()
            if (row.customer_id, row.billing_period) in expected.sums
        }
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for _key, invoice in sorted(invoices.items()):
        totals[invoice.currency] += invoice.total
        if invoice.status == "sent":
            report.emails_sent += 1
        elif invoice.status == "skipped" and invoice.skip_reason == "zero_total":
            report.emails_skipped_zero_total += 1
        else:  # refused by SMTP, not renderable, or not settled before the timeout
            state = (
                f"{invoice.status} ({invoice.skip_reason})"
                if invoice.status
                else "no delivery recorded"
            )
            report.emails_not_sent.append((invoice.invoice_id, state))
    report.invoices = len(invoices)
    report.customers = len({c for c, _ in invoices})
    report.total_by_currency = dict(totals)
    if maildir is not None and maildir.exists():
        from streams.devtools.stack.maildir import count_by_header

        message_ids = {
            invoice.message_id
            for invoice in invoices.values()
            if invoice.status == "sent" and invoice.message_id
        }
        counts = count_by_header(maildir, "Message-ID")
        report.duplicate_emails = sum(max(0, counts.get(mid, 0) - 1) for mid in message_ids)
        missing_in_sink = [mid for mid in message_ids if counts.get(mid, 0) == 0]
        report.missing.extend(("email not in the SMTP sink", mid) for mid in missing_in_sink)
    return report


def run_demo(
    settings: Settings,
    *,
    clients: DemoClients,
    path: Path = DEFAULT_SAMPLE,
    workers: int = 3,
    timeout_s: float = 600.0,
    console: Console | None = None,
) -> DemoReport:
    """The main job (see the module docstring). Returns the report; the CLI prints it."""
    from streams.devtools.stack.manager import Stack

    console = console or Console(stderr=True)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    stack = Stack(settings, report=lambda m: console.print(f"[cyan]stack[/]: {m}"))
    stack.up()
    timings["stack up"] = time.monotonic() - t0

    expected = expected_from_file(path)
    log_dir = stack.layout.logs / "demo"
    with WorkerGroup(log_dir) as group:
        t1 = time.monotonic()
        group.start("invoicing", workers)
        group.start("email", 1)
        console.print(f"started {workers} invoicing workers and 1 email sender (logs: {log_dir})")

        summary = clients.import_focus(path, settings, progress=True)
        timings["import"] = time.monotonic() - t1
        console.print(
            f"imported {summary.produced} usage rows, {summary.customers_produced} customers "
            f"({summary.produced / max(summary.elapsed_s, 1e-9):.0f} rows/s)"
        )
        for period in expected.periods:
            clients.close_period(period, settings, progress=False)
        console.print(f"closed billing periods: {', '.join(expected.periods)}")

        t2 = time.monotonic()
        wanted = len(expected.sums)
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
            invoiced_task = progress.add_task("invoices issued", total=wanted)
            emailed_task = progress.add_task(
                "emails settled (sent or not, with a reason)", total=wanted
            )
            while time.monotonic() < deadline:
                invoiced, emailed = progress_counts(conn, expected)
                progress.update(invoiced_task, completed=invoiced)
                progress.update(emailed_task, completed=emailed)
                if invoiced >= wanted and emailed >= wanted:
                    break
                dead = [w.name for w in group.processes if w.process.poll() is not None]
                if dead:
                    console.print(f"[red]worker(s) exited: {', '.join(dead)}; see {log_dir}[/]")
                    break
                time.sleep(0.5)
        timings["invoice+email"] = time.monotonic() - t2
        with clients.database(settings) as conn:
            report = reconcile(conn, expected, stack.layout.maildir)
    timings["total"] = time.monotonic() - t0
    report.timings = timings
    return report
