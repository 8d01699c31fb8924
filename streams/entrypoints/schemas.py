"""``invoicing schemas``: export the contracts, check them for staleness and compatibility.

Also runnable without the console script: ``python -m streams.entrypoints.schemas check-compat``.

Exit codes of ``check-compat``: 0 compatible (or nothing to compare), 1 a breaking
change (each printed as ``<topic> <message>: field '<path>': <why>``), 2 the base
cannot be read (unknown ref, a shallow clone, not a git repository with --base, a
file that does not parse).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from streams.entrypoints.common import exit_on

app = typer.Typer(
    help="Topic contracts: JSON Schema + AsyncAPI in schemas/ (generated from the event models).",
    no_args_is_help=True,
)

console = Console(stderr=True, highlight=False)

FolderOption = Annotated[
    Path, typer.Option("--dir", help="The schemas folder (relative to the current directory).")
]


@app.command("export")
def export(folder: FolderOption = Path("schemas")) -> None:
    """Write the JSON Schema files and asyncapi.yaml rendered from the models."""
    from streams.devtools.schemas.render import write_schemas

    written = write_schemas(folder)
    for relative in written:
        console.print(f"wrote {folder / relative}")
    if not written:
        console.print(f"{folder} is up to date")


@app.command("check")
def check(folder: FolderOption = Path("schemas")) -> None:
    """Exit 1 when the committed files differ from what the models render."""
    from streams.devtools.schemas.render import stale_schemas

    stale = stale_schemas(folder)
    for relative in stale:
        console.print(f"[red]stale[/]: {folder / relative}")
    if stale:
        console.print("run `invoicing schemas export` and commit the result")
        raise typer.Exit(1)
    console.print(f"{folder} is up to date")


@app.command("check-compat")
def check_compat_command(
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="Git ref to compare against (default: every committed version of the "
            "schemas folder; a shallow clone is refused).",
        ),
    ] = None,
    folder: FolderOption = Path("schemas"),
    allow_shallow: Annotated[
        bool,
        typer.Option(
            "--allow-shallow",
            help="In a shallow clone, compare against the commits it has instead of "
            "refusing (weaker: a breaking change older than the clone depth passes).",
        ),
    ] = False,
    propose_exceptions: Annotated[
        bool,
        typer.Option(
            "--propose-exceptions",
            help="Print the `accept` block of schemas/compat-exceptions.yaml that would "
            "accept the narrowings found (a starting point: an exception needs a reason "
            "and a verification, see docs/subscribing.md).",
        ),
    ] = False,
) -> None:
    """Refuse schema changes that would break existing consumers of a topic version.

    Adding optional fields, event types and topics is accepted; anything else needs
    a new topic version (<name>.v2), or a documented exception in
    schemas/compat-exceptions.yaml. The rules: streams/devtools/schemas/compat/.
    """
    from streams.devtools.schemas.compat import BaseUnavailable, CompatError, check_compat

    with exit_on(
        (BaseUnavailable, 2, "cannot read the base"), (CompatError, 2, "cannot compare"), to=console
    ):
        report = check_compat(
            folder, base, allow_shallow=allow_shallow, exceptions=[] if propose_exceptions else None
        )
    if propose_exceptions:
        import yaml

        from streams.devtools.schemas.compat import propose_exceptions as propose

        print(yaml.safe_dump({"accept": propose(report.problems)}, sort_keys=True))
        return
    if report.base is None:
        console.print("schemas compat: no earlier commit to compare against; nothing to check")
        return
    against = (
        report.base
        if base is not None
        else f"{len(report.bases)} committed version(s), newest {report.base[:12]}"
    )
    by_exception: dict[str, int] = {}
    for _accepted, exception_id in report.accepted:
        by_exception[exception_id] = by_exception.get(exception_id, 0) + 1
    for exception_id, count in sorted(by_exception.items()):
        console.print(
            f"schemas compat: {count} narrowing(s) accepted by the documented exception "
            f"{exception_id!r} (schemas/compat-exceptions.yaml)"
        )
    for problem in report.problems:
        console.print(f"[red]breaking[/]: {problem}")
    if report.problems:
        console.print(
            f"schemas compat: {len(report.problems)} breaking change(s) against {against}. "
            "Ship them on a new topic version (<name>.vN+1) instead; see docs/subscribing.md."
        )
        raise typer.Exit(1)
    console.print(f"schemas compat: {report.compared} schema file(s) compatible with {against}")


if __name__ == "__main__":
    app()
