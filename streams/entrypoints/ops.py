"""Operator commands of ``invoicing``: status, holds, fences, outbox, reconcile (:mod:`streams.apps.ops`)."""

from __future__ import annotations

import getpass
import json
import socket
from datetime import timedelta
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from streams.adapters.postgres.grants import OUTBOX_PRUNE_FLOOR_DAYS
from streams.entrypoints.common import console, exit_on, settings_of
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS, INVOICES

#: Wide when not a terminal, so piped status output keeps its columns.
out = Console(width=None if Console().is_terminal else 160)

holds_app = typer.Typer(
    help="Invoices held because of dead-lettered input or a gap in the price book.",
    no_args_is_help=True,
)
fences_app = typer.Typer(help="Partition fencing tokens (partition_fences).", no_args_is_help=True)
outbox_app = typer.Typer(help="The transactional outbox.", no_args_is_help=True)


def _table(title: str, rows: list[dict[str, object]]) -> Table | str:
    if not rows:
        return f"{title}: none"
    table = Table(title=title)
    for col in rows[0]:
        table.add_column(str(col))
    for row in rows:
        table.add_row(*(str(v) if v is not None else "-" for v in row.values()))
    return table


def status_command(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Invoices and emails per period, holds, late usage, fences, lag, dead letters, outbox, connector.

    Exit 1 when something needs an operator (open holds, late usage, dead letters, a service down).
    """
    from streams import bootstrap
    from streams.apps.ops.status import collect

    settings = settings_of(ctx)
    view = collect(settings, bootstrap.status_sources(settings))
    if as_json:
        out.print_json(json.dumps(view.__dict__, default=str))
    else:
        out.print(_table("billing periods", view.periods))
        out.print(_table("open holds (invoicing blocked)", view.holds))
        if view.drafts:
            out.print(_table("drafts (in their grace period: no number, no email)", view.drafts))
        out.print(
            _table("late usage (not in the issued invoice; next replay --apply)", view.late_usage)
        )
        if view.late_metered:
            out.print(
                _table(
                    "late metered usage (read after the issued revision's close; next replay "
                    "--apply)",
                    view.late_metered,
                )
            )
        out.print(_table("partition fences", view.fences))
        lag = Table(title="pipeline")
        lag.add_column("what")
        lag.add_column("value")
        for group, value in view.lag.items():
            lag.add_row(f"lag of group {group}", str(value))
        lag.add_row("dead-letter records", str(view.dead_letters))
        lag.add_row("dead-lettered invoice events (email)", str(view.invoice_dead_letters))
        lag.add_row(
            "outbox rows (oldest)", f"{view.outbox.get('rows')} ({view.outbox.get('oldest')})"
        )
        lag.add_row("outbox connector", view.connector)
        out.print(lag)
        for problem in view.problems:
            console.print(f"[yellow]attention[/]: {problem}")
    if view.problems:
        raise typer.Exit(1)


@holds_app.command("list")
def holds_list(
    ctx: typer.Context,
    all_: Annotated[bool, typer.Option("--all", help="Include released holds.")] = False,
) -> None:
    """Holds with their reason and the source coordinates of the dead-lettered record."""
    from streams import bootstrap
    from streams.apps.ops.holds import list_holds

    with bootstrap.connection(settings_of(ctx), role="operator") as conn:
        rows = list_holds(conn, include_released=all_)
    out.print(_table("invoice holds", [r.__dict__ for r in rows]))


@holds_app.command("release")
def holds_release(
    ctx: typer.Context,
    hold_id: Annotated[int, typer.Argument(help="The hold to release (see `holds list`).")],
    note: Annotated[
        str, typer.Option("--note", help="Why it is safe to release (kept with the hold).")
    ],
) -> None:
    """Release a hold after the bad input was fixed, and re-close the periods it held."""
    from streams import bootstrap
    from streams.apps.ops.holds import HoldError, release_hold

    settings = settings_of(ctx)
    producer = bootstrap.producer(settings)
    who = f"{getpass.getuser()}@{socket.gethostname()}"
    with (
        bootstrap.connection(settings, role="admin") as conn,
        exit_on((HoldError, 2, None)),
    ):
        periods = release_hold(
            conn,
            producer,
            ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name,
            hold_id,
            released_by=who,
            note=note,
        )
    console.print(
        f"hold #{hold_id} released; re-closed: {', '.join(periods) or 'nothing (no held close)'}"
    )


@fences_app.command("list")
def fences_list(ctx: typer.Context) -> None:
    """Every fence row: group, topic, partition, generation, member, updated."""
    from streams import bootstrap
    from streams.apps.ops.fences import list_fences

    with bootstrap.connection(settings_of(ctx), role="operator") as conn:
        rows = list_fences(conn)
    out.print(_table("partition fences", rows))


@fences_app.command("reset")
def fences_reset(
    ctx: typer.Context,
    group_id: Annotated[str, typer.Argument(help="Consumer group whose fences to delete.")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Confirm: no member of the group is running.")
    ] = False,
) -> None:
    """Delete a group's fence rows: after the group was deleted or its offsets expired
    (its generation restarted from the bottom and every claim is refused). Stop every
    member first; the next members claim afresh."""
    from streams import bootstrap
    from streams.core.billing.fencing import reset_group

    if not yes:
        console.print("refusing without --yes: stop every member of the group first")
        raise typer.Exit(2)
    with bootstrap.connection(settings_of(ctx), role="admin", autocommit=False) as conn:
        deleted = reset_group(conn, group_id)
    console.print(f"deleted {deleted} fence row(s) of group {group_id}")


@outbox_app.command("prune")
def outbox_prune(
    ctx: typer.Context,
    older_than_days: Annotated[
        int,
        typer.Option(
            "--older-than-days",
            min=OUTBOX_PRUNE_FLOOR_DAYS,
            help=f"Retention in days (at least {OUTBOX_PRUNE_FLOOR_DAYS}).",
        ),
    ] = 30,
) -> None:
    """Delete outbox rows older than the retention (Debezium's EventRouter ignores deletes).

    Runs as the admin role, which has no DELETE on the outbox: it calls the owner's
    function prune_outbox() (migration 0006), which refuses a retention under the floor."""
    from streams import bootstrap
    from streams.apps.ops.reconcile import prune_outbox

    with bootstrap.connection(settings_of(ctx), role="admin") as conn:
        deleted = prune_outbox(conn, timedelta(days=older_than_days))
    console.print(f"deleted {deleted} outbox row(s) older than {older_than_days} days")


def reconcile_command(
    ctx: typer.Context,
    republish: Annotated[
        bool, typer.Option("--republish", help="Write a new outbox row per missing document.")
    ] = False,
    email_grace_minutes: Annotated[
        int,
        typer.Option(
            "--email-grace-minutes",
            min=0,
            help="Report an invoice as not emailed only once it is this many minutes old.",
        ),
    ] = 10,
    focus: Annotated[
        Path | None,
        typer.Option(
            "--focus",
            help="Instead: compare every pass-through invoice with this FOCUS file's exact "
            "BilledCost sums per (account, month).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Issued invoices/credit notes whose event never reached billing.invoices.v1, and invoices
    never emailed; --republish sends them again (deduplicated downstream by document). Exit 1 if any.

    With --focus FILE: per (account, month) of the FOCUS file, the exact sum of BilledCost, that
    sum rounded once (half-even), the invoice subtotal, and match / mismatch / missing /
    unexpected (a pass-through invoice of the file's months that the file does not have).
    Exit 1 on anything but a match, 2 when the file cannot be read.
    """
    from streams import bootstrap

    settings = settings_of(ctx)
    if focus is not None:
        if republish:
            console.print("--republish does not apply to --focus")
            raise typer.Exit(2)
        _reconcile_focus(settings, focus, as_json=as_json)
        return
    from streams.apps.ops.reconcile import reconcile

    # The report only reads (operator); republishing writes outbox rows (admin).
    with bootstrap.connection(settings, role="admin" if republish else "operator") as conn:
        report = reconcile(
            conn,
            lambda: bootstrap.topic_reader(settings),
            INVOICES.with_prefix(settings.kafka.topic_prefix).name,
            republish=republish,
            email_grace=timedelta(minutes=email_grace_minutes),
        )
    if as_json:
        out.print_json(json.dumps(report.__dict__))
    else:
        out.print(f"documents: {report.documents}, events on the topic: {report.events_on_topic}")
        out.print(
            _table(
                "documents without an event on the topic",
                [{"type": t, "document": d, "number": n} for t, d, n in report.missing_events],
            )
        )
        out.print(
            _table(
                "invoices never emailed",
                [{"invoice": i, "number": n} for i, n in report.emails_not_sent],
            )
        )
        if republish:
            out.print(
                f"republished: {len(report.republished)}; "
                f"not republishable: {report.not_republishable}"
            )
    if report.missing_events or report.emails_not_sent:
        raise typer.Exit(1)


def _reconcile_focus(settings: Settings, path: Path, *, as_json: bool) -> None:
    """``reconcile --focus FILE`` (:mod:`streams.apps.ops.focus_reconcile`)."""
    from streams import bootstrap
    from streams.apps.ops.focus_expected import expected_from_file
    from streams.apps.ops.focus_reconcile import reconcile_focus

    try:
        expected = expected_from_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        console.print(f"cannot read {path}: {exc}")
        raise typer.Exit(2) from None
    with bootstrap.connection(settings, role="operator") as conn:
        report = reconcile_focus(conn, expected, path=str(path))
    if as_json:
        out.print_json(json.dumps(report.to_dict()))
    else:
        out.print(
            f"{path}: {report.rows} rows, {len(expected.sums)} (account, month) pairs; "
            "round(Σ BilledCost) vs the current invoice's subtotal",
            markup=False,
            highlight=False,
        )
        head = (
            f"{'month':<8} {'Σ BilledCost (exact)':>22} {'rounded':>10} {'subtotal':>10} "
            f"{'verdict':<10} customer"
        )
        out.print(head, markup=False, soft_wrap=True, highlight=False)
        for pair in report.pairs:
            exact = "-" if pair.exact is None else f"{pair.exact:f}"
            rounded = "-" if pair.rounded is None else str(pair.rounded)
            subtotal = "(none)" if pair.subtotal is None else str(pair.subtotal)
            verdict = pair.verdict + (f" ({pair.note})" if pair.note else "")
            line = (
                f"{pair.period:<8} {exact:>22} {rounded:>10} {subtotal:>10} "
                f"{verdict:<10} {pair.customer_id}"
            )
            out.print(line, markup=False, soft_wrap=True, highlight=False)
        counts = report.counts()
        out.print(
            ", ".join(f"{count} {verdict}" for verdict, count in counts.items())
            + f"; {len(report.unreadable)} file row(s) not reconcilable",
            markup=False,
            highlight=False,
        )
        for line_no, reason in report.unreadable[:20]:
            console.print(f"[yellow]file line {line_no}[/]: {reason}")
    if not report.ok:
        raise typer.Exit(1)


def explain_command(
    ctx: typer.Context,
    document: Annotated[str, typer.Argument(help="Invoice revision or credit note: id or number.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Where a document came from: per line the event and its topic/partition/offset, the
    fence token and member that wrote it, the close request's lease token, the tax
    document, the outbox rows, the emails (Message-ID, status), what supersedes it, and its
    void (reason, who, when).

    Exit 1 when no document has that id or number.
    """
    import psycopg

    from streams import bootstrap
    from streams.apps.ops.explain import NotFound, explain

    settings = settings_of(ctx)
    with (
        exit_on((NotFound, 1, None), (psycopg.OperationalError, 2, "database unavailable")),
        bootstrap.connection(settings, role="operator", connect_timeout_s=5) as conn,
    ):
        lineage = explain(conn, document)
    if as_json:
        out.print_json(json.dumps(lineage.as_json()))
        return
    data = lineage.as_json()
    out.print(_table(f"{lineage.kind.replace('_', ' ')}", [data["document"]]))
    if data["written_by"]:
        written = dict(data["written_by"])
        marker = written.pop("close_marker")
        offsets = written.pop("usage_offsets")
        written["close_marker"] = f"{marker['topic']}[{marker['partition']}]@{marker['offset']}"
        written["usage_offsets"] = f"{offsets['first']}..{offsets['last']}"
        out.print(_table("written by", [written]))
    if lineage.kind == "invoice":
        out.print(_table("close request", [data["close_request"]] if data["close_request"] else []))
        out.print(_table("tax document", [data["tax_document"]]))
        out.print(_table("lines (event and source coordinates)", data["lines"]))
        if data["charges"]:
            out.print(_table("rated charges", data["charges"]))
    out.print(_table("outbox rows", data["outbox"]))
    out.print(_table("emails", data["emails"]))
    out.print(_table("supersedes", data["supersedes"]))
    if lineage.kind == "invoice":
        out.print(_table("superseded by", data["superseded_by"]))
        if data["void"]:
            out.print(_table("voided", [data["void"]]))
    for note in lineage.notes:
        out.print(f"note: {note}")
