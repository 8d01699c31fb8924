"""``invoicing demo``: the main job on the bundled FOCUS sample (:mod:`streams.demo`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from streams.entrypoints.common import configure_logging, console, out, settings_of

if TYPE_CHECKING:
    from streams.demo.run import DemoReport


def demo_command(
    ctx: typer.Context,
    path: Annotated[
        Path | None, typer.Option("--file", help="FOCUS 1.0 CSV (default: the bundled sample).")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Invoicing worker processes.")
    ] = 3,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for every invoice and email.")
    ] = 600.0,
) -> None:
    """The main job: stack up, import the FOCUS sample, invoice and email it, reconcile.

    Exit 1 on a mismatch or a missing invoice or email.
    """
    from streams import bootstrap
    from streams.demo.expected import DEFAULT_SAMPLE
    from streams.demo.run import run_demo

    configure_logging("WARNING")
    settings = settings_of(ctx)
    report = run_demo(
        settings,
        clients=bootstrap.demo_clients(),
        path=path or settings.stack.home / DEFAULT_SAMPLE,
        workers=workers,
        timeout_s=timeout_s,
        console=console,
    )
    print_report(report, out)
    if not report.ok:
        raise typer.Exit(1)


def print_report(report: DemoReport, console: Console) -> None:
    """Print the reconciliation per (customer, month), then the summary table."""
    # One line per pair, customer last: account ids are up to ~80 characters long and
    # a bordered table would fold them on an 80-column terminal.
    console.print("reconciliation per (customer, month): round(Σ BilledCost) vs invoice subtotal")
    head = f"{'month':<8} {'Σ BilledCost (exact)':>22} {'rounded':>10} {'subtotal':>10}    customer"
    console.print(head, markup=False, soft_wrap=True)
    for customer, period, exact, want, got in report.pairs:
        verdict = "??" if got is None else ("=" if got == want else "!=")
        shown = "(none)" if got is None else str(got)
        line = f"{period:<8} {exact:>22f} {want!s:>10} {shown:>10} {verdict:>2} {customer}"
        console.print(line, markup=False, soft_wrap=True, highlight=False)
    table = Table(title="invoicing demo: FOCUS 1.0 sample")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("customers invoiced", str(report.customers))
    table.add_row("invoices issued", str(report.invoices))
    table.add_row("emails sent", str(report.emails_sent))
    table.add_row("not emailed (zero total)", str(report.emails_skipped_zero_total))
    table.add_row("not emailed (refused, failed or pending)", str(len(report.emails_not_sent)))
    table.add_row("duplicate emails", str(report.duplicate_emails))
    for currency, total in sorted(report.total_by_currency.items()):
        table.add_row(f"sum of totals ({currency})", f"{total}")
    table.add_row("reconciliation: subtotal = round(Σ BilledCost)", f"{report.matches} match")
    table.add_row("reconciliation: mismatches", str(len(report.mismatches)))
    table.add_row("missing", str(len(report.missing)))
    table.add_row("file rows not reconcilable", str(len(report.unreadable_rows)))
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
    if report.emails_not_sent:
        console.print(f"[red]not emailed:[/] {report.emails_not_sent[:20]}")
    for line_no, reason in report.unreadable_rows[:20]:
        console.print(f"[yellow]file line {line_no}[/]: {reason}")
