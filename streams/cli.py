"""The ``invoicing`` command (typer).

Sub-commands are grouped by what an operator does: ``stack`` (the local
stack), ``db``, ``topics``; the pipeline's own commands join as they land.
Settings are loaded once here and passed down.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from streams.drill.cli import drill_command
from streams.replay_cli import replay_command
from streams.schemas_cli import schemas_app
from streams.settings import Settings
from streams.worker_cli import worker_app

app = typer.Typer(
    help="Invoicing pipeline: usage events in, one invoice and one email out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
stack_app = typer.Typer(
    help="The local stack (Kafka, Connect+Debezium, PostgreSQL, Redis, SMTP sink, tax).",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
topics_app = typer.Typer(help="Kafka topics of the registry.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(db_app, name="db")
connectors_app = typer.Typer(
    help="Kafka Connect connectors (the Debezium outbox).", no_args_is_help=True
)
app.add_typer(topics_app, name="topics")
import_app = typer.Typer(help="Import usage into billing.account-events.v1.", no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(worker_app, name="worker")
app.add_typer(connectors_app, name="connectors")
app.command("drill")(drill_command)
app.command("replay")(replay_command)
app.add_typer(schemas_app, name="schemas")

console = Console(stderr=True)
out = Console()


def _settings() -> Settings:
    return Settings()


@stack_app.command("up")
def stack_up(
    no_provision: bool = typer.Option(
        False, help="Start services only; skip roles, migrations, topics, connector."
    ),
) -> None:
    """Install what is missing, start every service, wait until healthy, provision. Idempotent."""
    from streams.stack.errors import StackError
    from streams.stack.manager import Stack

    stack = Stack(_settings(), report=lambda m: console.print(f"[cyan]stack[/]: {m}"))
    try:
        result = stack.up(provision=not no_provision)
    except StackError as exc:
        console.print(f"[red]stack up failed[/]: {exc}")
        raise typer.Exit(1) from exc
    if result.started:
        console.print(f"[green]started[/]: {', '.join(result.started)}")
    else:
        console.print("[green]already up[/]: nothing started")
    _print_status(stack)


@stack_app.command("down")
def stack_down(
    wipe: bool = typer.Option(
        False, "--wipe", help="Also delete the services' data under .local/data."
    ),
) -> None:
    """Stop the processes the stack started; keep data unless --wipe."""
    from streams.stack.manager import Stack

    stack = Stack(_settings(), report=lambda m: console.print(f"[cyan]stack[/]: {m}"))
    stopped = stack.down(wipe=wipe)
    console.print(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@stack_app.command("status")
def stack_status() -> None:
    """Each service with port, pid, state and health. Exit 1 if any is unhealthy."""
    from streams.stack.manager import Stack

    stack = Stack(_settings())
    healthy = _print_status(stack)
    if not healthy:
        raise typer.Exit(1)


def _print_status(stack: object) -> bool:
    from streams.stack.manager import Stack

    assert isinstance(stack, Stack)
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


@stack_app.command("logs")
def stack_logs(
    service: str = typer.Argument(
        "supervisord", help="postgres, redis, kafka, connect, smtp, tax or supervisord"
    ),
    lines: int = typer.Option(100, "-n", help="How many last lines."),
) -> None:
    """Print the last lines of a service's log."""
    from collections import deque

    from streams.stack.errors import StackError
    from streams.stack.manager import Stack

    try:
        path = Stack(_settings()).log_path(service)
    except StackError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    if not path.exists():
        console.print(f"no log yet at {path}")
        raise typer.Exit(1)
    with path.open(errors="replace") as fh:
        sys.stdout.writelines(deque(fh, maxlen=lines))


@stack_app.command("fetch")
def stack_fetch() -> None:
    """Fetch the Java artifacts (Kafka, Connect, Debezium) from Maven Central if not yet done."""
    from streams.stack.manager import Stack

    ran = Stack(_settings(), report=lambda m: console.print(m)).fetch()
    console.print("fetched" if ran else "already fetched: nothing to do")


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply database migrations up to head (idempotent)."""
    from streams.adapters import migrate

    settings = _settings()
    migrate.upgrade(settings.postgres)
    console.print(f"database at revision {migrate.current_revision(settings.postgres)}")


@topics_app.command("create")
def topics_create() -> None:
    """Create the registry's topics that do not exist (idempotent)."""
    from streams.adapters.kafka import ensure_topics

    created = ensure_topics(_settings().kafka)
    console.print(f"created: {', '.join(created)}" if created else "all topics exist")


@connectors_app.command("apply")
def connectors_apply() -> None:
    """Register (or update) the Debezium outbox connector; a no-op when unchanged."""
    from streams.adapters.connect import apply_outbox_connector

    settings = _settings()
    changed = apply_outbox_connector(settings, settings.stack.home)
    console.print(
        "outbox connector registered/updated" if changed else "outbox connector unchanged"
    )


@connectors_app.command("status")
def connectors_status() -> None:
    """The outbox connector's state and its tasks' states, from Connect's REST API."""
    import json

    from streams.adapters.connect import connector_status

    status = connector_status(_settings())
    out.print_json(json.dumps(status) if status else "null")
    if not status or status["connector"]["state"] != "RUNNING":
        raise typer.Exit(1)


@topics_app.command("list")
def topics_list() -> None:
    """The registry: name, partitions, key, cleanup policy, retention."""
    from streams.adapters.kafka import topic_specs

    table = Table(title="topics")
    for col in ("name", "partitions", "key", "cleanup", "retention.ms", "description"):
        table.add_column(col)
    for spec in topic_specs(_settings().kafka):
        table.add_row(
            spec.name,
            str(spec.partitions),
            spec.key,
            spec.cleanup_policy,
            str(spec.retention_ms),
            spec.description,
        )
    out.print(table)


@import_app.command("focus")
def import_focus_command(
    path: Annotated[Path, typer.Argument(help="FOCUS 1.0 CSV file.")],
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    strict: bool = typer.Option(False, "--strict", help="Exit 3 when any row was skipped."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar."),
) -> None:
    """Produce customer.upserted + usage.recorded events from a FOCUS CSV.

    Exit 0: every mapped row delivered (skipped rows are printed); 1: a delivery
    failed or Kafka/the topic is unavailable; 2: the file cannot be imported;
    3: --strict and rows were skipped.
    """
    import json

    from streams.importers import ImporterError, SourceUnreadable
    from streams.importers.focus_import import import_focus, print_summary

    try:
        summary = import_focus(path, _settings(), progress=progress)
    except SourceUnreadable as exc:
        console.print(f"[red]cannot import[/]: {exc}")
        raise typer.Exit(2) from exc
    except ImporterError as exc:
        console.print(f"[red]import failed[/]: {exc}")
        raise typer.Exit(1) from exc
    print_summary(summary, console)
    if json_out:
        out.print_json(json.dumps(summary.to_dict()))
    if not summary.ok:
        raise typer.Exit(1)
    if strict and summary.skipped:
        raise typer.Exit(3)


@app.command("demo")
def demo_command(
    path: Annotated[
        Path | None, typer.Option("--file", help="FOCUS 1.0 CSV (default: the bundled sample).")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Invoicing worker processes.")
    ] = 3,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for every invoice and email.")
    ] = 600.0,
) -> None:
    """The main job: stack up, import the FOCUS sample, invoice and email it, reconcile.

    Exit 1 on a mismatch or a missing invoice or email.
    """
    from streams.demo.expected import DEFAULT_SAMPLE
    from streams.demo.run import print_report, run_demo
    from streams.worker_cli import configure_logging

    configure_logging("WARNING")
    settings = _settings()
    report = run_demo(
        settings,
        path=path or settings.stack.home / DEFAULT_SAMPLE,
        workers=workers,
        timeout_s=timeout_s,
        console=console,
    )
    print_report(report, out)
    if not report.ok:
        raise typer.Exit(1)


@app.command("close-period")
def close_period_command(
    period: Annotated[str, typer.Argument(help="Billing period, YYYY-MM.")],
    lease_ttl: float = typer.Option(30.0, "--lease-ttl", help="Lease TTL, seconds."),
    scan_margin_days: float = typer.Option(
        7.0, "--scan-margin-days", help="Scan the topic from this long before the period."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """Emit billing_period.closed for every customer with usage in PERIOD, under a Redis lease.

    Exit 0: done; 1: delivery failure, Kafka or database error; 2: invalid period;
    3: Redis unreachable (nothing emitted); 4: another run holds the lease (nothing
    emitted); 5: aborted part-way (lease lost or fenced; rerun to continue).
    """
    import json
    from datetime import timedelta

    from streams.adapters.lease import LeaseBusy, LeaseError, LeaseUnavailable
    from streams.domain.errors import InvalidPeriod
    from streams.importers import ImporterError
    from streams.importers.close_period import CloseAborted, close_period

    try:
        summary = close_period(
            period,
            _settings(),
            lease_ttl_s=lease_ttl,
            progress=progress,
            scan_margin=timedelta(days=scan_margin_days),
        )
    except InvalidPeriod as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from exc
    except LeaseUnavailable as exc:
        console.print(f"[red]refusing to start[/]: {exc}")
        raise typer.Exit(3) from exc
    except LeaseBusy as exc:
        console.print(f"[red]another close-period run is active[/]: {exc}")
        raise typer.Exit(4) from exc
    except CloseAborted as exc:
        console.print(f"[red]aborted[/]: {exc}")
        raise typer.Exit(5) from exc
    except (ImporterError, LeaseError) as exc:
        console.print(f"[red]close-period failed[/]: {exc}")
        raise typer.Exit(1) from exc
    style = "green" if summary.ok else "red"
    console.print(
        f"[{style}]close-period {summary.period}[/] on {summary.topic}: "
        f"{len(summary.customers)} customers ({summary.from_topic} from the topic, "
        f"{summary.from_db} from usage_lines), {summary.markers_produced} markers delivered, "
        f"{summary.newly_requested} newly requested, {summary.already_requested} already "
        f"requested; lease {summary.lease_name} token {summary.fencing_token}; "
        f"{summary.scanned_records} records scanned ({summary.undecodable_records} invalid); "
        f"{summary.elapsed_s:.2f}s"
    )
    for failure in summary.delivery_failures:
        console.print(
            f"  [red]not delivered[/]: {failure.customer_id} {failure.event_id}: {failure.error}"
        )
    if json_out:
        out.print_json(json.dumps(summary.to_dict()))
    if not summary.ok:
        raise typer.Exit(1)


def _register_operator_commands() -> None:
    from streams.ops.cli import register

    register(app)


_register_operator_commands()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
