"""The project's SMTP sink as a child process, on a free port of 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from streams.errors import InvoicingError


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SmtpSinkError(InvoicingError, RuntimeError):
    """The SMTP sink process did not start listening."""


@contextlib.contextmanager
def running_smtp_sink(
    workdir: Path,
    *,
    port: int | None = None,
    timeout_s: float = 20.0,
    tls: tuple[Sequence[str], Mapping[str, str]] = ((), {}),
) -> Iterator[tuple[int, Path]]:
    """The project's SMTP sink (:mod:`streams.devtools.stack.smtp_sink`) as a child process on
    127.0.0.1:``port`` (default: a free port), storing into ``workdir/maildir``
    (emptied first, so a reused workdir counts this run's mail only), logging to
    ``workdir/smtp.log``. Yields ``(port, maildir)``; stops the process on exit.

    ``tls``: the sink's extra arguments and environment, by default none (no STARTTLS,
    no AUTH); :func:`streams.devtools.stack.tls.smtp_sink_tls` gives the TLS profile's.

    Raises:
        SmtpSinkError: nothing listened on the port within ``timeout_s`` seconds.
    """
    port = port or free_port()
    maildir = workdir / "maildir"
    shutil.rmtree(maildir, ignore_errors=True)
    maildir.mkdir(parents=True)
    log = workdir / "smtp.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streams.devtools.stack.smtp_sink",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--maildir",
                str(maildir),
                *tls[0],
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **tls[1]} if tls[1] else None,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise SmtpSinkError(
                        f"the SMTP sink did not listen on 127.0.0.1:{port} (see {log})"
                    ) from None
                time.sleep(0.1)
        yield port, maildir
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
