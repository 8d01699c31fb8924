"""Errors of the local stack commands.

Tree::

    StackError                 root: a message an operator can act on
    ├── MissingPackage         a required OS package is absent (names the apt-get line)
    └── ServiceUnhealthy       a service did not pass its health check in time
"""

from __future__ import annotations

from streams.errors import InvoicingError


class StackError(InvoicingError):
    """Root of ``invoicing stack`` errors; the message names the service and its log."""


class MissingPackage(StackError):
    """An OS package the stack needs is not installed and could not be installed."""


class ServiceUnhealthy(StackError):
    """A service did not become healthy within its timeout."""

    def __init__(self, service: str, detail: str, log: str) -> None:
        super().__init__(f"{service} is not healthy: {detail}; its log: {log}")
        self.service = service
        self.detail = detail
        self.log = log
