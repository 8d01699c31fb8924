"""``invoicing demo``: the main job, end to end, on the bundled real FOCUS sample.

1. brings the local stack up (idempotent);
2. imports the FOCUS 1.0 CSV into ``billing.account-events.v1``;
3. starts a group of invoicing workers (default 3, separate processes) and one
   email sender;
4. closes every billing period present in the file (``close-period``);
5. waits, with a progress bar, until every (customer, period) of the file has an
   invoice and every invoice is emailed (or recorded as not emailed because its
   total is zero);
6. prints the result and the reconciliation: for each (customer, month) the exact
   sum of ``BilledCost`` rounded once (half-even, minor unit) against the invoice
   subtotal. Exit status 1 on any mismatch or missing invoice.

Running it again changes nothing: the import deduplicates, the close markers
have the same ids, and the invoices already exist (the table shows the same
result).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from streams.domain.focus import FocusUsage, iter_focus_rows
from streams.domain.money import round_money
from streams.processes import WorkerGroup
from streams.settings import Settings

DEFAULT_SAMPLE = Path("examples/focus/focus_sample.csv")


@dataclass(frozen=True)
class Expected:
    """What the file says each (customer, period) must be invoiced: exact sums and currency."""

    sums: dict[tuple[str, str], Decimal]
    currency: dict[tuple[str, str], str]
    rows: int

    @property
    def periods(self) -> list[str]:
        return sorted({period for _, period in self.sums})


def expected_from_file(path: Path, *, customer_prefix: str = "") -> Expected:
    """Exact sum of amounts per (customer, period) of a FOCUS file (independent of Kafka and the DB)."""
    sums: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    currency: dict[tuple[str, str], str] = {}
    rows = 0
    with path.open(newline="", encoding="utf-8-sig") as fh:
        for result in iter_focus_rows(fh):
            if isinstance(result, FocusUsage):
                key = (customer_prefix + result.usage.customer_id, result.usage.billing_period)
                sums[key] += result.usage.amount
                currency[key] = result.usage.currency
                rows += 1
    return Expected(dict(sums), currency, rows)


@dataclass
class DemoReport:
    """The demo's outcome; ``ok`` is what the exit status says."""

    customers: int = 0
    invoices: int = 0
    emails_sent: int = 0
    emails_skipped_zero_total: int = 0
    total_by_currency: dict[str, Decimal] = field(default_factory=dict)
    matches: int = 0
    mismatches: list[tuple[str, str, Decimal, Decimal | None]] = field(default_factory=list)
    missing: list[tuple[str, str]] = field(default_factory=list)
    duplicate_emails: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches and not self.missing and self.duplicate_emails == 0


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
    return int(row[0]), int(row[1])


def reconcile(
    conn: psycopg.Connection[Any], expected: Expected, maildir: Path | None
) -> DemoReport:
    """Compare the invoices with the file's exact sums, and count emails."""
    report = DemoReport()
    customers = sorted({c for c, _ in expected.sums})
    rows = conn.execute(
        """
        SELECT i.customer_id, i.billing_period, i.subtotal, i.total, i.currency, i.invoice_id::text,
               d.status, d.message_id
          FROM invoices i
          LEFT JOIN email_deliveries d ON d.document_id = i.invoice_id AND d.document_type = 'invoice'
         WHERE i.status = 'issued' AND i.customer_id = ANY(%s) AND i.billing_period = ANY(%s)
        """,
        (customers, expected.periods),
    ).fetchall()
    invoices = {(r[0], r[1]): r for r in rows}
    totals: dict[str, Decimal] = defaultdict(Decimal)
    for key, exact in sorted(expected.sums.items()):
        currency = expected.currency[key]
        want = round_money(exact, currency)
        row = invoices.get(key)
        if row is None:
            report.missing.append(key)
            continue
        if row[2] == want:
            report.matches += 1
        else:
            report.mismatches.append((key[0], key[1], want, row[2]))
        totals[row[4].strip()] += row[3]
        if row[6] == "sent":
            report.emails_sent += 1
        elif row[6] == "skipped":
            report.emails_skipped_zero_total += 1
    report.invoices = len(invoices)
    report.customers = len({c for c, _ in invoices})
    report.total_by_currency = dict(totals)
    if maildir is not None and maildir.exists():
        from streams.adapters.maildir import count_by_header

        message_ids = {r[7] for r in rows if r[6] == "sent"}
        counts = count_by_header(maildir, "Message-ID")
        report.duplicate_emails = sum(max(0, counts.get(mid, 0) - 1) for mid in message_ids)
        missing_in_sink = [mid for mid in message_ids if counts.get(mid, 0) == 0]
        report.missing.extend(("email not in the SMTP sink", mid) for mid in missing_in_sink)
    return report


def run_demo(
    settings: Settings,
    *,
    path: Path = DEFAULT_SAMPLE,
    workers: int = 3,
    timeout_s: float = 600.0,
    console: Console | None = None,
) -> DemoReport:
    """The main job (see the module docstring). Returns the report; the CLI prints it."""
    from streams.importers.close_period import close_period
    from streams.importers.focus_import import import_focus
    from streams.stack.manager import Stack

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

        summary = import_focus(path, settings, progress=True)
        timings["import"] = time.monotonic() - t1
        console.print(
            f"imported {summary.produced} usage rows, {summary.customers_produced} customers "
            f"({summary.produced / max(summary.elapsed_s, 1e-9):.0f} rows/s)"
        )
        for period in expected.periods:
            close_period(period, settings, progress=False)
        console.print(f"closed billing periods: {', '.join(expected.periods)}")

        t2 = time.monotonic()
        wanted = len(expected.sums)
        deadline = time.monotonic() + timeout_s
        with (
            psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=console,
            ) as progress,
        ):
            invoiced_task = progress.add_task("invoices issued", total=wanted)
            emailed_task = progress.add_task("emailed (or zero total)", total=wanted)
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
        with psycopg.connect(settings.postgres.dsn(), autocommit=True) as conn:
            report = reconcile(conn, expected, stack.layout.maildir)
    timings["total"] = time.monotonic() - t0
    report.timings = timings
    return report


def print_report(report: DemoReport, console: Console) -> None:
    table = Table(title="invoicing demo: FOCUS 1.0 sample")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("customers invoiced", str(report.customers))
    table.add_row("invoices issued", str(report.invoices))
    table.add_row("emails sent", str(report.emails_sent))
    table.add_row("not emailed (zero total)", str(report.emails_skipped_zero_total))
    table.add_row("duplicate emails", str(report.duplicate_emails))
    for currency, total in sorted(report.total_by_currency.items()):
        table.add_row(f"sum of totals ({currency})", f"{total}")
    table.add_row("reconciliation: subtotal = round(Σ BilledCost)", f"{report.matches} match")
    table.add_row("reconciliation: mismatches", str(len(report.mismatches)))
    table.add_row("missing", str(len(report.missing)))
    for name, seconds in report.timings.items():
        table.add_row(f"time: {name}", f"{seconds:.1f} s")
    console.print(table)
    if report.mismatches:
        detail = Table(title="mismatches")
        for col in ("customer", "period", "expected subtotal", "invoice subtotal"):
            detail.add_column(col)
        for customer, period, want, got in report.mismatches:
            detail.add_row(customer, period, str(want), str(got))
        console.print(detail)
    if report.missing:
        console.print(f"[red]missing:[/] {report.missing[:20]}")
