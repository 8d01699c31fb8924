"""What the invoicing worker tracks per assigned partition: one :class:`PartitionState` each.

A partition's state is created when it is assigned and dropped when it is
revoked or lost (:class:`streams.apps.invoicing.worker.InvoicingWorker` keeps them in
one dict, partition → state). Records of a partition are processed only while
its state holds a ``token`` (claimed, not fenced) and it has no job in flight
and no backoff running; otherwise the partition is paused, and ``rewind_to``
says where it restarts (records fetched while paused are dropped and fetched
again, never skipped). The one exception: the records a poll delivered after a close
marker are kept with its job (:attr:`PartitionState.ahead`) and, when the job
succeeds, handed to the next batch instead of being fetched again.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime

from streams.apps.invoicing.jobs import JobResult
from streams.core.billing.fencing import FencingToken
from streams.core.billing.rows import CloseMarker, Record

__all__ = ["FINALIZE_RETRY_S", "Ahead", "InvoiceJob", "PartitionState"]

#: Seconds before the grace timer produces a draft's finalisation marker again (the
#: first one was held, or is still on its way).
FINALIZE_RETRY_S = 60.0


@dataclass
class InvoiceJob:
    """The invoice jobs in flight for a partition (the partition is paused meanwhile):
    one per close marker of a run of markers that follow one another on the partition
    (``markers`` in offset order, ``futures`` index for index), all under ``token``,
    all cancelled by ``cancel``. The partition moves on once every one has reported
    (docs/architecture.md "Long jobs")."""

    markers: tuple[CloseMarker, ...]
    token: FencingToken
    cancel: threading.Event
    futures: tuple[Future[JobResult], ...]

    @property
    def marker(self) -> CloseMarker:
        """The first marker of the run (the offset the partition restarts from)."""
        return self.markers[0]

    def done(self) -> bool:
        """Whether every job of the run has ended."""
        return all(future.done() for future in self.futures)


@dataclass(frozen=True)
class Ahead:
    """The records one poll delivered after the close marker at ``marker_offset`` (the
    last marker of the run in flight), in the consumer's order, kept while the run's
    jobs run under ``token``."""

    token: FencingToken
    marker_offset: int
    records: list[Record]


@dataclass
class PartitionState:
    """One assigned partition, as the worker sees it.

    Attributes:
        partition: the partition number.
        token: the fencing token it was claimed under; None while unclaimed, after a
            refused claim or after a write was fenced (then nothing is processed).
        unclaimed: assigned but not (yet) claimed: paused, its claim refused or pending.
        pending_claim: a claim that failed on a database error, retried each poll.
        job: the invoice jobs in flight (one run of markers), if any.
        backoff_until: ``time.monotonic()`` before which it stays paused (after a
            transient error), or None.
        rewind_to: the offset to seek to when it resumes, or None (no seek).
        uncommitted: the next offset whose commit the broker refused (a rebalance in
            progress) while we kept the partition: retried each poll until it succeeds.
        resume_pending: its resume (and the seek to :attr:`rewind_to` before it) failed
            while we kept the partition: it stays paused and is resumed at the next poll
            with no job in flight and no backoff, so a failed seek never leaves it
            paused for good and never skips a record.
        drafts: the open drafts of the partition, (customer id, period) → the end of
            the grace period (UTC); loaded when it is claimed, kept as jobs report.
        drafts_loaded: whether :attr:`drafts` was read since the claim.
        finalize_requested: (customer id, period) → ``time.monotonic()`` when this
            owner produced the finalisation marker of the draft (the timer does not
            produce another before :data:`FINALIZE_RETRY_S`).
        rerate: customers whose late usage was stored since the last re-rating.
        ahead: the records fetched after the marker of the job in flight (the same
            poll), or None. Used only if that job succeeds under the same token:
            then they are the partition's next records; on every other outcome the
            partition seeks back and fetches them again.
    """

    partition: int
    token: FencingToken | None = None
    unclaimed: bool = False
    pending_claim: FencingToken | None = None
    job: InvoiceJob | None = None
    backoff_until: float | None = None
    rewind_to: int | None = None
    uncommitted: int | None = None
    resume_pending: bool = False
    drafts: dict[tuple[str, str], datetime] = field(default_factory=dict)
    drafts_loaded: bool = False
    finalize_requested: dict[tuple[str, str], float] = field(default_factory=dict)
    rerate: set[str] = field(default_factory=set)
    ahead: Ahead | None = None

    @property
    def owned(self) -> bool:
        """Claimed and not fenced: its records may be written under :attr:`token`."""
        return self.token is not None

    @property
    def claiming(self) -> bool:
        """Assigned, its claim refused or not done yet."""
        return self.unclaimed or self.pending_claim is not None

    def claimed(self, token: FencingToken) -> None:
        self.token = token
        self.unclaimed = False
        self.pending_claim = None

    def rewind_at_most(self, offset: int) -> None:
        """Restart no later than ``offset`` when it resumes (the lowest offset given wins)."""
        self.rewind_to = offset if self.rewind_to is None else min(self.rewind_to, offset)

    def take_rewind(self) -> int | None:
        """The offset to restart at (and forget it)."""
        offset, self.rewind_to = self.rewind_to, None
        return offset

    def commit_done(self, next_offset: int) -> None:
        """An offset commit of ``next_offset`` went through."""
        if self.uncommitted is not None and self.uncommitted <= next_offset:
            self.uncommitted = None

    def commit_refused(self, next_offset: int) -> None:
        """An offset commit of ``next_offset`` was refused: retry the highest one refused."""
        self.uncommitted = (
            next_offset if self.uncommitted is None else max(self.uncommitted, next_offset)
        )
