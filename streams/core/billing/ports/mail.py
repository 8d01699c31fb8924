"""The mail transport's port (its errors: :mod:`streams.core.billing.mail_errors`)."""

from __future__ import annotations

from email.message import EmailMessage
from typing import Protocol


class MailTransport(Protocol):
    """Sends one email message to one envelope recipient.

    ``send(message, from_address=…, to_address=…)`` hands ``message`` (an
    :class:`email.message.EmailMessage` with its headers, ``Message-ID`` included,
    as built by :mod:`streams.apps.email.render`) to the relay with the given SMTP
    envelope. When it returns, the message is accepted: it will be received once,
    with its ``Message-ID`` and headers unchanged. A message whose send raised may be
    sent again (the ``Message-ID`` derives from the document, so a resend is
    recognisable).

    Raises:
        streams.apps.email.errors.SmtpTransientError: retry later: the relay is down or
            unreachable, timed out, answered 4xx, or refused what every message
            needs (connect, HELO, the sender). ``code`` is the SMTP reply code or
            ``None``.
        streams.apps.email.errors.SmtpPermanentError: this message is refused for good
            (a 5xx for the recipient or the data, or a feature it needs is missing).
            ``code`` is the SMTP reply code.
    """

    def send(self, message: EmailMessage, *, from_address: str, to_address: str) -> None:
        """Deliver ``message`` (see the class docstring)."""
        ...
