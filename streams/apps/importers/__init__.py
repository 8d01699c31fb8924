"""Importers and operator jobs that produce account events: FOCUS CSV import, CloudEvents
JSON-lines import (``import events``), close-period.

Exceptions of this package::

    ImporterError               root; ``transient`` says whether a retry may succeed
    ├── SourceUnreadable        permanent: the input file is missing or not FOCUS 1.0
    ├── KafkaUnavailable        transient: the broker or the topic's metadata did not answer
    ├── TopicMissing            permanent: the target topic does not exist (create it first)
    └── CloseAborted            close-period stopped part-way: lease lost or fenced
                                (defined in close_period.py, with the partial summary)

The lease errors of close-period (:class:`streams.adapters.lease.LeaseBusy`,
:class:`~streams.adapters.lease.LeaseUnavailable`,
:class:`~streams.adapters.lease.LeaseLost`) propagate unchanged: they belong to
the lease library's tree, and the CLI maps them to exit codes.
"""

from __future__ import annotations

from typing import ClassVar

from streams.errors import InvoicingError


class ImporterError(InvoicingError):
    """Root of the importers' exceptions."""

    transient: ClassVar[bool] = False


class SourceUnreadable(ImporterError):
    """The input cannot be imported at all: missing file, or a header that is not FOCUS 1.0."""


class KafkaUnavailable(ImporterError):
    """The Kafka cluster did not answer (metadata request timed out)."""

    transient: ClassVar[bool] = True


class TopicMissing(ImporterError):
    """The target topic does not exist; nothing was produced (``invoicing topics create``)."""
