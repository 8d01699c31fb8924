"""The mail transport's contract (tests/contracts/mail.py) on
:class:`~streams.adapters.smtp.SmtpTransport` against the project's real SMTP sink
(``python -m streams.devtools.stack.smtp_sink``, a process of its own with its own Maildir),
and against a closed port for "server down"."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.adapters.smtp import SmtpTransport
from streams.devtools.sandbox.smtp import running_smtp_sink
from streams.devtools.stack.maildir import list_messages
from streams.settings import SmtpSettings
from tests.contracts.mail import MailHarness, MailTransportContract, Received


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    with running_smtp_sink(tmp_path_factory.mktemp("smtp")) as (port, maildir):
        yield port, maildir


def envelope_of(value: object) -> tuple[str, ...]:
    return tuple(part.strip() for part in str(value or "").split(",") if part.strip())


class TestSmtpTransport(MailTransportContract):
    @pytest.fixture
    def harness(self, sink: tuple[int, Path]) -> MailHarness:
        port, maildir = sink

        def received() -> list[Received]:
            return [
                Received(str(m.get("X-MailFrom", "")).strip(), envelope_of(m.get("X-RcptTo")), m)
                for m in list_messages(maildir)
            ]

        return MailHarness(
            transport=SmtpTransport(SmtpSettings(host="127.0.0.1", port=port, timeout_s=10)),
            received=received,
            down=SmtpTransport(SmtpSettings(host="127.0.0.1", port=free_port(), timeout_s=2)),
        )
