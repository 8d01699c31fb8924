"""Exceptions of the pure domain.

Tree::

    DomainError
    ├── InvalidEvent          a record that cannot become an event (dead-letter it)
    ├── InvalidAmount         money.py
    ├── UnknownCurrency       money.py
    ├── InvalidPeriod         periods.py
    └── InvoiceRuleViolation  invoice computation refused its input

All are *permanent*: retrying the same input gives the same error, so the
caller dead-letters or reports instead of retrying.
"""

from __future__ import annotations


class DomainError(Exception):
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
