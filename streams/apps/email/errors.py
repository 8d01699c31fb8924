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

The split is the kernel's (:mod:`streams.core.billing.failures`): ``TransientEmailError``
is a :class:`~streams.core.billing.failures.TransientError`, ``PermanentEmailError`` a
:class:`~streams.core.billing.failures.PermanentError`. Transient errors keep the record in Kafka (the sender seeks back to it and tries
again); permanent ones are written to ``email_deliveries`` as ``status='skipped'``
with a ``skip_reason`` saying why, so that they are auditable and found by
reconciliation (docs/design.md "Outbox retention and reconciliation").
"""

from __future__ import annotations

from streams.core.billing.mail_errors import (
    EmailError,
    PermanentEmailError,
    SmtpPermanentError,
    SmtpTransientError,
    TransientEmailError,
)

__all__ = [
    "EmailConfigurationError",
    "EmailError",
    "PermanentEmailError",
    "RenderError",
    "SmtpPermanentError",
    "SmtpTransientError",
    "StoreUnavailable",
    "TransientEmailError",
]


class EmailConfigurationError(EmailError):
    """The sender's configuration cannot work (e.g. an invalid from address); raised at start."""


class RenderError(PermanentEmailError):
    """The document cannot be rendered into an email (invalid recipient address,
    unknown currency, …)."""


class StoreUnavailable(TransientEmailError):
    """The ``email_deliveries`` store could not be used right now (connection lost,
    pool exhausted, lock timeout, serialization failure). ``sqlstate`` is the
    PostgreSQL SQLSTATE when there is one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
