"""The ports of the kernel's stores, fences and dead-letter sink, generic in the
connection type ``C`` (a psycopg connection, or the in-memory database's transaction).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Protocol, TypeVar

from streams.core.billing.fencing import CloseRequest, Fenced, FencingToken, LeaseFence
from streams.core.billing.rows import (
    CloseMarker,
    CreditNoteDraft,
    Customer,
    DeadLetterRecord,
    Draft,
    Hold,
    InvoiceDraft,
    IssuedInvoice,
    LateUsage,
    LockedInvoice,
    MeteredRecord,
    RecordConflict,
    SourceCoordinates,
    StoredInvoice,
    StoredInvoiceLine,
    SubscriptionRecord,
    UsageConflict,
    UsageRecord,
    UsageRow,
    UsageRowConflict,
)
from streams.core.billing.store.invoices import Document, OutboxEvent, UnsentInvoice
from streams.core.billing.store.metering import MeteredRead
from streams.core.domain.events import CustomerUpserted, EventData, SubscriptionEvent
from streams.core.domain.invoice import InvoiceTotals, UsageLine
from streams.core.domain.rating import PriceBook
from streams.core.domain.rating.published import Entry

#: The connection (transaction) type of one implementation of the stores.
C = TypeVar("C", contravariant=True)


class UsageStore(Protocol[C]):
    """``customers`` and ``usage_lines`` (:mod:`streams.core.billing.store.usage`)."""

    def upsert_customer(
        self,
        conn: C,
        event_id: str,
        data: CustomerUpserted,
        source: SourceCoordinates,
        event_time: datetime | None = None,
    ) -> None: ...
    def insert_usage(self, conn: C, records: Sequence[UsageRecord]) -> list[UsageConflict]: ...
    def insert_usage_rows(self, conn: C, rows: Sequence[UsageRow]) -> list[UsageRowConflict]: ...
    def get_customer(self, conn: C, customer_id: str) -> Customer | None: ...
    def customers(self, conn: C, ids: Sequence[str]) -> dict[str, Customer]: ...
    def usage_before(
        self,
        conn: C,
        customer_id: str,
        billing_period: str,
        topic: str,
        partition: int,
        before_offset: int,
    ) -> list[UsageLine]: ...
    def usage_elsewhere(
        self, conn: C, customer_id: str, billing_period: str, topic: str, partition: int
    ) -> list[UsageLine]: ...
    def stored_payloads(
        self, conn: C, event_ids: Sequence[str]
    ) -> dict[str, tuple[str, SourceCoordinates]]: ...
    def stored_usage_ids(self, conn: C, billing_period: str, topic: str) -> set[str]: ...
    def customers_with_usage(self, conn: C, billing_period: str, topic: str) -> set[str]: ...
    def late_usage(self, conn: C, period: str | None = None) -> list[LateUsage]: ...


class DeadLetterStore(Protocol[C]):
    """``dead_letters``: what a consumer dead-lettered, by source coordinates
    (:mod:`streams.core.billing.store.dead_letters`, migration 0007)."""

    def recorded(
        self, conn: C, topic: str, partition: int, offsets: Iterable[int]
    ) -> dict[int, DeadLetterRecord]: ...
    def record(self, conn: C, letters: Sequence[DeadLetterRecord]) -> None: ...


class InvoiceStore(Protocol[C]):
    """Invoices, lines, numbering, credit notes and the outbox
    (:mod:`streams.core.billing.store.invoices`)."""

    def next_number(self, conn: C, series: str) -> int: ...
    def number_invoice(self, conn: C, invoice_id: str, billing_period: str) -> str: ...
    def current_invoice(
        self, conn: C, customer_id: str, billing_period: str
    ) -> IssuedInvoice | None: ...
    def insert_invoice(
        self,
        conn: C,
        draft: InvoiceDraft,
        *,
        number: str,
        fence: tuple[str, int, str] | None,
        lease_fencing_token: int | None,
        issued_at: datetime,
        checked: FencingToken | None = None,
    ) -> bool: ...
    def lock_issued(
        self, conn: C, customer_id: str, billing_period: str
    ) -> LockedInvoice | None: ...
    def max_revision(self, conn: C, customer_id: str, billing_period: str) -> int: ...
    def revisions(self, conn: C, billing_period: str, topic: str) -> dict[str, int]: ...
    def supersede(self, conn: C, invoice_id: str) -> bool: ...
    def stored_invoice(self, conn: C, invoice_id: str) -> StoredInvoice | None: ...
    def stored_invoice_lines(self, conn: C, invoice_id: str) -> list[StoredInvoiceLine]: ...
    def documents(self, conn: C) -> list[Document]: ...
    def invoices_without_email(self, conn: C, grace: timedelta) -> list[UnsentInvoice]: ...
    def open_credit(self, conn: C, note: CreditNoteDraft) -> CreditNoteDraft: ...
    def insert_credit_note(
        self, conn: C, note: CreditNoteDraft, *, number: str, issued_at: datetime
    ) -> bool: ...
    def insert_outbox(
        self,
        conn: C,
        *,
        event_id: str,
        topic: str,
        customer_id: str,
        event: EventData,
        source: str,
        time: datetime,
        document_id: str,
    ) -> None: ...
    def insert_outbox_row(
        self,
        conn: C,
        *,
        event_id: str,
        topic: str,
        customer_id: str,
        event_type: str,
        payload: str,
        source: str,
        time: datetime,
        document_id: str,
    ) -> None: ...
    def latest_outbox_event(self, conn: C, document_id: str) -> OutboxEvent | None: ...


class HoldStore(Protocol[C]):
    """``invoice_holds`` (:mod:`streams.core.billing.store.holds`)."""

    def record_hold(
        self,
        conn: C,
        *,
        customer_id: str,
        billing_period: str | None,
        reason: str,
        event_id: str | None,
        source: SourceCoordinates,
    ) -> None: ...
    def open_holds(self, conn: C, customer_id: str, billing_period: str) -> list[Hold]: ...
    def has_open_hold(self, conn: C, customer_id: str, billing_period: str) -> bool: ...
    def held_customers(self, conn: C, billing_period: str) -> set[str]: ...


class CloseStore(Protocol[C]):
    """``period_closes`` (:mod:`streams.core.billing.store.closes`)."""

    def record_close(
        self, conn: C, marker: CloseMarker, outcome: str, invoice_id: str | None
    ) -> None: ...
    def closed_customers(self, conn: C, billing_period: str, topic: str) -> set[str]: ...


class DraftStore(Protocol[C]):
    """``invoice_drafts``: invoices in their grace period (:mod:`streams.core.billing.store.drafts`)."""

    def save_draft(
        self,
        conn: C,
        *,
        invoice_id: str,
        revision: int,
        marker: CloseMarker,
        watermark_offset: int,
        totals: InvoiceTotals,
        grace_hours: Decimal,
        grace_source: str,
        grace_ends_at: datetime,
        fence: tuple[int, str] | None,
    ) -> bool: ...
    def open_draft(
        self, conn: C, customer_id: str, billing_period: str, *, lock: bool = False
    ) -> Draft | None: ...
    def find_draft(self, conn: C, invoice_id: str) -> Draft | None: ...
    def open_drafts_on(self, conn: C, topic: str, partition: int) -> list[Draft]: ...
    def mark_finalized(
        self, conn: C, invoice_id: str, invoice_number: str, finalized_at: datetime
    ) -> bool: ...


class MeteringStore(Protocol[C]):
    """``metered_usage`` and ``subscription_events``, what the worker stores and the
    invoice job rates (:mod:`streams.core.billing.store.metering`)."""

    def insert_metered(self, conn: C, records: Sequence[MeteredRecord]) -> list[RecordConflict]: ...
    def insert_subscriptions(
        self, conn: C, records: Sequence[SubscriptionRecord]
    ) -> list[RecordConflict]: ...
    def metered_before(
        self,
        conn: C,
        customer_id: str,
        billing_period: str,
        topic: str,
        partition: int,
        before_offset: int,
    ) -> MeteredRead: ...
    def metered_elsewhere(
        self, conn: C, customer_id: str, billing_period: str, topic: str, partition: int
    ) -> MeteredRead: ...
    def subscriptions_before(
        self, conn: C, customer_id: str, topic: str, partition: int, before_offset: int
    ) -> list[SubscriptionEvent]: ...


class PriceBookStore(Protocol[C]):
    """The published price book (``billable_metrics``, ``plan_versions``;
    :mod:`streams.core.billing.store.pricing`), as the invoice job reads it."""

    def book_fingerprint(self, conn: C) -> tuple[int, int]: ...
    def published_book(self, conn: C) -> PriceBook: ...
    def insert_entries(self, conn: C, entries: list[Entry], *, published_by: str) -> int: ...


class FenceStore(Protocol[C]):
    """The three fences' tables (:mod:`streams.core.billing.fencing`)."""

    def claim(self, conn: C, token: FencingToken) -> None: ...
    def check(self, conn: C, token: FencingToken) -> None: ...
    def check_many(self, conn: C, tokens: Sequence[FencingToken]) -> list[Fenced]: ...
    def reset_group(self, conn: C, group_id: str) -> int: ...
    def check_lease_fence(self, conn: C, lease_name: str, token: int, holder: str) -> None: ...
    def lease_fence_floor(self, conn: C, lease_name: str) -> int: ...
    def request_close(
        self,
        conn: C,
        fence: LeaseFence,
        customer_id: str,
        billing_period: str,
        event_id: str,
    ) -> CloseRequest: ...
    def request_closes(
        self,
        conn: C,
        fence: LeaseFence,
        billing_period: str,
        requests: Sequence[tuple[str, str]],
    ) -> dict[str, CloseRequest]: ...


class DeadLetterSink(Protocol):
    """Where bad records go (:class:`streams.core.billing.dead_letters.DeadLetters`): returns
    once delivered, raises :class:`~streams.core.billing.dead_letters.DeadLetterError` otherwise."""

    #: The dead-letter topic (recorded in ``dead_letters`` with each letter).
    topic: str

    def publish(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        source_topic: str,
        source_partition: int,
        source_offset: int,
        kind: str,
        reason: str,
        attributed: bool = True,
    ) -> None: ...
