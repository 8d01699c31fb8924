"""``invoicing usage``, ``invoicing api-keys …`` and the ``worker usage-view`` / ``worker ingest``
processes (docs/usage-api.md): arguments, printing, exit codes.

The logic lives in :mod:`streams.apps.usage_view` and :mod:`streams.apps.ingest`; the clients
are built by :mod:`streams.bootstrap`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from streams.entrypoints.common import (
    configure_logging,
    console,
    out,
    refuse_below_profile,
    settings_of,
)

api_keys_app = typer.Typer(
    help="API keys of the HTTP ingest edge (stored hashed, SHA-256).", no_args_is_help=True
)

PortOption = typer.Option(None, "--port", help="Web port of this instance (default: settings).")
LogLevelOption = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR.")
PriceBookOption = typer.Option(
    None,
    "--price-book",
    help="Price book YAML to rate under, reloaded when it changes "
    "(default: INVOICING_VIEW__PRICE_BOOK; none: the published book, read from billing.price-book.v1).",
    exists=True,
    dir_okay=False,
)


def usage_view_worker(
    ctx: typer.Context,
    port: int | None = PortOption,
    price_book: Path | None = PriceBookOption,
    log_level: str = LogLevelOption,
) -> None:
    """Usage to date and the upcoming invoice per customer: a faust-streaming app (group
    settings.view.group) serving GET /v1/customers/{id}/usage and /metrics on --port."""
    from streams.bootstrap import run_usage_view
    from streams.core.domain.rating import PriceBookError

    configure_logging(log_level)
    settings = settings_of(ctx)
    try:
        with refuse_below_profile():
            run_usage_view(settings, port=port, price_book=price_book, loglevel=log_level)
    except PriceBookError as exc:
        console.print(f"[red]price book refused[/]: {exc}")
        raise typer.Exit(2) from exc


def ingest_worker(
    ctx: typer.Context, port: int | None = PortOption, log_level: str = LogLevelOption
) -> None:
    """The HTTP ingest edge: POST /v1/events (CloudEvents, structured JSON, one or a batch)
    → billing.account-events.v1, answered after the broker confirmed delivery."""
    from streams.bootstrap import run_ingest_edge

    configure_logging(log_level)
    with refuse_below_profile():
        run_ingest_edge(settings_of(ctx), port=port)


def usage_command(
    ctx: typer.Context,
    customer: str = typer.Argument(..., help="Customer id (as in the events; '/' allowed)."),
    period: str | None = typer.Option(
        None, "--period", help="YYYY-MM (default: the current month)."
    ),
    url: str | None = typer.Option(
        None, "--url", help="A view instance (default: settings.view.url)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the API's JSON answer."),
) -> None:
    """Usage to date and the upcoming invoice of CUSTOMER, from the usage view's API.
    Exit 1 when the customer is unknown, 2 for a bad period or an unreachable view."""
    import httpx  # here, not at import: every other command starts without it

    from streams.apps.usage_view.app import usage_path
    from streams.bootstrap import usage_client

    settings = settings_of(ctx)
    try:
        with usage_client(settings, url=url) as client:
            response = client.get(usage_path(customer, period))
    except httpx.HTTPError as exc:
        console.print(f"[red]usage view unreachable[/] at {url or settings.view.url}: {exc}")
        raise typer.Exit(2) from exc
    body: dict[str, Any] = response.json()
    if response.status_code != 200:
        console.print(
            f"[red]{body.get('title', response.status_code)}[/]: {body.get('detail', '')}"
        )
        raise typer.Exit(1 if response.status_code == 404 else 2)
    if as_json:
        out.print_json(json.dumps(body))
        return
    _print_usage(body)


def _print_usage(body: dict[str, Any]) -> None:
    invoice = body["upcoming_invoice"]
    usage = body["usage"]
    closed = body.get("closed")
    title = (
        f"{body['customer_id']} · {body['period']} · "
        + (f"closed {closed['closed_at']}" if closed else "open")
        + " · provisional, before tax"
    )
    summary = Table(title=title, show_header=False)
    summary.add_column("what")
    summary.add_column("value", justify="right")
    pass_through = usage["pass_through"]
    summary.add_row("pass-through lines", str(pass_through["lines"]))
    for currency, amount in pass_through["amounts"].items():
        summary.add_row(f"pass-through ({currency})", amount)
    counted: set[str] = set()
    for metric in usage["metered"]:
        group = metric.get("group")
        name = metric["metric"] + (f" [{group}]" if group else "")
        # a metric that groups has a row per group value, each with the metric's events:
        # the count is shown once, on its first row
        if metric["metric"] not in counted:
            counted.add(metric["metric"])
            name += f" ({metric['events']} events{', all groups' if group else ''})"
        summary.add_row(name, metric["quantity"])
    late = usage["late"]
    if late["pass_through_lines"] or late["metered_events"]:
        summary.add_row(
            "late (after the close)",
            f"{late['pass_through_lines']} lines, {late['metered_events']} metered",
        )
    subtotal = invoice["subtotal"]
    summary.add_row(
        f"subtotal ({invoice['currency']})",
        subtotal if subtotal is not None else f"held (preview {invoice['rounded_total']})",
    )
    summary.add_row("price book", invoice["price_book"])
    summary.add_row("served by", f"{body['served_by']} (partition {body['partition']})")
    out.print(summary)
    charges = [line for line in invoice["lines"] if line["kind"] == "charge"]
    if charges:
        lines = Table(title="charges")
        for column in ("plan", "charge", "metric", "quantity", "amount"):
            lines.add_column(
                column, justify="right" if column in ("quantity", "amount") else "left"
            )
        for line in charges:
            lines.add_row(
                f"{line['plan_code']} v{line['plan_version']}",
                line["charge_code"] or "",
                (line["metric"] or "") + (f" [{line['group']}]" if line.get("group") else ""),
                line["quantity"] or "",
                line["amount"],
            )
        out.print(lines)
    for hold in invoice["holds"]:
        out.print(f"[yellow]hold {hold['code']}[/]: {hold['message']}")


def _csv(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(v.strip() for v in value.split(",") if v.strip())


_SCOPE_OPTION = typer.Option(
    None,
    "--scope",
    help="What the key may do, repeatable: ingest (POST /v1/events, the default), "
    "usage:read (the usage view's API; --customers/--customer-prefix limit what it reads).",
)


@api_keys_app.command("create")
def api_keys_create(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="Who the key is for (shown in list)."),
    types: str | None = typer.Option(
        None, "--types", help="Event types it may send, comma-separated (default: all)."
    ),
    customers: str | None = typer.Option(
        None, "--customers", help="Customer ids it may send for, comma-separated (default: all)."
    ),
    customer_prefix: str | None = typer.Option(
        None, "--customer-prefix", help="Or: the customer id prefix it may send for (e.g. eu-)."
    ),
    sources: str | None = typer.Option(
        None, "--sources", help="CloudEvents sources it may send, comma-separated (default: all)."
    ),
    rate_limit: str | None = typer.Option(
        None, "--rate-limit", help="Requests per window, e.g. 100/second (default: settings)."
    ),
    scope: list[str] | None = _SCOPE_OPTION,
) -> None:
    """Create a key with scopes (what it may do) and restrictions: prints it once (only its
    SHA-256 is stored). Exit 2 for an unknown scope or a restriction that cannot be stored."""
    from streams.apps.ingest.edge import ACCEPTED_TYPES
    from streams.apps.ingest.keys import SCOPE_INGEST, InvalidScope
    from streams.bootstrap import api_key_store

    scopes = tuple(scope or [SCOPE_INGEST])
    event_types = _csv(types)
    unknown = [t for t in event_types or () if t not in ACCEPTED_TYPES]
    if unknown:
        console.print(f"[red]not an event type the edge takes: {', '.join(unknown)}[/]")
        raise typer.Exit(2)
    store = api_key_store(settings_of(ctx))
    try:
        key_id, secret = store.create(
            name,
            scopes=scopes,
            event_types=event_types,
            customers=_csv(customers),
            customer_prefix=customer_prefix,
            sources=_csv(sources),
            rate_limit=rate_limit,
        )
    except InvalidScope as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    console.print(
        f"created key {key_id} for {name!r} ({', '.join(scopes)}) in {store.path};"
        " it is shown only now:"
    )
    out.print(secret, markup=False, highlight=False)


@api_keys_app.command("revoke")
def api_keys_revoke(ctx: typer.Context, key_id: str = typer.Argument(...)) -> None:
    """Revoke a key by its id (the edge refuses it from its next request)."""
    from streams.apps.ingest.keys import UnknownKey
    from streams.bootstrap import api_key_store

    store = api_key_store(settings_of(ctx))
    try:
        store.revoke(key_id)
    except UnknownKey as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    console.print(f"revoked {key_id}")


@api_keys_app.command("rotate")
def api_keys_rotate(ctx: typer.Context, key_id: str = typer.Argument(...)) -> None:
    """Replace a key by a new one with its name and scope; the old one is revoked at once
    (prints the new key once)."""
    from streams.apps.ingest.keys import UnknownKey
    from streams.bootstrap import api_key_store

    store = api_key_store(settings_of(ctx))
    try:
        new_id, secret = store.rotate(key_id)
    except UnknownKey as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from exc
    console.print(f"rotated {key_id} to {new_id} ({key_id} is revoked); it is shown only now:")
    out.print(secret, markup=False, highlight=False)


@api_keys_app.command("list")
def api_keys_list(ctx: typer.Context) -> None:
    """Keys with their id, name, scopes, restrictions, creation and revocation (never the
    key)."""
    from streams.bootstrap import api_key_store

    table = Table("id", "name", "scopes", "restrictions", "created", "revoked", "rotated from")
    for key in api_key_store(settings_of(ctx)).list():
        table.add_row(
            key.key_id,
            key.name,
            " ".join(key.scopes),
            key.scope_text(),
            key.created_at,
            key.revoked_at or "",
            key.rotated_from or "",
        )
    out.print(table)
