"""Errors of the mail port (:class:`~streams.core.billing.ports.MailTransport`): what the
SMTP adapter (:mod:`streams.adapters.smtp`) and its twin raise, and what the email
sender catches.

Tree (the email sender adds its own below these, in :mod:`streams.apps.email.errors`)::

    EmailError
    ├── TransientEmailError     retry later; the record's offset is NOT committed
    │   └── SmtpTransientError  connection refused/reset/timeout, a 4xx reply, a refusal
    │                           that would hit every email (connect, HELO, sender refused)
    └── PermanentEmailError     the same input fails again; recorded, offset committed
        └── SmtpPermanentError  a 5xx reply (recipient or message refused)

The split is the kernel's (:mod:`streams.core.billing.failures`).
"""

from __future__ import annotations

from streams.core.billing.failures import PermanentError, TransientError
from streams.errors import InvoicingError

__all__ = [
    "EmailError",
    "PermanentEmailError",
    "SmtpPermanentError",
    "SmtpTransientError",
    "TransientEmailError",
]


class EmailError(InvoicingError):
    """Root of the email sender's exceptions."""


class TransientEmailError(EmailError, TransientError):
    """A failure that may pass (SMTP or database unavailable): retry, never skip."""


class PermanentEmailError(EmailError, PermanentError):
    """A failure that repeats for the same input: record it and move on.

    ``reason`` is the short text stored in ``email_deliveries.skip_reason``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SmtpTransientError(TransientEmailError):
    """The SMTP server could not be reached or answered 4xx. ``code`` is the SMTP
    reply code, ``None`` for a connection-level failure."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class SmtpPermanentError(PermanentEmailError):
    """The SMTP server refused the message for good (5xx). ``code`` is the reply code."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason)
        self.code = code
