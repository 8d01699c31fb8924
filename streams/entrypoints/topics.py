"""``invoicing topics …``: the Kafka topics of the registry (:mod:`streams.topics`)."""

from __future__ import annotations

import typer
from rich.table import Table

from streams.entrypoints.common import console, out, settings_of

app = typer.Typer(help="Kafka topics of the registry.", no_args_is_help=True)


@app.command("create")
def topics_create(ctx: typer.Context) -> None:
    """Create the registry's topics that do not exist (idempotent)."""
    from streams.adapters.kafka import ensure_topics

    created = ensure_topics(settings_of(ctx).kafka)
    console.print(f"created: {', '.join(created)}" if created else "all topics exist")


@app.command("list")
def topics_list(ctx: typer.Context) -> None:
    """The registry: name, partitions, key, cleanup policy, retention."""
    from streams.adapters.kafka import topic_specs

    table = Table(title="topics")
    for col in ("name", "partitions", "key", "cleanup", "retention.ms", "description"):
        table.add_column(col)
    for spec in topic_specs(settings_of(ctx).kafka):
        table.add_row(
            spec.name,
            str(spec.partitions),
            spec.key,
            spec.cleanup_policy,
            str(spec.retention_ms),
            spec.description,
        )
    out.print(table)
