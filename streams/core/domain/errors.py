"""Exceptions of the pure domain.

Tree::

    DomainError
    ├── InvalidEvent          a record that cannot become an event (dead-letter it)
    ├── InvalidAmount         money.py
    ├── UnknownCurrency       money.py
    ├── InvalidPeriod         periods.py
    ├── InvoiceRuleViolation  invoice computation refused its input
    └── FocusFormatError      a FOCUS CSV whose header cannot be read (focus.py)

All are *permanent*: retrying the same input gives the same error, so the
caller dead-letters or reports instead of retrying.
"""

from __future__ import annotations

from streams.errors import InvoicingError


class DomainError(InvoicingError):
    """Root of the domain's exceptions. Permanent: the same input fails again."""


class InvalidEvent(DomainError):
    """A record that does not decode into a valid event; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class InvalidPeriod(DomainError):
    """A billing period that is not a valid ``YYYY-MM``."""


class InvoiceRuleViolation(DomainError):
    """Invoice computation refused its input (mixed currencies, missing tax, …)."""


class FocusFormatError(DomainError):
    """A FOCUS CSV that cannot be imported at all: no header, or required columns missing.

    ``missing`` lists the required columns the header lacks (empty when the
    header itself is absent or unreadable).
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing
