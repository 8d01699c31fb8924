"""``invoicing import …``: account events into ``billing.account-events.v1`` (FOCUS, CloudEvents)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from streams.entrypoints.common import console, exit_on, out, settings_of

if TYPE_CHECKING:
    from streams.apps.importers.events_import import EventsImportSummary
    from streams.apps.importers.focus_import import ImportSummary

app = typer.Typer(
    help="Import usage and account events into billing.account-events.v1.", no_args_is_help=True
)


@app.command("focus")
def import_focus_command(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="FOCUS 1.0 CSV file.")],
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    strict: bool = typer.Option(False, "--strict", help="Exit 3 when any row was skipped."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar."),
) -> None:
    """Produce customer.upserted + usage.recorded events from a FOCUS CSV.

    Exit 0: every mapped row delivered (skipped rows are printed); 1: a delivery
    failed or Kafka/the topic is unavailable; 2: the file cannot be imported;
    3: --strict and rows were skipped.
    """
    from streams import bootstrap
    from streams.apps.importers import ImporterError, SourceUnreadable
    from streams.bootstrap.runtime import tune_gc

    settings = settings_of(ctx)
    tune_gc(settings.worker.gc_threshold)
    with exit_on((SourceUnreadable, 2, "cannot import"), (ImporterError, 1, "import failed")):
        summary = bootstrap.run_import_focus(path, settings, progress=progress)
    print_summary(summary, console)
    if json_out:
        out.print_json(json.dumps(summary.to_dict()))
    if not summary.ok:
        raise typer.Exit(1)
    if strict and summary.skipped:
        raise typer.Exit(3)


@app.command("events")
def import_events_command(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="CloudEvents JSON lines (one event per line).")],
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    strict: bool = typer.Option(False, "--strict", help="Exit 3 when any line was skipped."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar."),
) -> None:
    """Produce account events (usage.metered, subscription.*, usage.recorded,
    customer.upserted) from a CloudEvents JSON-lines file, in file order.

    Exit 0: every valid line delivered (skipped lines are printed); 1: a delivery
    failed or Kafka/the topic is unavailable; 2: the file cannot be read; 3: --strict
    and lines were skipped.
    """
    from streams import bootstrap
    from streams.apps.importers import ImporterError, SourceUnreadable

    with exit_on((SourceUnreadable, 2, "cannot import"), (ImporterError, 1, "import failed")):
        summary = bootstrap.run_import_events(path, settings_of(ctx), progress=progress)
    print_events_summary(summary, console)
    if json_out:
        out.print_json(json.dumps(summary.to_dict()))
    if not summary.ok:
        raise typer.Exit(1)
    if strict and summary.skipped:
        raise typer.Exit(3)


def print_events_summary(
    summary: EventsImportSummary, console: Console, *, max_rows: int = 50
) -> None:
    """A human summary of an events import: counts per type, skipped lines, failures."""
    style = "green" if summary.ok else "red"
    kinds = ", ".join(f"{count} {kind}" for kind, count in summary.delivered.items()) or "nothing"
    console.print(
        f"[{style}]{'imported' if summary.ok else 'import INCOMPLETE'}[/] {summary.path} "
        f"→ {summary.topic}: {summary.lines} lines, delivered {kinds}; "
        f"{len(summary.skipped)} skipped; {summary.customers} customers; "
        f"{summary.elapsed_s:.2f}s"
    )
    for row in summary.skipped[:max_rows]:
        console.print(f"  [yellow]line {row.line_number}[/]: {row.reason}")
    if len(summary.skipped) > max_rows:
        console.print(f"  … and {len(summary.skipped) - max_rows} more (--json lists all)")
    for failure in summary.delivery_failures[:max_rows]:
        console.print(
            f"  [red]{failure.event_type} {failure.event_id}[/] (customer {failure.customer_id}, "
            f"line {failure.line_number}): {failure.error}"
        )


def print_summary(summary: ImportSummary, console: Console, *, max_rows: int = 50) -> None:
    """A human summary: counts, skipped rows with line and reason, failures."""
    style = "green" if summary.ok else "red"
    console.print(
        f"[{style}]{'imported' if summary.ok else 'import INCOMPLETE'}[/] {summary.path} "
        f"→ {summary.topic}: {summary.rows} rows, {summary.produced} usage.recorded and "
        f"{summary.customers_produced} customer.upserted delivered, {len(summary.skipped)} "
        f"skipped; {summary.customers} customers; periods "
        + ", ".join(f"{p} ({n})" for p, n in summary.periods.items())
        + f"; {summary.elapsed_s:.2f}s, {summary.rows_per_s:.0f} rows/s"
    )
    if summary.skipped:
        console.print(f"[yellow]skipped {len(summary.skipped)} row(s)[/]:")
        for kind, count in summary.skipped_by_reason.items():
            console.print(f"  {count} x {kind}")
        for row in summary.skipped[:max_rows]:
            console.print(f"  line {row.line_number}: {row.reason}")
        if len(summary.skipped) > max_rows:
            console.print(f"  … and {len(summary.skipped) - max_rows} more (--json lists all)")
    if summary.delivery_failures:
        console.print(f"[red]{len(summary.delivery_failures)} delivery failure(s)[/]:")
        for failure in summary.delivery_failures[:max_rows]:
            console.print(
                f"  {failure.event_type} {failure.event_id} (customer {failure.customer_id}, "
                f"line {failure.line_number}): {failure.error}"
            )
