"""What an invoice job is given and what it returns (:mod:`streams.apps.invoicing.jobs`).

Kept apart from the job so that its parts (:mod:`streams.apps.invoicing.draft_job`)
and the poll loop share them without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from streams.core.billing import fencing, rows
from streams.core.billing.ports import Database, TaxService
from streams.core.billing.rating import PriceBooks
from streams.core.billing.stores import POSTGRES, Stores

#: CloudEvents ``source`` of events the invoicing workers publish.
EVENT_SOURCE = "/invoicing/worker"


class Outcome(Enum):
    INVOICED = "invoiced"
    ALREADY_INVOICED = "already_invoiced"
    HELD = "held"
    RETRY = "retry"
    #: another writer (a replay) committed this revision's tax document and has not
    #: written its invoice yet: retry later, then find its invoice
    CONTENDED = "contended"
    FAILED = "failed"
    CANCELLED = "cancelled"
    FENCED = "fenced"
    #: the close made a draft, or re-rated the open one (docs/invoices.md "Drafts and
    #: finalisation"): no number, no event, no email yet
    DRAFTED = "drafted"


@dataclass(frozen=True)
class JobResult:
    """What a job did, for the poll thread: commit the marker's offset unless RETRY,
    CONTENDED, FENCED or CANCELLED; FAILED means dead-letter the marker and hold the
    customer."""

    marker: rows.CloseMarker
    token: fencing.FencingToken
    outcome: Outcome
    detail: str = ""
    invoice_id: str | None = None
    invoice_number: str | None = None
    seconds: float = 0.0
    #: DRAFTED: when the draft's grace period ends (UTC), for the owner's timer
    draft_due: datetime | None = None


@dataclass(frozen=True)
class JobContext:
    """What a job needs: the pool, the tax service, the invoice topic name, and the
    store implementations the pool's connections take (default: PostgreSQL), and the
    published price book's cache (shared by the worker's jobs)."""

    pool: Database[Any]
    tax: TaxService
    invoices_topic: str
    stores: Stores[Any] = POSTGRES
    price_books: PriceBooks = field(default_factory=PriceBooks)
