"""``invoicing plans validate|publish|list``: the price book (:mod:`streams.apps.importers.price_book`).

Exit codes: ``validate`` 0 valid, 1 invalid (every error printed with its path and
line), 2 unreadable file. ``publish`` 0 published (new and unchanged entries
listed), 1 invalid file or a database error (nothing written), 2 unreadable
file, 3 refused — an entry is already published with other content (published
versions are immutable; nothing written), 4 stored but not every record reached
the topic (run it again). ``list`` 0.
"""

from __future__ import annotations

import getpass
import json
import socket
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from streams.entrypoints.common import console, exit_on, out, settings_of

app = typer.Typer(
    help="The price book: validate a file, publish its versions, list what is published.",
    no_args_is_help=True,
)


def _print_book_errors(exc: Exception) -> None:
    from streams.core.domain.rating import PriceBookError

    if isinstance(exc, PriceBookError):
        console.print(f"[red]{exc.source}: {len(exc.issues)} error(s)[/]")
        for issue in exc.issues:
            console.print(f"  {issue}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"[red]{exc}[/]")


@app.command("validate")
def validate_command(
    path: Annotated[Path, typer.Argument(help="Price book YAML file.")],
) -> None:
    """Check a price book file: every error with its path (and line) in the file."""
    from streams.apps.importers import SourceUnreadable
    from streams.apps.importers.price_book import validate_file
    from streams.core.domain.rating import PriceBookError

    try:
        book = validate_file(path)
    except SourceUnreadable as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    except PriceBookError as exc:
        _print_book_errors(exc)
        raise typer.Exit(1) from exc
    versions = sum(len(plan.versions) for plan in book.plans)
    console.print(
        f"[green]{path}: valid[/]: {len(book.metrics)} metric(s), {len(book.plans)} plan(s), "
        f"{versions} version(s)"
    )


@app.command("publish")
def publish_command(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Price book YAML file.")],
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """Store the file's metrics and plan versions in PostgreSQL and publish them on the
    compacted topic billing.price-book.v1. Entries already published with the same
    content are unchanged; with other content the whole publication is refused."""
    import psycopg

    from streams import bootstrap
    from streams.apps.importers import SourceUnreadable
    from streams.apps.importers.price_book import DeliveryIncomplete, PublicationRefused
    from streams.core.domain.rating import PriceBookError

    settings = settings_of(ctx)
    try:
        with exit_on(
            (SourceUnreadable, 2, "cannot publish"),
            (PublicationRefused, 3, "refused"),
            (DeliveryIncomplete, 4, "incomplete"),
            (psycopg.Error, 1, "database"),
        ):
            summary = bootstrap.run_publish_price_book(
                path, settings, published_by=f"{getpass.getuser()}@{socket.gethostname()}"
            )
    except PriceBookError as exc:
        _print_book_errors(exc)
        raise typer.Exit(1) from exc
    console.print(
        f"[green]published[/] {path} → {summary.topic}: {len(summary.new)} new, "
        f"{len(summary.unchanged)} unchanged; the book in force has {summary.metrics} "
        f"metric(s) and {summary.plan_versions} plan version(s); {summary.delivered} "
        "record(s) delivered"
    )
    for key in summary.new:
        console.print(f"  new        {key}")
    for key in summary.unchanged:
        console.print(f"  unchanged  {key}")
    if json_out:
        out.print_json(json.dumps(summary.to_dict()))


@app.command("list")
def list_command(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The published entries (PostgreSQL): metrics and plan versions."""
    from streams import bootstrap
    from streams.core.billing import store
    from streams.core.domain.events import PlanVersionPublished

    with bootstrap.connection(settings_of(ctx), role="operator") as conn:
        entries = store.pricing.published_entries(conn)
    rows = [
        {
            "key": entry.record_key(),
            "effective_from": entry.effective_from.isoformat()
            if isinstance(entry, PlanVersionPublished)
            else "",
            "currency": entry.currency if isinstance(entry, PlanVersionPublished) else "",
            "sha256": entry.content_sha256[:12],
            "published_at": entry.published_at.isoformat(),
        }
        for entry in entries
    ]
    if json_out:
        out.print_json(json.dumps(rows))
        return
    if not rows:
        out.print("published price book: empty (invoicing plans publish FILE)")
        return
    table = Table(title="published price book")
    for column in rows[0]:
        table.add_column(column)
    for row in rows:
        table.add_row(*row.values())
    out.print(table)
