"""What the commands share: consoles, their settings, exit codes, log configuration."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from streams.settings import Settings

#: Messages, progress and errors.
console = Console(stderr=True)
#: Results (tables, JSON).
out = Console()

#: ``(exception type or types, exit code, message prefix)``: see :func:`exit_on`.
ExitRule = tuple[type[Exception] | tuple[type[Exception], ...], int, str | None]


def settings_of(ctx: typer.Context) -> Settings:
    """The settings the root callback loaded for this process (``ctx.obj`` of the root).

    Raises:
        RuntimeError: the command runs without the root app (no settings were loaded).
    """
    settings = ctx.find_object(Settings)
    if settings is None:
        raise RuntimeError("no settings loaded: run the command through streams.entrypoints.app")
    return settings


@contextmanager
def exit_on(*rules: ExitRule, to: Console = console) -> Iterator[None]:
    """Turn the logic's exceptions into exit codes, one red line each on ``to``.

    The first rule whose types match wins (list subclasses before their bases); the
    line is ``[red]<prefix>[/]: <exception>``, or ``[red]<exception>[/]`` when the
    prefix is None. Exceptions no rule names propagate unchanged.

    Raises:
        typer.Exit: with the matching rule's code, chained to the exception.
    """
    try:
        yield
    except Exception as exc:
        for types, code, prefix in rules:
            if isinstance(exc, types):
                to.print(f"[red]{exc}[/]" if prefix is None else f"[red]{prefix}[/]: {exc}")
                raise typer.Exit(code) from exc
        raise


@contextmanager
def leased_job(
    *, job: str, busy: str, aborted: type[Exception], errors: tuple[type[Exception], ...]
) -> Iterator[None]:
    """The exit codes of a period job under a Redis lease (``close-period``, ``replay``):

    2 invalid period; 3 Redis unreachable (``refusing to start``); 4 the lease is held
    (``busy``); 5 ``aborted`` part-way; 1 ``errors`` or another lease error
    (``<job> failed``).
    """
    from streams.adapters.lease import LeaseBusy, LeaseError, LeaseUnavailable
    from streams.core.domain.errors import InvalidPeriod

    with exit_on(
        (InvalidPeriod, 2, None),
        (LeaseUnavailable, 3, "refusing to start"),
        (LeaseBusy, 4, busy),
        (aborted, 5, "aborted"),
        ((*errors, LeaseError), 1, f"{job} failed"),
    ):
        yield


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


@contextmanager
def refuse_below_profile() -> Iterator[None]:
    """Exit 2 with its message when a process refuses to start because a topic has less
    replication than the profile requires (``TopicsBelowRequirement``)."""
    from streams.adapters.kafka_replication import TopicsBelowRequirement

    with exit_on((TopicsBelowRequirement, 2, None)):
        yield
