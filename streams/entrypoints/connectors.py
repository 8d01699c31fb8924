"""``invoicing connectors …``: the Debezium outbox connector in Kafka Connect."""

from __future__ import annotations

import json

import typer

from streams.entrypoints.common import console, out, settings_of

app = typer.Typer(help="Kafka Connect connectors (the Debezium outbox).", no_args_is_help=True)


@app.command("apply")
def connectors_apply(ctx: typer.Context) -> None:
    """Register (or update) the Debezium outbox connector; a no-op when unchanged."""
    from streams.adapters.connect import apply_outbox_connector

    settings = settings_of(ctx)
    changed = apply_outbox_connector(settings, settings.stack.home)
    console.print(
        "outbox connector registered/updated" if changed else "outbox connector unchanged"
    )


@app.command("status")
def connectors_status(ctx: typer.Context) -> None:
    """The outbox connector's state and its tasks' states, from Connect's REST API."""
    from streams import bootstrap

    status = bootstrap.outbox_connector_status(settings_of(ctx))
    out.print_json(json.dumps(status) if status else "null")
    if not status or status["connector"]["state"] != "RUNNING":
        raise typer.Exit(1)
