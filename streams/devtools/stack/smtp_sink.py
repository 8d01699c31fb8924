"""SMTP sink of the local stack: accepts every message and stores it in a Maildir.

Run::

    python -m streams.devtools.stack.smtp_sink --host 127.0.0.1 --port 12525 \\
        --maildir .local/data/maildir [--log-level INFO]

Any sender and recipient is accepted, without authentication or TLS; nothing is
relayed. The exceptions are the mailbox-simulator recipients of
:mod:`streams.adapters.memory.mailbox_simulator` (``bounce@simulator.invalid`` → ``550``,
``defer@simulator.invalid`` → ``451`` at ``RCPT TO``), so tests can see a refused
recipient without scripting the server. Each message is stored as received in the Maildir (``new/``) by
aiosmtpd's :class:`aiosmtpd.handlers.Mailbox`, which adds the envelope as
headers: ``X-Peer`` (client address), ``X-MailFrom``, ``X-RcptTo`` (comma-separated).
``NOOP`` answers ``250 OK`` (health checks use it). Read the Maildir with
:mod:`streams.devtools.stack.maildir`.

Logs go to stderr (UTC timestamps), one line per stored message with its
Message-ID. SIGTERM or SIGINT stop the server cleanly (exit status 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import ssl
import sys
import threading
import time
from collections.abc import Sequence
from email.message import Message
from pathlib import Path
from types import FrameType
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from streams.adapters.memory.mailbox_simulator import simulated_refusal

logger = logging.getLogger("streams.devtools.stack.smtp_sink")


class LoggingMailbox(Mailbox):
    """aiosmtpd's Maildir handler, plus one log line per stored message, and the
    mailbox simulator's refusals."""

    async def handle_RCPT(
        self,
        server: SMTP,
        session: Session,
        envelope: Envelope,
        address: str,
        rcpt_options: list[str],
    ) -> str:
        refusal = simulated_refusal(address)
        if refusal is not None:
            code, text = refusal
            logger.info("refused recipient %s: %d %s (mailbox simulator)", address, code, text)
            return f"{code} {text}"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(rcpt_options)
        return "250 OK"

    def handle_message(self, message: Message) -> None:
        super().handle_message(message)
        logger.info(
            "stored message %s from %s to %s",
            message.get("Message-ID"),
            message.get("X-MailFrom"),
            message.get("X-RcptTo"),
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m streams.devtools.stack.smtp_sink",
        description="SMTP sink: stores every message it receives in a Maildir.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=12525)
    parser.add_argument("--maildir", type=Path, required=True, help="created if missing")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--tls-cert", type=Path, help="PEM certificate: require STARTTLS")
    parser.add_argument("--tls-key", type=Path, help="PEM key of --tls-cert")
    parser.add_argument(
        "--auth-user",
        help="require AUTH (after STARTTLS) as this user; the password is read from "
        "SMTP_SINK_PASSWORD",
    )
    return parser


def tls_parameters(args: argparse.Namespace) -> dict[str, Any]:
    """aiosmtpd's SMTP parameters of the TLS profile: STARTTLS required with
    ``--tls-cert``/``--tls-key``, AUTH (LOGIN, PLAIN) required as ``--auth-user`` with the
    password of ``SMTP_SINK_PASSWORD``; none without them."""
    params: dict[str, Any] = {}
    if args.tls_cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(args.tls_cert), str(args.tls_key))
        params.update(tls_context=context, require_starttls=True)
    if args.auth_user:
        user = args.auth_user.encode()
        password = os.environ.get("SMTP_SINK_PASSWORD", "").encode()

        def authenticate(
            server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
        ) -> AuthResult:
            ok = (
                isinstance(auth_data, LoginPassword)
                and auth_data.login == user
                and auth_data.password == password
            )
            return AuthResult(success=ok)

        params.update(authenticator=authenticate, auth_required=True, auth_require_tls=True)
    return params


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m streams.devtools.stack.smtp_sink``; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    logging.Formatter.converter = time.gmtime
    # aiosmtpd logs every SMTP command at INFO on "mail.log": only at DEBUG here.
    if logging.getLogger().level > logging.DEBUG:
        logging.getLogger("mail.log").setLevel(logging.WARNING)
    # mailbox.Maildir creates tmp/new/cur only when the folder itself is missing.
    for sub in ("tmp", "new", "cur"):
        (args.maildir / sub).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    controller = Controller(
        LoggingMailbox(args.maildir),
        hostname=args.host,
        port=args.port,
        server_hostname="smtp-sink.invoicing.local",
        enable_SMTPUTF8=True,
        **tls_parameters(args),
    )
    controller.start()
    logger.info("SMTP sink listening on %s:%d, storing to %s", args.host, args.port, args.maildir)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        logger.info("stopping SMTP sink")
        controller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
