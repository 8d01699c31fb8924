"""Ports of the billing kernel: one ``Protocol`` per store, the fences and the dead-letter sink.

The stores are modules of functions that take an open connection first and run
inside the caller's transaction (docs/architecture.md "Decisions: stores are
functions of a connection"). A Protocol per store is therefore generic in the
connection type ``C``: the PostgreSQL modules of :mod:`streams.billing.store`
implement ``UsageStore[psycopg.Connection[Any]]`` and so on (mypy checks a module
against a Protocol; ``tests/unit/test_ports.py`` pins it), and an in-memory twin
implements the same Protocol over its own transaction object. Pure helpers that
touch no table (``invoice_number``, ``credit_note_number``) are not part of a port.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from streams.billing.fencing import CloseRequest, FencingToken, LeaseFence
from streams.billing.rows import (
    CloseMarker,
    CreditNoteDraft,
    Customer,
    Hold,
    InvoiceDraft,
    IssuedInvoice,
    LateUsage,
    LockedInvoice,
    SourceCoordinates,
    StoredInvoice,
    StoredInvoiceLine,
    UsageConflict,
    UsageRecord,
)
from streams.billing.store.invoices import Document, OutboxEvent, UnsentInvoice
from streams.domain.events import CustomerUpserted, EventData
from streams.domain.invoice import UsageLine

__all__ = [
    "CloseStore",
    "DeadLetterSink",
    "FenceStore",
    "HoldStore",
    "InvoiceStore",
    "UsageStore",
]

#: The connection (transaction) type of one implementation of the stores.
C = TypeVar("C", contravariant=True)


class UsageStore(Protocol[C]):
    """``customers`` and ``usage_lines`` (:mod:`streams.billing.store.usage`)."""

    def upsert_customer(
        self, conn: C, event_id: str, data: CustomerUpserted, source: SourceCoordinates
    ) -> None: ...
    def insert_usage(self, conn: C, records: Sequence[UsageRecord]) -> list[UsageConflict]: ...
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
    def stored_usage_ids(self, conn: C, billing_period: str, topic: str) -> set[str]: ...
    def customers_with_usage(self, conn: C, billing_period: str, topic: str) -> set[str]: ...
    def late_usage(self, conn: C, period: str | None = None) -> list[LateUsage]: ...


class InvoiceStore(Protocol[C]):
    """Invoices, lines, numbering, credit notes and the outbox
    (:mod:`streams.billing.store.invoices`)."""

    def next_number(self, conn: C, series: str) -> int: ...
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
    """``invoice_holds`` (:mod:`streams.billing.store.holds`)."""

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
    """``period_closes`` (:mod:`streams.billing.store.closes`)."""

    def record_close(
        self, conn: C, marker: CloseMarker, outcome: str, invoice_id: str | None
    ) -> None: ...
    def closed_customers(self, conn: C, billing_period: str, topic: str) -> set[str]: ...


class FenceStore(Protocol[C]):
    """The three fences' tables (:mod:`streams.billing.fencing`)."""

    def claim(self, conn: C, token: FencingToken) -> None: ...
    def check(self, conn: C, token: FencingToken) -> None: ...
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


class DeadLetterSink(Protocol):
    """Where bad records go (:class:`streams.billing.dead_letters.DeadLetters`): returns
    once delivered, raises :class:`~streams.billing.dead_letters.DeadLetterError` otherwise."""

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
