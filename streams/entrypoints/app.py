"""The root ``invoicing`` app: mounts every command group and loads the settings once.

Commands are grouped by what an operator does (the module map is in
:mod:`streams.entrypoints`). The root callback builds the one
:class:`~streams.settings.Settings` of the process from the environment and
keeps it as the root context's ``obj``; every command takes it from there
(:func:`streams.entrypoints.common.settings_of`) and passes it down.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys

import typer

from streams.entrypoints import (
    close,
    config,
    connectors,
    db,
    demo,
    drill,
    imports,
    invoices,
    ops,
    plans,
    replay,
    schemas,
    stack,
    topics,
    usage,
    worker,
)
from streams.entrypoints.help import install, version_callback
from streams.settings import Settings

install()

app = typer.Typer(
    help="Invoicing pipeline: usage events in, one invoice and one email out.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def load_settings(
    ctx: typer.Context,
    _version: bool = typer.Option(
        False,
        "--version",
        callback=version_callback,
        is_eager=True,
        help="Print the version and exit.",
    ),
) -> None:
    """Load the settings once for the whole command (``ctx.obj``)."""
    ctx.obj = Settings()


# Registration order is the order of ``invoicing --help``: commands, then groups.
app.command("drill")(drill.drill_command)
app.command("replay")(replay.replay_command)
app.command("demo")(demo.demo_command)
app.command("generate-events")(demo.generate_events_command)
app.command("close-period")(close.close_period_command)
app.command("status")(ops.status_command)
app.command("reconcile")(ops.reconcile_command)
app.command("explain")(ops.explain_command)
app.command("usage")(usage.usage_command)
app.add_typer(stack.app, name="stack")
app.add_typer(db.app, name="db")
app.add_typer(topics.app, name="topics")
app.add_typer(imports.app, name="import")
app.add_typer(plans.app, name="plans")
app.add_typer(worker.app, name="worker")
app.add_typer(connectors.app, name="connectors")
app.add_typer(schemas.app, name="schemas")
app.add_typer(ops.holds_app, name="holds")
app.add_typer(ops.fences_app, name="fences")
app.add_typer(ops.outbox_app, name="outbox")
app.add_typer(invoices.app, name="invoice")
app.add_typer(invoices.credit_app, name="credit-note")
app.add_typer(usage.api_keys_app, name="keys")
# the earlier name of the same commands
app.add_typer(usage.api_keys_app, name="api-keys", hidden=True)
app.add_typer(config.app, name="config")


#: Exit status when the reader of standard output went away (``invoicing … | head``):
#: 128 + SIGPIPE, what a shell reports for a tool that SIGPIPE ended.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


def main() -> None:
    """Console-script entry point (``invoicing``).

    A reader of standard output that stops early (``invoicing explain INV | head``)
    ends the command quietly with :data:`EXIT_BROKEN_PIPE`, as it ends a C tool, instead
    of a ``BrokenPipeError`` traceback (the recipe of Python's documentation, "Note on
    SIGPIPE" in the ``signal`` module). SIGPIPE itself stays ignored, as Python sets it, so
    a closed socket in a worker is an error to handle, never the end of the process.

    The process ends without the interpreter's module teardown
    (:func:`_end_without_teardown`): about 0.3-0.4 s of a short command on this box
    (docs/benchmarks.md "The end of a command").
    """
    atexit.register(_end_without_teardown)
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # a write that fails here fails inside the try
    except BrokenPipeError:
        # Python flushes stdout again at exit; point it at /dev/null so that flush
        # finds nothing to write and no "Exception ignored" line follows.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        _exit_status[0] = EXIT_BROKEN_PIPE
        sys.exit(EXIT_BROKEN_PIPE)
    except SystemExit as exc:
        _exit_status[0] = _status_of(exc.code)
        raise
    except BaseException:
        _exit_status[0] = 1  # Python prints the traceback and exits 1
        raise
    _exit_status[0] = 0


#: The status :func:`main` ends with (a list: set from inside ``main``); 1 until it is known.
_exit_status = [1]


def _status_of(code: object) -> int:
    """The process status of ``SystemExit(code)``, by Python's rules: ``None`` is 0, an
    int is itself, anything else is printed (by Python, before the exit handlers) and is 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def _end_without_teardown() -> None:
    """The last exit handler of the ``invoicing`` process: flush the logs and the standard
    streams, then end the process with :func:`os._exit`, skipping the interpreter's teardown
    of its ~850 modules and their objects.

    Safe because everything a command must finish has happened before this runs: the
    command has returned (its producers flushed, its pools and clients closed, its
    lease released); Python has joined every non-daemon thread (``threading``'s shutdown
    comes before the exit handlers); every other exit handler has run (this one is
    registered first, at the start of :func:`main`, and handlers run last-registered
    first), except :func:`logging.shutdown`, registered when ``logging`` was imported,
    which is called here. What is skipped is freeing memory and closing sockets that the
    kernel frees and closes anyway. The same technique as Instagram's ``atexit.register(
    os._exit, 0)`` ("Dismissing Python Garbage Collection at Instagram", 2017).
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing to write
            stream.flush()
    os._exit(_exit_status[0])
