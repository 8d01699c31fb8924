"""Exceptions of ``invoicing replay`` (package :mod:`streams.apps.replay`).

Tree::

    ReplayError                 root; ``transient`` says whether running again may succeed
    ├── ReplayUnavailable       transient: Kafka did not answer (metadata, offsets, a stalled read)
    ├── ReplayAborted           transient: the lease was lost or fenced part-way; an apply
    │                           run stays 'running' and the next --apply resumes it
    └── ReplayStateError        permanent: the stored run state contradicts the request
                                (e.g. a running apply of the period over another topic)

The lease errors (:class:`streams.adapters.lease.LeaseBusy`,
:class:`~streams.adapters.lease.LeaseUnavailable`) propagate unchanged before
anything is read or written, as in ``close-period``; the CLI maps them to exit
codes. Per-customer failures (tax service, invoice rules) do not raise: they
are results of the run (see :class:`streams.apps.replay.report.CustomerOutcome`).
"""

from __future__ import annotations

from typing import ClassVar

from streams.errors import InvoicingError


class ReplayError(InvoicingError):
    """Root of the replay's exceptions."""

    transient: ClassVar[bool] = False


class ReplayUnavailable(ReplayError):
    """Kafka did not answer (metadata, ``offsets_for_times``, watermarks) or the re-read stalled."""

    transient: ClassVar[bool] = True


class ReplayAborted(ReplayError):
    """The run stopped part-way because its lease was lost or fenced (see ``__cause__``).

    ``run_id`` names the run; an apply run stays ``running`` and is resumed by
    the next ``invoicing replay PERIOD --apply``.
    """

    transient: ClassVar[bool] = True

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class ReplayStateError(ReplayError):
    """The stored state of a run does not fit the request (a programming or operator error)."""
