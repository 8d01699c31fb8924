"""``invoicing worker …``: the long-running stream processors (until SIGTERM/SIGINT).

Each worker adds its own command here without touching the rest of the CLI.
"""

from __future__ import annotations

import signal
import threading

import typer

from streams.entrypoints import usage
from streams.entrypoints.common import configure_logging, refuse_below_profile, settings_of
from streams.settings import Settings

app = typer.Typer(
    help="Stream processors (run until SIGTERM/SIGINT).",
    no_args_is_help=True,
)

MetricsPortOption = typer.Option(
    None,
    "--metrics-port",
    help="Serve Prometheus metrics on PORT of INVOICING_WORKER__METRICS_HOST (127.0.0.1) "
    "(default: INVOICING_WORKER__METRICS_PORT; 0 = off).",
)
LogLevelOption = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR.")


def with_metrics_port(settings: Settings, metrics_port: int | None) -> Settings:
    """``settings`` with ``worker.metrics_port`` replaced when ``metrics_port`` is given."""
    if metrics_port is None:
        return settings
    worker = settings.worker.model_copy(update={"metrics_port": metrics_port})
    return settings.model_copy(update={"worker": worker})


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set from now on.

    Installed first thing in a worker command, before its imports and connections
    (which take seconds on a loaded machine), so a stop that arrives while the worker
    starts is a clean stop — it finishes, closes its consumer, exits 0 — and not a
    kill by the default handler (exit -15)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _start(ctx: typer.Context, metrics_port: int | None, log_level: str) -> Settings:
    """Configure logging; the process's settings with the command line's metrics port."""
    configure_logging(log_level)
    return with_metrics_port(settings_of(ctx), metrics_port)


@app.command("email")
def worker_email(
    ctx: typer.Context,
    metrics_port: int | None = MetricsPortOption,
    log_level: str = LogLevelOption,
) -> None:
    """Email every issued invoice and credit note once (consumer group INVOICING_WORKER__EMAIL_GROUP)."""
    stop = stop_on_signals()
    from streams.apps.email.errors import EmailConfigurationError
    from streams.bootstrap import run_email_sender

    settings = _start(ctx, metrics_port, log_level)
    try:
        with refuse_below_profile():
            run_email_sender(settings, stop=stop)
    except EmailConfigurationError as exc:
        typer.echo(f"email sender cannot start: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command("invoicing")
def worker_invoicing(
    ctx: typer.Context,
    metrics_port: int | None = MetricsPortOption,
    log_level: str = LogLevelOption,
) -> None:
    """Store usage and build one invoice per close marker (consumer group INVOICING_WORKER__INVOICING_GROUP)."""
    stop = stop_on_signals()
    from prometheus_client import start_http_server

    from streams.bootstrap import run_invoicing_worker

    settings = _start(ctx, metrics_port, log_level)
    with refuse_below_profile():
        if settings.worker.metrics_port:
            start_http_server(settings.worker.metrics_port, addr=settings.worker.metrics_host)
        run_invoicing_worker(settings, stop=stop, install_signal_handlers=False)


@app.command("portal")
def worker_portal(
    ctx: typer.Context,
    port: int | None = typer.Option(
        None, "--port", help="Listen on this port (default: INVOICING_PORTAL__PORT)."
    ),
    log_level: str = LogLevelOption,
) -> None:
    """Serve the hosted invoice page (GET /invoices/{id}?t=TOKEN) through the read-only
    portal role; /health answers 200 while the database does."""
    configure_logging(log_level)
    from streams.bootstrap import run_portal

    run_portal(settings_of(ctx), port=port)


# The usage view and the ingest edge (docs/usage-api.md): streams.entrypoints.usage.
app.command("usage-view")(usage.usage_view_worker)
app.command("ingest")(usage.ingest_worker)
