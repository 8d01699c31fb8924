"""``invoicing replay YYYY-MM --dry-run | --apply``: the command; the replay is :mod:`streams.apps.replay`.

Loading the CLI does not import Kafka, PostgreSQL and the replay; the command
imports them when it runs.

Shadow re-rating: ``--dry-run --price-book FILE`` rates the period under the
candidate book FILE (validated, not published) instead of the published one and
reports each customer's difference from what was issued (subtotal, total, the
charge lines that change). ``--apply`` always rates under the published book.

Exit codes: 0 done (a dry run exits 0 with or without differences; read the
table or the report); 1 Kafka, database or per-customer failures (tax service,
invoice rules), or an invalid --price-book file; 2 invalid period or options; 3 Redis unreachable (nothing
done); 4 another replay of the period holds the lease (nothing done); 5 aborted
part-way (lease lost or fenced) or an apply with customers left for a resume —
run the same ``--apply`` again to resume.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from streams.entrypoints.common import console, leased_job, out, settings_of

if TYPE_CHECKING:
    from streams.apps.replay.report import ReplayReport


#: The help panel of the two modes, of which a run takes exactly one.
MODE_PANEL = "Mode (exactly one is required)"


def default_report_path(period: str, run_id: str) -> Path:
    """``reports/replay-<period>-<run id>.json`` (relative to the working directory)."""
    return Path("reports") / f"replay-{period}-{run_id}.json"


def replay_command(
    ctx: typer.Context,
    period: Annotated[str, typer.Argument(help="Billing period, YYYY-MM.")],
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Report the differences; write nothing to the invoice tables. "
        "Exactly one of --dry-run and --apply is required.",
        rich_help_panel=MODE_PANEL,
    ),
    apply: bool = typer.Option(
        False,
        "--apply",
        help="Correct every difference: credit note + new revision (resumes an unfinished "
        "apply). Exactly one of --dry-run and --apply is required.",
        rich_help_panel=MODE_PANEL,
    ),
    margin_days: float = typer.Option(
        7.0,
        "--margin-days",
        help="Re-read from this many days before the period's start (record time), for late "
        "or early-produced events. Ignored when an apply resumes (its window is stored).",
    ),
    report: Annotated[
        Path | None,
        typer.Option(
            "--report",
            help="Where to write the JSON report (default: reports/replay-PERIOD-RUN.json).",
        ),
    ] = None,
    price_book: Annotated[
        Path | None,
        typer.Option(
            "--price-book",
            help="Dry run only: rate under this candidate price book (YAML, not published) "
            "instead of the published one: shadow re-rating.",
        ),
    ] = None,
    lease_ttl: float = typer.Option(30.0, "--lease-ttl", help="Lease TTL, seconds."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    json_out: bool = typer.Option(False, "--json", help="Also print the report as JSON on stdout."),
) -> None:
    """Re-read PERIOD from Kafka, rebuild its usage and recompute its invoices; give
    exactly one of --dry-run and --apply (neither or both: exit 2).

    --dry-run prints the differences from what was issued (and writes the JSON
    report); --apply turns each into a credit note and a new revision, one
    email each. Running --apply again changes nothing. --dry-run --price-book FILE
    prices the period under an unpublished candidate book (shadow re-rating).
    See docs/replay.md.
    """
    from streams.apps.replay import CandidateBook, Mode
    from streams.apps.replay.errors import ReplayAborted, ReplayError
    from streams.bootstrap import replay_period
    from streams.bootstrap.runtime import tune_gc

    if dry_run == apply:
        console.print("[red]give exactly one of --dry-run and --apply[/]")
        raise typer.Exit(2)
    candidate: CandidateBook | None = None
    if price_book is not None:
        if apply:
            console.print(
                "[red]--price-book is for --dry-run only[/]: an apply issues under the "
                "published price book; publish it first (invoicing plans publish FILE)"
            )
            raise typer.Exit(2)
        from streams.apps.importers import SourceUnreadable
        from streams.apps.importers.price_book import read_price_book
        from streams.core.domain.rating import PriceBookError

        try:
            candidate = CandidateBook(read_price_book(price_book), f"candidate {price_book}")
        except (SourceUnreadable, PriceBookError) as exc:
            console.print(f"[red]--price-book {price_book}[/]: {exc}", markup=False)
            raise typer.Exit(1) from exc
    if margin_days < 0:
        console.print("[red]--margin-days must not be negative[/]")
        raise typer.Exit(2)
    mode = Mode.APPLY if apply else Mode.DRY_RUN
    settings = settings_of(ctx)
    tune_gc(settings.worker.gc_threshold)
    with leased_job(
        job="replay",
        busy=f"another replay of {period} is running",
        aborted=ReplayAborted,
        errors=(ReplayError,),
    ):
        result = replay_period(
            period,
            settings,
            mode=mode,
            margin=timedelta(days=margin_days),
            progress=progress,
            lease_ttl_s=lease_ttl,
            on_step=_fault_hook(settings.fault.kill_replay_after_writes),
            candidate=candidate,
        )
    document = result.to_dict()
    path = report or default_report_path(result.period, result.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    print_report(result, console)
    console.print(f"report: {path}")
    if json_out:
        out.print_json(json.dumps(document))
    if mode is Mode.APPLY and not result.complete:
        console.print("[yellow]customers left for a resume: run the same --apply again[/]")
        raise typer.Exit(5)
    if result.failed:
        raise typer.Exit(1)


def _fault_hook(kill_after_writes: int) -> Callable[[str, str], None] | None:
    """FAULT-INJECTION HOOK for the tests, never for production
    (``INVOICING_FAULT__KILL_REPLAY_AFTER_WRITES``, see
    :class:`streams.settings.FaultSettings`): SIGKILL this process once
    ``kill_after_writes`` customers' corrections are committed. None when 0."""
    if kill_after_writes <= 0:
        return None
    written = 0

    def hook(stage: str, customer: str) -> None:
        nonlocal written
        if stage != "written":
            return
        written += 1
        if written >= kill_after_writes:
            console.print(f"[red]fault injection: SIGKILL after writing {customer}[/]")
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _money(value: Any) -> str:
    return "" if value is None else str(value)


def print_report(result: ReplayReport, console: Console) -> None:
    """The differences (and skipped/failed customers) as a table, then one summary line."""
    title = f"replay {result.period} ({result.mode}) run {result.run_id}" + (
        f", resumed (attempt {result.attempt})" if result.resumed else ""
    )
    table = Table(title=title)
    for column in (
        "customer",
        "outcome",
        "issued",
        "old total",
        "new total",
        "Δ subtotal",
        "Δ total",
        "charges changed",
        "not invoiced",
        "absent",
        "new revision",
        "credit note",
        "reason",
    ):
        table.add_column(column, overflow="fold")
    for outcome in [*result.differences, *result.skipped, *result.failed]:
        diff = outcome.difference or {}
        issued = diff.get("issued") or {}
        recomputed = diff.get("recomputed") or {}
        delta = diff.get("delta") or {}
        not_invoiced = diff.get("usage_not_invoiced") or []
        absent = diff.get("invoiced_not_in_usage") or []
        charges = diff.get("charges_changed") or []
        table.add_row(
            outcome.customer_id,
            outcome.outcome,
            f"{issued.get('invoice_number', '')} r{issued['revision']}" if issued else "",
            _money(issued.get("total")),
            _money(recomputed.get("total")),
            _money(delta.get("subtotal")),
            _money(delta.get("total")),
            ", ".join(f"{c['description']} {c['delta']}" for c in charges[:3])
            + (f" (+{len(charges) - 3})" if len(charges) > 3 else ""),
            ", ".join(f"{line['event_id'][:12]} {line['amount']}" for line in not_invoiced[:3])
            + (f" (+{len(not_invoiced) - 3})" if len(not_invoiced) > 3 else ""),
            ", ".join(f"{line['event_id'][:12]} {line['amount']}" for line in absent[:3])
            + (f" (+{len(absent) - 3})" if len(absent) > 3 else ""),
            f"{outcome.new_invoice_number or ''} r{outcome.revision}"
            if outcome.new_invoice_number
            else "",
            outcome.credit_note_number or "",
            outcome.reason,
        )
    if result.differences or result.skipped or result.failed:
        console.print(table)
    s = result.summary()
    if result.price_book:
        console.print(f"price book: {result.price_book}", markup=False)
    console.print(
        f"[bold]replay {result.period}[/] {result.mode} run {result.run_id} ({result.status}): "
        f"{s['customers']} customers, {s['differences']} with differences, {s['unchanged']} "
        f"unchanged, {s['skipped']} skipped, {s['failed']} failed; "
        f"{s['corrected']} corrected, {s['invoiced']} invoiced; re-read {s['events_read']} "
        f"events in {s['read_s']}s ({s['events_per_s']} events/s); {s['elapsed_s']}s in all"
    )
    if result.conflicts:
        console.print(
            f"[yellow]{len(result.conflicts)} usage id conflict(s)[/] (first record kept): "
            + ", ".join(c.event_id for c in result.conflicts[:5])
        )
    if result.invalid:
        console.print(f"[yellow]{len(result.invalid)} record(s) did not decode[/] (skipped)")
    if result.open_apply_run:
        console.print(
            f"[yellow]an unfinished apply run {result.open_apply_run} exists[/]: "
            "the next --apply resumes it"
        )
