"""In-memory twin of the :class:`~streams.core.billing.ports.MailTransport` port.

:class:`InMemoryMailTransport` records every message it accepts (a copy parsed
back from its bytes, as a receiver sees it) with its envelope, and fails the way
:class:`~streams.adapters.smtp.SmtpTransport` against the SMTP sink fails, with
the same exceptions and messages (it classifies the ``smtplib`` error the real
transport would have met with :func:`streams.adapters.smtp.classify_smtp_error`):

* the mailbox-simulator recipients (:mod:`streams.adapters.memory.mailbox_simulator`):
  ``bounce@simulator.invalid`` → :class:`~streams.apps.email.errors.SmtpPermanentError`
  (550), ``defer@simulator.invalid`` → :class:`~streams.apps.email.errors.SmtpTransientError`
  (451), nothing recorded;
* ``down = True``: every send raises :class:`~streams.apps.email.errors.SmtpTransientError`
  (connection refused, ``code`` ``None``);
* :meth:`InMemoryMailTransport.fail_next`: the next sends raise a given error.
"""

from __future__ import annotations

import email
import email.policy
import smtplib
import threading
from collections import Counter
from dataclasses import dataclass
from email.message import EmailMessage

from streams.adapters.memory.mailbox_simulator import simulated_refusal
from streams.adapters.smtp import classify_smtp_error
from streams.core.billing.mail_errors import EmailError, SmtpTransientError

__all__ = ["InMemoryMailTransport", "SentMessage"]


@dataclass(frozen=True)
class SentMessage:
    """One accepted message: its envelope and the message as received."""

    from_address: str
    to_address: str
    message: EmailMessage

    @property
    def message_id(self) -> str | None:
        value = self.message.get("Message-ID")
        return None if value is None else str(value).strip()

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Every header as ``(name, value)``, in order (values decoded)."""
        return [(name, str(value)) for name, value in self.message.items()]

    @property
    def body(self) -> str:
        """The plain-text body (the ``text/plain`` part), ``""`` if there is none."""
        part = self.message.get_body(("plain",))
        return "" if part is None else str(part.get_content())


class InMemoryMailTransport:
    """:class:`~streams.core.billing.ports.MailTransport` that keeps what it sends. Thread-safe.

    Attributes:
        sent: accepted messages, in order.
        down: when true, every send fails as against a relay that is not listening.
    """

    def __init__(self) -> None:
        self.sent: list[SentMessage] = []
        self.down = False
        self._failures: list[EmailError] = []
        self._lock = threading.Lock()

    def fail_next(self, count: int = 1, error: EmailError | None = None) -> None:
        """Make the next ``count`` sends raise ``error`` (default: a
        :class:`~streams.apps.email.errors.SmtpTransientError`, 451) without recording."""
        with self._lock:
            for _ in range(count):
                self._failures.append(
                    error or SmtpTransientError("injected failure: 451 try again", code=451)
                )

    def send(self, message: EmailMessage, *, from_address: str, to_address: str) -> None:
        """Record ``message`` as sent to ``to_address`` (see the module docstring).

        Raises:
            SmtpTransientError: ``down``, an injected failure, or a deferred recipient.
            SmtpPermanentError: a bounced recipient (or an injected permanent error).
        """
        with self._lock:
            if self.down:
                raise classify_smtp_error(
                    ConnectionRefusedError(111, "Connection refused (twin is down)")
                )
            if self._failures:
                raise self._failures.pop(0)
            refusal = simulated_refusal(to_address)
            if refusal is not None:
                code, text = refusal
                raise classify_smtp_error(
                    smtplib.SMTPRecipientsRefused({to_address: (code, text.encode())})
                )
            received = email.message_from_bytes(message.as_bytes(), policy=email.policy.default)
            if not isinstance(received, EmailMessage):  # pragma: no cover - policy.default
                raise TypeError("the message did not parse back as an EmailMessage")
            self.sent.append(SentMessage(from_address, to_address, received))

    def by_message_id(self) -> dict[str, int]:
        """How many accepted messages carry each Message-ID."""
        with self._lock:
            return dict(Counter(m.message_id for m in self.sent if m.message_id is not None))
