"""``invoicing db …``: the database schema."""

from __future__ import annotations

import typer

from streams.entrypoints.common import console, out, settings_of

app = typer.Typer(help="Database schema.", no_args_is_help=True)


@app.command("migrate")
def db_migrate(ctx: typer.Context) -> None:
    """Apply database migrations up to head as the owner, converge the grants on
    streams/adapters/postgres/grants.py, and create Debezium's publication (all idempotent)."""
    from streams.adapters.postgres import migrate, provision

    settings = settings_of(ctx)
    migrate.upgrade(settings.postgres)
    provision.provision_publication(settings.postgres)
    console.print(f"database at revision {migrate.current_revision(settings.postgres)}")


@app.command("provision")
def db_provision(ctx: typer.Context) -> None:
    """Create (or reset) the roles and the database, as a superuser reached through libpq's
    own environment (PGHOST, PGPORT, PGUSER, PGPASSWORD, or a service file): what a DBA runs
    once per cluster. `invoicing stack up` does it over the local stack's socket."""
    import psycopg

    from streams.adapters.postgres import provision

    settings = settings_of(ctx)
    with psycopg.connect("", dbname="postgres", autocommit=True) as conn:
        provision.provision_roles(conn, settings.postgres)
    console.print(f"roles and database {settings.postgres.database} provisioned")


@app.command("roles")
def db_roles(
    markdown: bool = typer.Option(
        False, "--markdown", help="Print the markdown table of docs/roles.md."
    ),
) -> None:
    """The role-by-table privilege matrix (streams/adapters/postgres/grants.py): S select, I insert,
    U update, D delete; column lists in parentheses."""
    from streams.adapters.postgres import grants

    if markdown:
        print(grants.markdown_matrix(), end="")
        return
    for table, entry in grants.TABLES.items():
        out.print(f"[bold]{table}[/]")
        if not entry:
            out.print("  (owner only)")
        for key, privileges in entry.items():
            role = next(r.name for r in grants.PRIVILEGE_ROLES if r.key == key)
            granted = "; ".join(
                name if cols == grants.ALL else f"{name} ({', '.join(cols)})"
                for name, cols in privileges.items()
            )
            out.print(f"  {role:<20} {granted}", highlight=False)
    for sequence, keys in grants.SEQUENCES.items():
        out.print(f"[bold]sequence {sequence}[/]: USAGE to {', '.join(keys)}")
    for function, keys in grants.FUNCTIONS.items():
        out.print(f"[bold]function {function}[/]: EXECUTE to {', '.join(keys) or 'nobody'}")
    out.print()
    for r in grants.PRIVILEGE_ROLES:
        out.print(f"{r.name} (login postgres.{r.login}): {r.runs}", highlight=False)
