"""``invoicing worker …``: the long-running stream processors (until SIGTERM/SIGINT).

Each worker adds its own command here without touching the rest of the CLI.
"""

from __future__ import annotations

import typer

from streams.entrypoints import usage
from streams.entrypoints.common import configure_logging, settings_of
from streams.settings import Settings

app = typer.Typer(
    help="Stream processors (run until SIGTERM/SIGINT).",
    no_args_is_help=True,
)

MetricsPortOption = typer.Option(
    None,
    "--metrics-port",
    help="Serve Prometheus metrics on 127.0.0.1:PORT "
    "(default: INVOICING_WORKER__METRICS_PORT; 0 = off).",
)
LogLevelOption = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR.")


def with_metrics_port(settings: Settings, metrics_port: int | None) -> Settings:
    """``settings`` with ``worker.metrics_port`` replaced when ``metrics_port`` is given."""
    if metrics_port is None:
        return settings
    worker = settings.worker.model_copy(update={"metrics_port": metrics_port})
    return settings.model_copy(update={"worker": worker})


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
    """Email every issued invoice and credit note once (group settings.worker.email_group)."""
    from streams.email.errors import EmailConfigurationError
    from streams.email.sender import run_email_sender

    settings = _start(ctx, metrics_port, log_level)
    try:
        run_email_sender(settings)
    except EmailConfigurationError as exc:
        typer.echo(f"email sender cannot start: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command("invoicing")
def worker_invoicing(
    ctx: typer.Context,
    metrics_port: int | None = MetricsPortOption,
    log_level: str = LogLevelOption,
) -> None:
    """Store usage and build one invoice per close marker (group settings.worker.invoicing_group)."""
    from prometheus_client import start_http_server

    from streams.invoicing.worker import run_invoicing_worker

    settings = _start(ctx, metrics_port, log_level)
    if settings.worker.metrics_port:
        start_http_server(settings.worker.metrics_port, addr="127.0.0.1")
    run_invoicing_worker(settings)


# The usage view and the ingest edge (issue 13): streams.entrypoints.usage.
app.command("usage-view")(usage.usage_view_worker)
app.command("ingest")(usage.ingest_worker)
