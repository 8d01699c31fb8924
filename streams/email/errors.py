"""Exceptions of the email sender.

Tree::

    EmailError
    ├── EmailConfigurationError the sender cannot start (bad from address, …)
    ├── TransientEmailError     retry later; the record's offset is NOT committed
    │   ├── SmtpTransientError  connection refused/reset/timeout, a 4xx reply, a refusal
    │   │                       that would hit every email (connect, HELO, sender refused)
    │   └── StoreUnavailable    PostgreSQL unreachable, lock timeout, serialization failure
    └── PermanentEmailError     the same input fails again; recorded, offset committed
        ├── RenderError         the document cannot become an email (bad recipient, currency)
        └── SmtpPermanentError  a 5xx reply (recipient or message refused)

The split is the kernel's (:mod:`streams.billing.failures`): ``TransientEmailError``
is a :class:`~streams.billing.failures.TransientError`, ``PermanentEmailError`` a
:class:`~streams.billing.failures.PermanentError`. Transient errors keep the record in Kafka (the sender seeks back to it and tries
again); permanent ones are written to ``email_deliveries`` as ``status='skipped'``
with a ``skip_reason`` saying why, so that they are auditable and found by
reconciliation (DESIGN "Outbox retention and reconciliation").
"""

from __future__ import annotations

from streams.billing.failures import PermanentError, TransientError


class EmailError(Exception):
    """Root of the email sender's exceptions."""


class EmailConfigurationError(EmailError):
    """The sender's configuration cannot work (e.g. an invalid from address); raised at start."""


class TransientEmailError(EmailError, TransientError):
    """A failure that may pass (SMTP or database unavailable): retry, never skip."""


class PermanentEmailError(EmailError, PermanentError):
    """A failure that repeats for the same input: record it and move on.

    ``reason`` is the short text stored in ``email_deliveries.skip_reason``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RenderError(PermanentEmailError):
    """The document cannot be rendered into an email (invalid recipient address,
    unknown currency, …)."""


class SmtpTransientError(TransientEmailError):
    """The SMTP server could not be reached or answered 4xx. ``code`` is the SMTP
    reply code, ``None`` for a connection-level failure."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class StoreUnavailable(TransientEmailError):
    """The ``email_deliveries`` store could not be used right now (connection lost,
    pool exhausted, lock timeout, serialization failure). ``sqlstate`` is the
    PostgreSQL SQLSTATE when there is one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class SmtpPermanentError(PermanentEmailError):
    """The SMTP server refused the message for good (5xx). ``code`` is the reply code."""

    def __init__(self, reason: str, code: int) -> None:
        super().__init__(reason)
        self.code = code
