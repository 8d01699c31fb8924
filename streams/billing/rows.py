"""Typed rows of the billing kernel: what the stores read and write (frozen dataclasses).

Pure: imports only the standard library and :mod:`streams.domain`. The stores
(:mod:`streams.billing.store`) map PostgreSQL rows onto these with psycopg's
``class_row``, so no caller reads a row by position.

Shapes: money is ``Decimal`` in the currency's units (``NUMERIC``); periods are
``YYYY-MM`` text; times are UTC-aware ``datetime``; currencies are ISO 4217
codes, trimmed (the columns are ``CHAR(3)``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TypedDict

from streams.domain.events import (
    EventData,
    SubscriptionEnded,
    SubscriptionEvent,
    UsageMetered,
    UsageRecorded,
)
from streams.domain.invoice import InvoiceTotals, TaxedLine, UsageLine
from streams.domain.money import canonical_decimal
from streams.domain.periods import BillingPeriod

__all__ = [
    "CloseMarker",
    "ClosePoint",
    "CreditNoteDraft",
    "Customer",
    "DeadLetterRecord",
    "Hold",
    "HoldRequest",
    "InvoiceDraft",
    "IssuedInvoice",
    "LateUsage",
    "LockedInvoice",
    "MeteredRecord",
    "RecordConflict",
    "SourceCoordinates",
    "StoredInvoice",
    "StoredInvoiceLine",
    "SubscriptionRecord",
    "UsageConflict",
    "UsageRecord",
    "payload_hash",
]


@dataclass(frozen=True)
class SourceCoordinates:
    """Where a record was read: topic, partition, offset."""

    topic: str
    partition: int
    offset: int


#: The decimal fields of ``usage.recorded``: hashed in canonical form.
_DECIMAL_FIELDS = ("amount", "quantity", "consumed_quantity")


def payload_hash(data: EventData) -> str:
    """SHA-256 of the event data's canonical JSON: equal facts, equal hash.

    Decimals are hashed in canonical form (:func:`~streams.domain.money.canonical_decimal`:
    ``1.0``, ``1.00`` and ``1`` are one amount), so a resend that writes an amount with
    another number of trailing zeros is a duplicate, not a conflict (issue 10); the
    decimals of ``usage.metered`` are canonical already (``"10"`` and ``"10.0"`` hash
    alike). Usage rows stored before this rule kept the hash of the written form; the
    usage store compares those by their stored columns
    (:func:`streams.billing.store.usage.insert_usage`).
    """
    dumped = data.model_dump(mode="json")
    if isinstance(data, UsageRecorded):
        for name in _DECIMAL_FIELDS:
            value = getattr(data, name, None)
            if isinstance(value, Decimal):
                dumped[name] = format(canonical_decimal(value), "f")
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class UsageRecord:
    """A ``usage.recorded`` event and where it was read, ready to be stored."""

    event_id: str
    data: UsageRecorded
    source: SourceCoordinates

    @property
    def payload_sha256(self) -> str:
        return payload_hash(self.data)


@dataclass(frozen=True)
class MeteredRecord:
    """A ``usage.metered`` event and where it was read, ready to be stored
    (``metered_usage``; its period is the UTC month of ``event_time``)."""

    event_id: str
    data: UsageMetered
    source: SourceCoordinates

    @property
    def payload_sha256(self) -> str:
        return payload_hash(self.data)

    @property
    def billing_period(self) -> str:
        return str(BillingPeriod.of(self.data.event_time))


@dataclass(frozen=True)
class SubscriptionRecord:
    """A ``subscription.*`` event and where it was read (``subscription_events``)."""

    event_id: str
    data: SubscriptionEvent
    source: SourceCoordinates

    @property
    def payload_sha256(self) -> str:
        return payload_hash(self.data)

    @property
    def plan(self) -> tuple[str | None, int | None]:
        """``(plan code, version)``; ``(None, None)`` for ``subscription.ended``."""
        if isinstance(self.data, SubscriptionEnded):
            return None, None
        return self.data.plan_code, self.data.plan_version


@dataclass(frozen=True)
class RecordConflict:
    """A metered or subscription event id already stored with a different payload
    (never overwritten): the record refused, the stored payload's hash and where the
    stored one was read. ``billing_period`` is what the hold names (None: every
    period, for a subscription event)."""

    record: MeteredRecord | SubscriptionRecord
    stored_sha256: str
    stored_source: SourceCoordinates

    @property
    def billing_period(self) -> str | None:
        return self.record.billing_period if isinstance(self.record, MeteredRecord) else None


@dataclass(frozen=True)
class UsageConflict:
    """An event id already stored with a different payload (never overwritten)."""

    record: UsageRecord
    stored_sha256: str
    stored_source: SourceCoordinates


@dataclass(frozen=True)
class Customer:
    """A ``customers`` row: who an invoice is addressed to, in which currency."""

    customer_id: str
    name: str
    email: str
    currency: str


@dataclass(frozen=True)
class Hold:
    """An unreleased ``invoice_holds`` row (``billing_period`` None: every period)."""

    hold_id: int
    customer_id: str
    billing_period: str | None
    reason: str
    source_topic: str
    source_partition: int
    source_offset: int
    created_at: datetime


@dataclass(frozen=True)
class DeadLetterRecord:
    """A ``dead_letters`` row (migration 0007): a record dead-lettered from its source
    coordinates to ``dlq_topic`` (and acknowledged there). ``kind`` is ``invalid``,
    ``conflict``, ``rejected`` or ``unwritable``; ``customers`` are the customers it
    holds (empty: unattributed)."""

    source_topic: str
    source_partition: int
    source_offset: int
    dlq_topic: str
    kind: str
    reason: str
    event_id: str | None
    customers: list[str]

    @property
    def source(self) -> SourceCoordinates:
        return SourceCoordinates(self.source_topic, self.source_partition, self.source_offset)


class HoldRequest(TypedDict):
    """A hold to write (:func:`streams.billing.store.holds.record_hold` takes it as
    keywords): the customer, the period (None: every period), why, the dead-lettered
    record's event id (if it had one) and where it was read."""

    customer_id: str
    billing_period: str | None
    reason: str
    event_id: str | None
    source: SourceCoordinates


@dataclass(frozen=True)
class IssuedInvoice:
    """The current (``status = 'issued'``) revision of a customer's invoice for a period."""

    invoice_id: str
    invoice_number: str
    revision: int
    status: str
    subtotal: Decimal
    total: Decimal


@dataclass(frozen=True)
class LockedInvoice:
    """The issued revision locked ``FOR UPDATE`` by a correction."""

    invoice_id: str
    revision: int


@dataclass(frozen=True)
class CloseMarker:
    """A ``billing_period.closed`` event and where it was read.

    ``lease_fencing_token`` is the fencing number of the close-period lease that
    produced it (recorded on the invoice), None for markers from elsewhere.
    """

    event_id: str
    customer_id: str
    billing_period: str
    reason: str
    source: SourceCoordinates
    lease_fencing_token: int | None = None


@dataclass(frozen=True)
class ClosePoint:
    """What a revision that no close marker triggered is built up to: a replay's
    correction records ``replay:<run id>`` and the end of the re-read window on
    the customer's partition (``invoices.close_event_id`` / ``source_*`` / ``close_offset``)."""

    event_id: str
    source: SourceCoordinates


@dataclass(frozen=True)
class InvoiceDraft:
    """Everything an invoice revision states, computed outside any transaction.

    ``marker`` is what the invoice was built up to: the worker's close marker, or
    a replay's :class:`ClosePoint` (its ``event_id`` goes to ``invoices.close_event_id``,
    its topic, partition and offset to ``invoices.source_*``/``close_offset``).
    """

    invoice_id: str
    revision: int
    customer: Customer
    billing_period: str
    totals: InvoiceTotals
    lines: tuple[UsageLine, ...]
    taxed: tuple[TaxedLine, ...]
    marker: CloseMarker | ClosePoint
    supersedes_invoice_id: str | None = None


@dataclass(frozen=True)
class CreditNoteDraft:
    """The credit note that cancels an issued revision (a replay's correction).

    Money in ``currency`` units: the credited revision's own amounts, as issued.
    ``invoice_number`` and ``revision`` are those of the credited revision.
    """

    credit_note_id: str
    invoice_id: str
    invoice_number: str
    revision: int
    customer: Customer
    billing_period: str
    currency: str
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    reason: str


@dataclass(frozen=True)
class StoredInvoice:
    """The head of a stored invoice revision (``invoices``), enough to rebuild its event."""

    invoice_id: str
    customer_id: str
    billing_period: str
    revision: int
    invoice_number: str
    customer_name: str
    email: str
    currency: str
    issued_at: datetime
    supersedes_invoice_id: str | None
    close_event_id: str
    source_topic: str
    source_partition: int
    close_offset: int


@dataclass(frozen=True)
class StoredInvoiceLine:
    """One ``invoice_lines`` row: the usage line as invoiced and the tax applied to it."""

    event_id: str
    amount: Decimal
    quantity: Decimal | None
    unit: str | None
    description: str | None
    sku_id: str | None
    region_id: str | None
    tax_code: str
    tax_rate: Decimal
    tax: Decimal
    source_topic: str
    source_partition: int
    source_offset: int


@dataclass(frozen=True)
class LateUsage:
    """A stored usage line that the customer's issued invoice of its period does not include.

    ``after_close`` is True when it was read at or after the offset of the close
    marker the issued revision was built up to (usage that arrived late); False
    means an earlier line the invoice lacks (a lost write; the replay will say).
    ``amount`` is exact, in ``currency`` units; ``recorded_at`` is when the worker
    stored it (UTC).
    """

    event_id: str
    customer_id: str
    billing_period: str
    amount: Decimal
    currency: str
    source_topic: str
    source_partition: int
    source_offset: int
    recorded_at: datetime
    invoice_id: str
    invoice_number: str
    revision: int
    after_close: bool
