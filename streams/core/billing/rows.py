"""Typed rows of the billing kernel: what the stores read and write (frozen dataclasses).

Pure: imports only the standard library and :mod:`streams.core.domain`. The stores
(:mod:`streams.core.billing.store`) map PostgreSQL rows onto these with psycopg's
``class_row``, so no caller reads a row by position.

Shapes: money is ``Decimal`` in the currency's units (``NUMERIC``); periods are
``YYYY-MM`` text; times are UTC-aware ``datetime``; currencies are ISO 4217
codes, trimmed (the columns are ``CHAR(3)``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple, TypedDict

from streams.core.domain.events import (
    EventData,
    SubscriptionEnded,
    SubscriptionEvent,
    UsageMetered,
    UsageRecorded,
    datetime_json,
)
from streams.core.domain.fastcodec import FastUsage, usage_data
from streams.core.domain.invoice import InvoiceTotals, TaxedLine, UsageLine
from streams.core.domain.money import canonical_decimal
from streams.core.domain.periods import BillingPeriod

__all__ = [
    "PAYLOAD_HASH_KEYS",
    "CloseMarker",
    "ClosePoint",
    "CreditNoteDraft",
    "Customer",
    "DeadLetterRecord",
    "Draft",
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
    "UsageRow",
    "UsageRowConflict",
    "canonical_json",
    "payload_hash",
    "payload_hash_reference",
]


@dataclass(frozen=True, slots=True)
class SourceCoordinates:
    """Where a record was read: topic, partition, offset."""

    topic: str
    partition: int
    offset: int


#: The decimal fields of ``usage.recorded``: hashed in canonical form.
_DECIMAL_FIELDS = ("amount", "quantity", "consumed_quantity")


def payload_hash(data: EventData) -> str:
    """SHA-256 of the event data's canonical JSON: equal facts, equal hash.

    Decimals are hashed in canonical form (:func:`~streams.core.domain.money.canonical_decimal`:
    ``1.0``, ``1.00`` and ``1`` are one amount), so a resend that writes an amount with
    another number of trailing zeros is a duplicate, not a conflict; the
    decimals of ``usage.metered`` are canonical already (``"10"`` and ``"10.0"`` hash
    alike). Usage rows stored before this rule kept the hash of the written form; the
    usage store compares those by their stored columns
    (:func:`streams.core.billing.store.usage.insert_usage`). The text is
    :func:`payload_hash_reference`'s; for ``usage.recorded`` (the hot path) it is written
    by :func:`canonical_json`, the same text, faster
    (docs/decisions/0093-hot-path-usage-writes.md).
    """
    if type(data) is UsageRecorded:
        return hashlib.sha256(canonical_json(data).encode()).hexdigest()
    return payload_hash_reference(data)


def _dec(value: Decimal) -> str:
    return format(canonical_decimal(value), "f")


def _plain(value: Decimal) -> str:
    return format(value, "f")


def _usage_json(data: UsageRecorded, dec: Callable[[Decimal], str]) -> str:
    q = data.quantity
    c = data.consumed_quantity
    return (
        f'{{"amount":"{dec(data.amount)}"'
        f',"billing_period":{_ascii(data.billing_period)}'
        f',"charge_category":{_ascii_opt(data.charge_category)}'
        f',"consumed_quantity":{"null" if c is None else _quoted(dec(c))}'
        f',"consumed_unit":{_ascii_opt(data.consumed_unit)}'
        f',"currency":{_ascii(data.currency)}'
        f',"customer_id":{_ascii(data.customer_id)}'
        f',"description":{_ascii_opt(data.description)}'
        f',"event_time":{_ascii(_time_json(data.event_time))}'
        f',"provider":{_ascii_opt(data.provider)}'
        f',"quantity":{"null" if q is None else _quoted(dec(q))}'
        f',"region_id":{_ascii_opt(data.region_id)}'
        f',"schema_version":{int(data.schema_version)}'
        f',"sku_id":{_ascii_opt(data.sku_id)}'
        f',"unit":{_ascii_opt(data.unit)}}}'
    )


def canonical_json(data: UsageRecorded) -> str:
    """The event data's canonical JSON, the text :func:`payload_hash` hashes.

    The canonical JSON is :func:`payload_hash_reference`'s: ``json.dumps`` of the model's
    JSON dump with the decimals in canonical form, ``sort_keys=True``,
    ``separators=(",", ":")``. Written out here field by field, in sorted key order, with
    the same escaping (ASCII, ``json``'s C encoder) and the model's JSON forms
    (date-times pydantic's, once per distinct value): about 5x faster than dumping the
    model. A test checks it against the reference on varied data and that it
    names every model field.
    """
    return _usage_json(data, _dec)


def written_json(data: UsageRecorded) -> str:
    """The event data as :func:`canonical_json` writes it, but with the decimals as
    written (``1.00`` stays ``1.00``): what the usage store inserts, so a stored amount
    keeps the scale it was sent with."""
    return _usage_json(data, _plain)


#: The keys :func:`canonical_json` writes, in its order (checked against the model).
PAYLOAD_HASH_KEYS: tuple[str, ...] = (
    "amount",
    "billing_period",
    "charge_category",
    "consumed_quantity",
    "consumed_unit",
    "currency",
    "customer_id",
    "description",
    "event_time",
    "provider",
    "quantity",
    "region_id",
    "schema_version",
    "sku_id",
    "unit",
)


def payload_hash_reference(data: EventData) -> str:
    """The definition :func:`payload_hash` implements (slow: a model dump per call)."""
    dumped = data.model_dump(mode="json")
    if isinstance(data, UsageRecorded):
        for name in _DECIMAL_FIELDS:
            value = getattr(data, name, None)
            if isinstance(value, Decimal):
                dumped[name] = format(canonical_decimal(value), "f")
    canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


_ascii: Callable[[str], str] = json.encoder.encode_basestring_ascii


def _ascii_opt(text: str | None) -> str:
    return "null" if text is None else _ascii(text)


def _quoted(decimal_text: str) -> str:
    return f'"{decimal_text}"'  # a decimal's text has nothing to escape


_TIME_MEMO: dict[datetime, str] = {}


def _time_json(value: datetime) -> str:
    found = _TIME_MEMO.get(value)
    if found is None:
        found = datetime_json(value)
        if len(_TIME_MEMO) >= 4096:
            _TIME_MEMO.clear()
        _TIME_MEMO[value] = found
    return found


@dataclass(frozen=True)
class UsageRecord:
    """A ``usage.recorded`` event and where it was read, ready to be stored."""

    event_id: str
    data: UsageRecorded
    source: SourceCoordinates

    @functools.cached_property
    def payload_json(self) -> str:
        """:func:`written_json` of :attr:`data` (computed once): the row to store."""
        return written_json(self.data)

    @functools.cached_property
    def payload_sha256(self) -> str:
        """:func:`payload_hash` of :attr:`data` (computed once)."""
        return payload_hash(self.data)


class UsageRow(NamedTuple):
    """A ``usage.recorded`` record as the hot path stores it (no model object): the
    values of :data:`streams.core.domain.fastcodec.USAGE_VALUES` as text (decimals and
    ``event_time`` as written; None where absent), ``event_time`` parsed (UTC),
    ``payload_sha256`` the SHA-256 of the record's value bytes as received, and where
    it was read. Built by the worker from :func:`streams.core.domain.fastcodec.decode_usage`."""

    event_id: str
    values: tuple[str | None, ...]
    event_time: datetime
    payload_sha256: str
    source: SourceCoordinates
    #: Lineage: the API key that sent it through the ingest edge (the record header
    #: ``invoicing_key_id``), None for records of other producers.
    key_id: str | None = None

    def canonical_sha256(self) -> str:
        """:func:`payload_hash` of the data (the rule duplicates are judged by when the
        raw digests differ); slow, for the conflict path only."""
        return payload_hash(usage_data(FastUsage(self.event_id, self.values, self.event_time)))


@dataclass(frozen=True)
class UsageRowConflict:
    """A row whose event id is stored (or first in its batch) with another payload:
    the row refused, where the kept one was read."""

    row: UsageRow
    stored_source: SourceCoordinates


@dataclass(frozen=True)
class MeteredRecord:
    """A ``usage.metered`` event and where it was read, ready to be stored
    (``metered_usage``; its period is the UTC month of ``event_time``)."""

    event_id: str
    data: UsageMetered
    source: SourceCoordinates
    #: Lineage: the API key that sent it through the ingest edge, if it came that way.
    key_id: str | None = None

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
    """A ``customers`` row: who an invoice is addressed to, in which currency, and its
    grace period in hours (None: the customer states none; docs/invoices.md "Drafts and
    finalisation")."""

    customer_id: str
    name: str
    email: str
    currency: str
    invoice_grace_hours: Decimal | None = None


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
    """A hold to write (:func:`streams.core.billing.store.holds.record_hold` takes it as
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


class Record(NamedTuple):
    """A consumed record as plain typed values (the boundary between librdkafka's
    ``Message`` and our code). Headers keep their order; ``None`` values become b"".

    A named tuple, not a frozen dataclass: one is built per consumed record, and a
    frozen dataclass sets each of its seven fields through ``object.__setattr__``
    (0.71 µs against 0.24 µs here; docs/benchmarks.md "Ingest: per-record trims
    (2026-12-08)"). Immutable either way."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class Draft:
    """An ``invoice_drafts`` row. ``status`` is ``draft`` or ``finalized``;
    ``grace_ends_at`` (UTC) is when the owning worker finalises it by itself;
    ``watermark_offset`` is the offset of ``source_topic[source_partition]`` it was
    last rated up to (exclusive); ``rerated`` counts re-ratings after the first."""

    invoice_id: str
    customer_id: str
    billing_period: str
    revision: int
    status: str
    grace_hours: Decimal
    grace_source: str
    grace_ends_at: datetime
    currency: str
    line_count: int
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    rerated: int
    close_event_id: str
    lease_fencing_token: int | None
    source_topic: str
    source_partition: int
    close_offset: int
    watermark_offset: int
    created_at: datetime
    updated_at: datetime
    finalized_at: datetime | None
    invoice_number: str | None
