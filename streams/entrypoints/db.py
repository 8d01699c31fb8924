"""``invoicing db …``: the database schema."""

from __future__ import annotations

import typer

from streams.entrypoints.common import console, settings_of

app = typer.Typer(help="Database schema.", no_args_is_help=True)


@app.command("migrate")
def db_migrate(ctx: typer.Context) -> None:
    """Apply database migrations up to head (idempotent)."""
    from streams.adapters import migrate

    settings = settings_of(ctx)
    migrate.upgrade(settings.postgres)
    console.print(f"database at revision {migrate.current_revision(settings.postgres)}")
