"""The lease's exceptions, raised by the Redis lease (:mod:`streams.adapters.lease`) and
the lease fence (:mod:`streams.core.billing.fencing`), and caught by the kernel's
failure table: they live in the core because its callers catch them
(docs/architecture.md, "Layers and import rules").

Tree::

    LeaseError          root; ``transient`` says whether the same call may succeed later
    ├── LeaseUnavailable  Redis unreachable while acquiring: nothing is held (transient)
    ├── LeaseBusy         another holder has the lease (transient)
    ├── LeaseLost         the lease ended while its holder still ran: stop the job
    ├── LeaseFenced       the database recorded a higher fencing number: writes refused
    └── LeaseStoreError   a database error while reading or checking a fence (transient)
"""

from __future__ import annotations

from typing import ClassVar

from streams.errors import InvoicingError

__all__ = [
    "LeaseBusy",
    "LeaseError",
    "LeaseFenced",
    "LeaseLost",
    "LeaseStoreError",
    "LeaseUnavailable",
]


class LeaseError(InvoicingError):
    """Root of the lease library's exceptions.

    ``transient`` says whether the same call may succeed later unchanged.
    """

    transient: ClassVar[bool] = False

    def __init__(self, message: str, *, lease: str) -> None:
        super().__init__(message)
        self.lease = lease


class LeaseUnavailable(LeaseError):
    """Redis could not be reached (or answered an error) while acquiring: nothing is held."""

    transient: ClassVar[bool] = True


class LeaseBusy(LeaseError):
    """Another holder has the lease.

    Attributes:
        holder: the current holder's name as stored with its token (``None`` when
            the key vanished between the attempt and the look-up, or is not ours).
        ttl_ms: the lease's remaining time to live in milliseconds, if known.
    """

    transient: ClassVar[bool] = True

    def __init__(self, message: str, *, lease: str, holder: str | None, ttl_ms: int | None) -> None:
        super().__init__(message, lease=lease)
        self.holder = holder
        self.ttl_ms = ttl_ms


class LeaseLost(LeaseError):
    """The lease ended while its holder still ran; ``reason`` says how. Stop the job."""

    def __init__(self, message: str, *, lease: str, reason: str) -> None:
        super().__init__(message, lease=lease)
        self.reason = reason


class LeaseFenced(LeaseError):
    """The database recorded a higher fencing number for the lease: a newer holder
    exists, and this holder's writes are refused (the caller's transaction must roll back).

    Attributes:
        token: the number that was refused.
        current_token: the highest number recorded.
        current_holder: the holder that recorded it.
    """

    def __init__(
        self, message: str, *, lease: str, token: int, current_token: int, current_holder: str
    ) -> None:
        super().__init__(message, lease=lease)
        self.token = token
        self.current_token = current_token
        self.current_holder = current_holder


class LeaseStoreError(LeaseError):
    """A database error while reading or checking a fence; ``sqlstate`` keeps its code."""

    transient: ClassVar[bool] = True

    def __init__(self, message: str, *, lease: str, sqlstate: str | None) -> None:
        super().__init__(message, lease=lease)
        self.sqlstate = sqlstate
