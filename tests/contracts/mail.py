"""Contract of the :class:`~streams.core.billing.ports.MailTransport` port.

Run on :class:`~streams.adapters.memory.mail.InMemoryMailTransport` (unit tier) and
on :class:`~streams.adapters.smtp.SmtpTransport` against the project's real SMTP
sink process (integration tier). A subclass provides the ``harness`` fixture.
Refused recipients are the mailbox simulator's (:mod:`streams.adapters.memory.mailbox_simulator`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime

import pytest

from streams.adapters.memory.mailbox_simulator import BOUNCE, DEFER
from streams.apps.email.errors import SmtpPermanentError, SmtpTransientError, TransientEmailError
from streams.core.billing.ports import MailTransport

FROM = "billing@invoicing.example"


@dataclass(frozen=True)
class Received:
    """One message as the receiving side got it, with its SMTP envelope."""

    envelope_from: str
    envelope_to: tuple[str, ...]
    message: EmailMessage


@dataclass
class MailHarness:
    """A working transport, what its server received, and a transport whose server is down."""

    transport: MailTransport
    #: Every message the server received so far, oldest first.
    received: Callable[[], list[Received]]
    down: MailTransport

    def received_with(self, message_id: str) -> list[Received]:
        return [
            r for r in self.received() if str(r.message.get("Message-ID", "")).strip() == message_id
        ]


def tagged(address: str) -> str:
    """``bounce@simulator.invalid`` → ``bounce+<unique>@simulator.invalid``."""
    local, _, domain = address.partition("@")
    return f"{local}+{uuid.uuid4().hex[:8]}@{domain}"


def invoice_message(to: str, *, html: bool = False) -> EmailMessage:
    number = uuid.uuid4().hex[:12]
    message = EmailMessage()
    message["From"] = f"Billing <{FROM}>"
    message["To"] = to
    message["Subject"] = f"Facture INV-{number} — 1 234,56 €"
    message["Date"] = format_datetime(datetime(2026, 11, 1, 0, 5, tzinfo=UTC))
    message["Message-ID"] = f"<invoice.{number}.r1@invoicing.example>"
    message["X-Invoice-Id"] = f"inv-{number}"
    message["X-Invoice-Revision"] = "1"
    message.set_content(f"Invoice INV-{number}\nTotal: 1,234.56 EUR — merci\n")
    if html:
        message.add_alternative(f"<p>Invoice <b>INV-{number}</b> — merci</p>", subtype="html")
    return message


def message_id(message: EmailMessage) -> str:
    return str(message["Message-ID"])


class MailTransportContract:
    """The mail transport's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> MailHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_a_sent_message_is_received_once_with_its_message_id_and_headers(
        self, harness: MailHarness
    ) -> None:
        to = f"customer-{uuid.uuid4().hex[:6]}@example.com"
        message = invoice_message(to)
        harness.transport.send(message, from_address=FROM, to_address=to)
        (got,) = harness.received_with(message_id(message))
        assert got.envelope_from == FROM
        assert got.envelope_to == (to,)
        for name, value in message.items():
            assert got.message.get_all(name) == [value], name
        body = got.message.get_body(("plain",))
        assert body is not None
        assert body.get_content() == message.get_content()

    def test_an_html_alternative_arrives_intact(self, harness: MailHarness) -> None:
        to = "customer@example.com"
        message = invoice_message(to, html=True)
        harness.transport.send(message, from_address=FROM, to_address=to)
        (got,) = harness.received_with(message_id(message))
        html = got.message.get_body(("html",))
        expected = message.get_body(("html",))
        assert html is not None and expected is not None
        assert html.get_content() == expected.get_content()

    def test_each_send_is_one_reception(self, harness: MailHarness) -> None:
        first, second = invoice_message("a@example.com"), invoice_message("b@example.com")
        harness.transport.send(first, from_address=FROM, to_address="a@example.com")
        harness.transport.send(second, from_address=FROM, to_address="b@example.com")
        harness.transport.send(second, from_address=FROM, to_address="b@example.com")
        assert len(harness.received_with(message_id(first))) == 1
        assert len(harness.received_with(message_id(second))) == 2

    def test_the_envelope_recipient_is_the_one_given(self, harness: MailHarness) -> None:
        message = invoice_message("shown@example.com")
        harness.transport.send(message, from_address=FROM, to_address="actual@example.com")
        (got,) = harness.received_with(message_id(message))
        assert got.envelope_to == ("actual@example.com",)
        assert got.message["To"] == "shown@example.com"

    def test_a_refused_recipient_is_a_permanent_error(self, harness: MailHarness) -> None:
        to = tagged(BOUNCE)
        message = invoice_message(to)
        with pytest.raises(SmtpPermanentError) as caught:
            harness.transport.send(message, from_address=FROM, to_address=to)
        assert caught.value.code == 550
        assert caught.value.reason.startswith("smtp_rejected: recipient refused")
        assert to in caught.value.reason
        assert harness.received_with(message_id(message)) == []

    def test_a_deferred_recipient_is_a_transient_error(self, harness: MailHarness) -> None:
        to = tagged(DEFER)
        message = invoice_message(to)
        with pytest.raises(SmtpTransientError) as caught:
            harness.transport.send(message, from_address=FROM, to_address=to)
        assert caught.value.code == 451
        assert harness.received_with(message_id(message)) == []
        # later, to a recipient that takes it: received once
        harness.transport.send(message, from_address=FROM, to_address="ok@example.com")
        assert len(harness.received_with(message_id(message))) == 1

    def test_a_server_that_is_down_is_a_transient_error(self, harness: MailHarness) -> None:
        message = invoice_message("customer@example.com")
        with pytest.raises(SmtpTransientError) as caught:
            harness.down.send(message, from_address=FROM, to_address="customer@example.com")
        assert isinstance(caught.value, TransientEmailError)
        assert caught.value.code is None
        assert harness.received_with(message_id(message)) == []
