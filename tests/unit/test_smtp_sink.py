"""The SMTP sink as a subprocess on a free port of 127.0.0.1: messages sent with
smtplib land in its Maildir and are listed with their Message-ID; NOOP answers 250;
SIGTERM stops it cleanly."""

from __future__ import annotations

import smtplib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import pytest

from streams.adapters.memory.mailbox_simulator import BOUNCE, DEFER, simulated_refusal
from streams.devtools.stack.maildir import count_by_header, list_messages


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Sink:
    port: int
    maildir: Path
    process: subprocess.Popen[bytes]
    log: Path


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Sink]:
    port = free_port()
    maildir = tmp_path / "maildir"
    maildir.mkdir()  # as the stack layout does: the sink must still create tmp/new/cur
    log = tmp_path / "smtp_sink.log"
    argv = [sys.executable, "-m", "streams.devtools.stack.smtp_sink", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--maildir", str(maildir)]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    deadline = time.monotonic() + 15
    while True:
        try:
            with smtplib.SMTP("127.0.0.1", port, timeout=2):
                break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                pytest.fail(f"SMTP sink did not start:\n{log.read_text()}")
            time.sleep(0.05)
    yield Sink(port, maildir, process, log)
    if process.poll() is None:
        process.kill()
        process.wait()


def plain_message(message_id: str, to: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "billing@invoicing.example"
    message["To"] = to
    message["Subject"] = "Your invoice"
    message["Message-ID"] = message_id
    message["X-Invoice-Id"] = "inv-1"
    message.set_content("Total: 12.34 USD\n")
    return message


def html_message(message_id: str, to: str) -> EmailMessage:
    message = plain_message(message_id, to)
    message.replace_header("X-Invoice-Id", "inv-2")
    message.add_alternative("<p>Total: <b>56.78 USD</b> — merci</p>", subtype="html")
    return message


def test_messages_are_stored_and_listed_with_their_message_id(sink: Sink) -> None:
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
        smtp.send_message(plain_message("<inv-1.r1@invoicing.example>", "a@example.com"))
        smtp.send_message(html_message("<inv-2.r1@invoicing.example>", "b@example.com"))
        smtp.send_message(plain_message("<inv-1.r1@invoicing.example>", "a@example.com"))

    messages = list_messages(sink.maildir)
    assert [m["Message-ID"] for m in messages] == [
        "<inv-1.r1@invoicing.example>",
        "<inv-2.r1@invoicing.example>",
        "<inv-1.r1@invoicing.example>",
    ]
    plain, html, _ = messages
    assert plain.get_content_type() == "text/plain"
    assert plain.get_content() == "Total: 12.34 USD\n"
    assert html.is_multipart()
    html_body = html.get_body(("html",))
    assert html_body is not None
    assert "56.78 USD</b> — merci" in html_body.get_content()
    assert html["X-RcptTo"] == "b@example.com"
    assert html["X-MailFrom"] == "billing@invoicing.example"
    assert count_by_header(sink.maildir, "X-Invoice-Id") == {"inv-1": 2, "inv-2": 1}
    assert count_by_header(sink.maildir, "Message-ID") == {
        "<inv-1.r1@invoicing.example>": 2,
        "<inv-2.r1@invoicing.example>": 1,
    }
    assert count_by_header(sink.maildir, "X-Not-There") == {}


def test_noop_answers_250(sink: Sink) -> None:
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
        code, _ = smtp.noop()
    assert code == 250


def test_mailbox_simulator_recipients_are_refused_and_others_kept(sink: Sink) -> None:
    with smtplib.SMTP("127.0.0.1", sink.port, timeout=5) as smtp:
        with pytest.raises(smtplib.SMTPRecipientsRefused) as bounced:
            smtp.send_message(
                plain_message("<b@x>", BOUNCE), to_addrs=["bounce+7@simulator.invalid"]
            )
        with pytest.raises(smtplib.SMTPRecipientsRefused) as deferred:
            smtp.send_message(plain_message("<d@x>", DEFER), to_addrs=[DEFER])
        refused = smtp.send_message(
            plain_message("<m@x>", "a@example.com"), to_addrs=["a@example.com", BOUNCE]
        )
    assert bounced.value.recipients["bounce+7@simulator.invalid"][0] == 550
    assert deferred.value.recipients[DEFER][0] == 451
    assert refused == {BOUNCE: (550, b"5.1.1 mailbox unavailable (simulated bounce)")}
    (kept,) = list_messages(sink.maildir)
    assert kept["Message-ID"] == "<m@x>"
    assert kept["X-RcptTo"] == "a@example.com"
    assert "refused recipient bounce+7@simulator.invalid: 550" in sink.log.read_text()


@pytest.mark.parametrize(
    ("address", "code"),
    [
        ("bounce@simulator.invalid", 550),
        ("BOUNCE+inv-1@Simulator.Invalid", 550),
        ("<defer@simulator.invalid>", 451),
        ("defer+x@simulator.invalid", 451),
        ("bounce@example.com", None),
        ("other@simulator.invalid", None),
        ("simulator.invalid", None),
    ],
)
def test_simulated_refusal(address: str, code: int | None) -> None:
    refusal = simulated_refusal(address)
    assert (refusal[0] if refusal else None) == code


def test_sigterm_stops_the_sink_cleanly(sink: Sink) -> None:
    sink.process.terminate()
    assert sink.process.wait(timeout=10) == 0
    assert "stopping SMTP sink" in sink.log.read_text()


def test_listing_a_folder_that_is_not_a_maildir_fails(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        list_messages(tmp_path / "nowhere")
