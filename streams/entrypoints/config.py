"""``invoicing config …``: the effective configuration (``show``) and the generated
reference ``docs/configuration.md`` (``reference``).

``show`` exits 0; ``reference --check`` exits 1 when the page is out of date.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from streams.entrypoints.common import console, out, settings_of

app = typer.Typer(help="The settings: effective values and the reference.", no_args_is_help=True)


@app.command("show")
def config_show(
    ctx: typer.Context,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of the table.")
    ] = False,
) -> None:
    """Print every setting this environment gives a process: key, environment variable,
    value (passwords, keys and tokens masked as ***) and whether the environment set it
    (a login's user name counts as set when its password is). See docs/configuration.md."""
    from streams.apps.ops.config import effective

    rows = effective(settings_of(ctx))
    if json_out:
        out.print_json(
            json.dumps(
                [
                    {
                        "key": r.key,
                        "env": r.env,
                        "value": r.value,
                        "secret": r.secret,
                        "given": r.given,
                    }
                    for r in rows
                ]
            )
        )
        return
    table = Table(title="effective configuration (variables: --json or docs/configuration.md)")
    for col in ("key", "value", "given"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r.key, r.value, "env" if r.given else "")
    out.print(table)


@app.command("reference")
def config_reference(
    check: Annotated[
        bool,
        typer.Option("--check", help="Write nothing; exit 1 when the page is out of date."),
    ] = False,
    root: Annotated[
        Path, typer.Option("--root", help="Project root holding docs/ (default: current folder).")
    ] = Path("."),
) -> None:
    """Write docs/configuration.md from the settings' fields (every key, its environment
    variable, type, default and meaning)."""
    from streams.devtools.configref import PAGE, is_current, write

    if check:
        if not is_current(root):
            console.print(f"[red]{PAGE} is out of date[/]: run invoicing config reference")
            raise typer.Exit(1)
        console.print(f"{PAGE} is current")
        return
    console.print(f"wrote {write(root)}")
