"""Twin of :class:`streams.apps.email.store.DeliveryStore` (the
:class:`~streams.apps.email.store.Deliveries` port): ``email_deliveries`` in an
:class:`~streams.adapters.memory.database.InMemoryDatabase` (the same database as
the billing store twins, so ``invoices_without_email`` sees the deliveries).

Kept as PostgreSQL has it: one row unique by ``event_id`` and by ``document_key``
(``ON CONFLICT DO NOTHING``); a claim of a document whose row is ``'sending'``
resumes it (``attempts`` + 1); ``deliver`` holds the row (the twin: the whole
database) for the length of the send and marks it in the same transaction, so a
second deliverer waits and then finds it final; a wait longer than
``lock_timeout_s`` and any database failure (``fail_next``, ``down``) raise
:class:`~streams.apps.email.errors.StoreUnavailable` with the SQLSTATE. Each method is
one transaction of its own. Statement names for
:meth:`~streams.adapters.memory.database.InMemoryDatabase.fail_next`:
``deliveries.claim``, ``deliveries.record_skipped``, ``deliveries.deliver``,
``deliveries.get``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Literal

import psycopg

from streams.adapters.memory.database import InMemoryDatabase, Statement
from streams.adapters.memory.store import dead_letters
from streams.adapters.memory.store.tables import EMAIL_DELIVERIES, as_uuid
from streams.apps.email.errors import PermanentEmailError, StoreUnavailable
from streams.apps.email.store import (
    Claim,
    ClaimKind,
    Delivered,
    DeliverOutcome,
    DeliveryRow,
    DeliveryStatus,
    NewDelivery,
)
from streams.core.billing.rows import DeadLetterRecord, SourceCoordinates

__all__ = ["InMemoryDeliveryStore"]


class InMemoryDeliveryStore:
    """``email_deliveries`` on an :class:`InMemoryDatabase` (module docstring).

    Args:
        db: the database (default: a new one).
        lock_timeout_s: longest wait for the row held by another deliverer (seconds).
    """

    def __init__(self, db: InMemoryDatabase | None = None, *, lock_timeout_s: float = 10.0) -> None:
        self.db = db if db is not None else InMemoryDatabase()
        self._lock_timeout_s = lock_timeout_s

    @contextmanager
    def _statement(self, name: str) -> Iterator[Statement]:
        """One transaction of one statement, committed on exit; failures wrapped."""
        try:
            with (
                self.db.connection() as conn,
                conn.statement(f"deliveries.{name}", lock_timeout_s=self._lock_timeout_s) as stmt,
            ):
                yield stmt
        except psycopg.OperationalError as exc:  # LockNotAvailable is one
            raise StoreUnavailable(
                f"email_deliveries unavailable: {type(exc).__name__}: {exc}", exc.sqlstate
            ) from exc

    @staticmethod
    def _by_document(stmt: Statement, document_key: str) -> DeliveryRow | None:
        for row in stmt.table(EMAIL_DELIVERIES).values():
            if row.document_key == document_key:
                found: DeliveryRow = row
                return found
        return None

    def _insert(
        self, stmt: Statement, new: NewDelivery, status: DeliveryStatus, skip_reason: str | None
    ) -> DeliveryRow | None:
        table = stmt.table(EMAIL_DELIVERIES)
        ref = new.ref
        document_id = as_uuid(stmt, ref.document_id, "document_id")
        if new.event_id in table or self._by_document(stmt, ref.document_key) is not None:
            return None
        row = DeliveryRow(
            event_id=new.event_id,
            document_key=ref.document_key,
            document_type=ref.document_type,
            document_id=document_id,
            customer_id=ref.customer_id,
            recipient=ref.recipient,
            message_id=ref.message_id,
            status=status,
            skip_reason=skip_reason,
            attempts=1 if status == "sending" else 0,
            source_topic=new.source_topic,
            source_partition=new.source_partition,
            source_offset=new.source_offset,
            claimed_at=stmt.now,
            sent_at=None,
        )
        table[new.event_id] = row
        return row

    def _existing(self, stmt: Statement, new: NewDelivery) -> Claim:
        row = self._by_document(stmt, new.ref.document_key) or stmt.table(EMAIL_DELIVERIES).get(
            new.event_id
        )
        if row is None:
            raise StoreUnavailable("email_deliveries row vanished after a conflict; retry")
        matched: Literal["event_id", "document"] = (
            "event_id" if row.event_id == new.event_id else "document"
        )
        return Claim(ClaimKind.DUPLICATE, row, matched)

    def _update(self, stmt: Statement, row: DeliveryRow, **changes: object) -> DeliveryRow:
        updated = replace(row, **changes)  # type: ignore[arg-type]
        stmt.table(EMAIL_DELIVERIES)[row.event_id] = updated
        return updated

    def claim(self, new: NewDelivery) -> Claim:
        """See :meth:`streams.apps.email.store.DeliveryStore.claim`."""
        with self._statement("claim") as stmt:
            row = self._insert(stmt, new, "sending", None)
            if row is not None:
                return Claim(ClaimKind.NEW, row)
            sending = self._by_document(stmt, new.ref.document_key)
            if sending is not None and sending.status == "sending":
                return Claim(
                    ClaimKind.RESUMED, self._update(stmt, sending, attempts=sending.attempts + 1)
                )
            return self._existing(stmt, new)

    def record_skipped(self, new: NewDelivery, reason: str) -> Claim:
        """See :meth:`streams.apps.email.store.DeliveryStore.record_skipped`."""
        with self._statement("record_skipped") as stmt:
            row = self._insert(stmt, new, "skipped", reason)
            if row is not None:
                return Claim(ClaimKind.NEW, row)
            sending = self._by_document(stmt, new.ref.document_key)
            if sending is not None and sending.status == "sending":
                return Claim(
                    ClaimKind.NEW,
                    self._update(stmt, sending, status="skipped", skip_reason=reason),
                )
            return self._existing(stmt, new)

    def dead_lettered(self, source: SourceCoordinates) -> bool:
        """See :meth:`streams.apps.email.store.DeliveryStore.dead_lettered`."""
        try:
            with self.db.connection() as conn:
                return bool(
                    dead_letters.recorded(conn, source.topic, source.partition, [source.offset])
                )
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"dead_letters unavailable: {type(exc).__name__}: {exc}", exc.sqlstate
            ) from exc

    def record_dead_letter(self, letter: DeadLetterRecord) -> None:
        """See :meth:`streams.apps.email.store.DeliveryStore.record_dead_letter`."""
        try:
            with self.db.connection() as conn:
                dead_letters.record(conn, [letter])
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"dead_letters unavailable: {type(exc).__name__}: {exc}", exc.sqlstate
            ) from exc

    def deliver(self, document_key: str, send: Callable[[], None]) -> Delivered:
        """See :meth:`streams.apps.email.store.DeliveryStore.deliver`."""
        with self._statement("deliver") as stmt:
            row = self._by_document(stmt, document_key)
            if row is None:
                raise StoreUnavailable(f"no email_deliveries row for {document_key}; retry")
            if row.status != "sending":
                return Delivered(DeliverOutcome.ALREADY_FINAL, row)
            try:
                send()
            except PermanentEmailError as exc:
                marked = self._update(stmt, row, status="skipped", skip_reason=exc.reason)
                return Delivered(DeliverOutcome.REJECTED, marked)
            marked = self._update(stmt, row, status="sent", sent_at=stmt.now)
            return Delivered(DeliverOutcome.SENT, marked)

    def get(
        self, *, event_id: str | None = None, document_key: str | None = None
    ) -> DeliveryRow | None:
        """See :meth:`streams.apps.email.store.DeliveryStore.get`."""
        if (event_id is None) == (document_key is None):
            raise ValueError("give exactly one of event_id, document_key")
        with self._statement("get") as stmt:
            if event_id is not None:
                found: DeliveryRow | None = stmt.table(EMAIL_DELIVERIES).get(event_id)
                return found
            assert document_key is not None
            return self._by_document(stmt, document_key)
