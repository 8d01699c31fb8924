"""``invoicing stack …``: the local stack (install, start, stop, status, logs)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from streams.entrypoints.common import console, exit_on, out, settings_of

if TYPE_CHECKING:
    from streams.devtools.stack.manager import Stack

app = typer.Typer(
    help="The local stack (Kafka, Connect+Debezium, PostgreSQL, Redis, SMTP sink, tax).",
    no_args_is_help=True,
)


def _report(message: str) -> None:
    console.print(f"[cyan]stack[/]: {message}")


@app.command("up")
def stack_up(
    ctx: typer.Context,
    provision: bool = typer.Option(
        True,
        "--provision/--no-provision",
        help="Provision after the start: roles, migrations, topics, connector "
        "(--no-provision: start the services only).",
    ),
    profile: str = typer.Option(
        "plain",
        "--profile",
        help="plain (default) or tls: TLS listeners only (Kafka SASL_SSL/SCRAM-SHA-512, "
        "PostgreSQL verify-full, Redis tls-port and an ACL user, SMTP STARTTLS and AUTH), "
        "certificates made per run; clients `source .local/conf/tls/tls.env`. "
        "Switching profiles needs `stack down --wipe`.",
    ),
) -> None:
    """Install what is missing, start every service, wait until healthy, provision. Idempotent."""
    from streams.devtools.stack.errors import StackError
    from streams.devtools.stack.manager import Stack

    if profile not in ("plain", "tls"):
        console.print(f"[red]unknown profile {profile!r}[/]: plain or tls")
        raise typer.Exit(2)
    settings = settings_of(ctx)
    if profile == "tls":
        from streams.devtools.stack.tls import tls_settings

        running = Stack(settings).supervisor.running()
        settings, env_file = tls_settings(settings, fresh=not running)
        _report(f"TLS profile: clients `source {env_file}`")
    stack = Stack(settings, report=_report)
    with exit_on((StackError, 1, "stack up failed")):
        result = stack.up(provision=provision)
    if result.started:
        console.print(f"[green]started[/]: {', '.join(result.started)}")
    else:
        console.print("[green]already up[/]: nothing started")
    print_status(stack)


@app.command("down")
def stack_down(
    ctx: typer.Context,
    wipe: bool = typer.Option(
        False, "--wipe", help="Also delete the services' data under .local/data."
    ),
) -> None:
    """Stop the processes the stack started; keep data unless --wipe."""
    from streams.devtools.stack.manager import Stack

    stack = Stack(settings_of(ctx), report=_report)
    stopped = stack.down(wipe=wipe)
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@app.command("status")
def stack_status(ctx: typer.Context) -> None:
    """Each service with port, pid, state and health. Exit 1 if any is unhealthy."""
    from streams.devtools.stack.manager import Stack

    if not print_status(Stack(settings_of(ctx))):
        raise typer.Exit(1)


def print_status(stack: Stack) -> bool:
    """The services' table on stdout; whether every service is healthy."""
    rows = stack.status()
    table = Table(title="invoicing local stack")
    for col in ("service", "port", "pid", "state", "health", "log"):
        table.add_column(col)
    for row in rows:
        health = str(row["health"])
        style = "green" if health == "ok" else "red"
        table.add_row(
            str(row["service"]),
            str(row["port"]),
            str(row["pid"] or "-"),
            str(row["state"]),
            f"[{style}]{health}[/]",
            str(row["log"]),
        )
    out.print(table)
    return all(r["health"] == "ok" for r in rows)


@app.command("logs")
def stack_logs(
    ctx: typer.Context,
    service: str = typer.Argument(
        "supervisord", help="postgres, redis, kafka, connect, smtp, tax or supervisord"
    ),
    lines: int = typer.Option(100, "-n", help="How many last lines."),
) -> None:
    """Print the last lines of a service's log."""
    from collections import deque

    from streams.devtools.stack.errors import StackError
    from streams.devtools.stack.manager import Stack

    with exit_on((StackError, 2, None)):
        path = Stack(settings_of(ctx)).log_path(service)
    if not path.exists():
        console.print(f"no log yet at {path}")
        raise typer.Exit(1)
    with path.open(errors="replace") as fh:
        sys.stdout.writelines(deque(fh, maxlen=lines))


@app.command("fetch")
def stack_fetch(ctx: typer.Context) -> None:
    """Fetch the Java artifacts (Kafka, Connect, Debezium) from Maven Central if not yet done."""
    from streams.devtools.stack.manager import Stack

    ran = Stack(settings_of(ctx), report=lambda m: console.print(m)).fetch()
    console.print("fetched" if ran else "already fetched: nothing to do")
