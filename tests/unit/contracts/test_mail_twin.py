"""The mail transport's contract (tests/contracts/mail.py) on the in-memory twin, and what
only the twin does (scripted failures, its record of sent messages)."""

from __future__ import annotations

import pytest

from streams.adapters.memory.mail import InMemoryMailTransport
from streams.apps.email.errors import SmtpPermanentError, SmtpTransientError
from tests.contracts.mail import (
    FROM,
    MailHarness,
    MailTransportContract,
    Received,
    invoice_message,
)


class TestInMemoryMailTransport(MailTransportContract):
    @pytest.fixture
    def harness(self) -> MailHarness:
        twin = InMemoryMailTransport()
        down = InMemoryMailTransport()
        down.down = True

        def received() -> list[Received]:
            return [Received(m.from_address, (m.to_address,), m.message) for m in twin.sent]

        return MailHarness(transport=twin, received=received, down=down)


def test_fail_next_raises_then_sends() -> None:
    twin = InMemoryMailTransport()
    twin.fail_next(1)
    twin.fail_next(1, SmtpPermanentError("smtp_rejected: data refused: 554 no", code=554))
    message = invoice_message("a@example.com")
    with pytest.raises(SmtpTransientError):
        twin.send(message, from_address=FROM, to_address="a@example.com")
    with pytest.raises(SmtpPermanentError):
        twin.send(message, from_address=FROM, to_address="a@example.com")
    assert twin.sent == []
    twin.send(message, from_address=FROM, to_address="a@example.com")
    (sent,) = twin.sent
    assert twin.by_message_id() == {str(message["Message-ID"]): 1}
    assert sent.message_id == str(message["Message-ID"])
    assert ("X-Invoice-Revision", "1") in sent.headers
    assert sent.body == message.get_content()


def test_the_record_is_a_copy() -> None:
    twin = InMemoryMailTransport()
    message = invoice_message("a@example.com")
    twin.send(message, from_address=FROM, to_address="a@example.com")
    message.replace_header("Subject", "changed after sending")
    assert twin.sent[0].message["Subject"] != "changed after sending"
