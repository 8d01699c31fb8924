"""``invoicing worker …``: the long-running stream processors.

A separate typer app that :mod:`streams.cli` mounts as ``worker``, so that each
worker adds its own command here without touching the rest of the CLI.
Settings are loaded once per command and passed down.
"""

from __future__ import annotations

import logging
import sys
import time

import typer

from streams.settings import Settings

worker_app = typer.Typer(
    help="Stream processors (run until SIGTERM/SIGINT).",
    no_args_is_help=True,
)


def configure_logging(level: str) -> None:
    """One log line per event on stderr, UTC timestamps."""
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    logging.Formatter.converter = time.gmtime
    # One line per HTTP request to the tax service is noise at INFO.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))


def with_metrics_port(settings: Settings, metrics_port: int | None) -> Settings:
    """``settings`` with ``worker.metrics_port`` replaced when ``metrics_port`` is given."""
    if metrics_port is None:
        return settings
    worker = settings.worker.model_copy(update={"metrics_port": metrics_port})
    return settings.model_copy(update={"worker": worker})


@worker_app.command("email")
def worker_email(
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        help="Serve Prometheus metrics on 127.0.0.1:PORT "
        "(default: INVOICING_WORKER__METRICS_PORT; 0 = off).",
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR."),
) -> None:
    """Email every issued invoice and credit note once (group settings.worker.email_group)."""
    from streams.bootstrap import run_email_sender
    from streams.email.errors import EmailConfigurationError

    configure_logging(log_level)
    settings = with_metrics_port(Settings(), metrics_port)
    try:
        run_email_sender(settings)
    except EmailConfigurationError as exc:
        typer.echo(f"email sender cannot start: {exc}", err=True)
        raise typer.Exit(2) from exc


@worker_app.command("invoicing")
def worker_invoicing(
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        help="Serve Prometheus metrics on 127.0.0.1:PORT "
        "(default: INVOICING_WORKER__METRICS_PORT; 0 = off).",
    ),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR."),
) -> None:
    """Store usage and build one invoice per close marker (group settings.worker.invoicing_group)."""
    from prometheus_client import start_http_server

    from streams.bootstrap import run_invoicing_worker

    configure_logging(log_level)
    settings = with_metrics_port(Settings(), metrics_port)
    if settings.worker.metrics_port:
        start_http_server(settings.worker.metrics_port, addr="127.0.0.1")
    run_invoicing_worker(settings)
