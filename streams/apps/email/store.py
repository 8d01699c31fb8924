"""``email_deliveries``: the email sender's claim-before-send, mark-after table (PostgreSQL).

Table (migration 0001): one row per document email, unique by ``event_id``
(the outbox event id, primary key) **and** by ``document_key``
(``invoice:{id}:r{revision}`` / ``credit_note:{id}``), so that both a redelivered
event and a republished event with a new id for the same document find the row.
``status`` is ``'sending'`` (claimed, the email may or may not have left),
``'sent'`` (``sent_at`` set) or ``'skipped'`` (``skip_reason`` says why: a zero
total, a permanent SMTP refusal, a document that cannot be rendered).

``attempts`` counts the deliveries begun for the row: 1 at the first claim, +1
each time a delivery finds the row still ``'sending'`` and resumes it (after a
crash between send and mark, or a retry after a transient failure). Skipped rows
that were never sent start at 0.

Concurrency: :meth:`DeliveryStore.deliver` holds the row lock (``SELECT … FOR
UPDATE``) for the duration of one SMTP send and commits the mark in the same
transaction. A second process working on the same document (a consumer whose
partition moved on but which is still running) waits for that lock and then
sees ``'sent'``: it sends nothing. Only a crash between the SMTP ``250`` and the
commit can lead to a second send, with the same ``Message-ID``. A lock wait is
bounded by ``lock_timeout`` and becomes a transient error.

Errors: database failures that may pass (connection lost, pool timeout, lock
timeout, serialization failure, deadlock) are raised as
:class:`~streams.apps.email.errors.StoreUnavailable` with the SQLSTATE; others
(a constraint violated by a bug) propagate as psycopg errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal, Protocol

import psycopg
from psycopg.rows import class_row
from psycopg_pool import ConnectionPool, PoolTimeout

from streams.apps.email.errors import PermanentEmailError, StoreUnavailable
from streams.apps.email.render import DocumentRef
from streams.core.billing.rows import DeadLetterRecord, SourceCoordinates
from streams.core.billing.store import dead_letters

DeliveryStatus = Literal["sending", "sent", "skipped"]

_COLUMNS = (
    "event_id, document_key, document_type, document_id::text AS document_id, customer_id, "
    "recipient, message_id, status, skip_reason, attempts, source_topic, source_partition, "
    "source_offset, claimed_at, sent_at"
)


@dataclass(frozen=True)
class DeliveryRow:
    """One ``email_deliveries`` row (times UTC-aware)."""

    event_id: str
    document_key: str
    document_type: str
    document_id: str
    customer_id: str
    recipient: str
    message_id: str
    status: DeliveryStatus
    skip_reason: str | None
    attempts: int
    source_topic: str
    source_partition: int
    source_offset: int
    claimed_at: datetime
    sent_at: datetime | None

    @property
    def final(self) -> bool:
        """``'sent'`` or ``'skipped'``: nothing more is done for this document."""
        return self.status in ("sent", "skipped")


@dataclass(frozen=True)
class NewDelivery:
    """What a record asks for: its event id, the document's identity and the record's
    Kafka coordinates (kept on the row for traceability, invariant 6)."""

    event_id: str
    ref: DocumentRef
    source_topic: str
    source_partition: int
    source_offset: int


class ClaimKind(StrEnum):
    #: A new row was written by this call.
    NEW = "new"
    #: The document's row was still ``'sending'``: this call resumes it (``attempts`` + 1).
    RESUMED = "resumed"
    #: The event or the document already has a final row (``'sent'``/``'skipped'``).
    DUPLICATE = "duplicate"


@dataclass(frozen=True)
class Claim:
    """The result of :meth:`DeliveryStore.claim` / :meth:`DeliveryStore.record_skipped`.

    ``matched`` (duplicates only) says what matched the existing row: the same
    ``"event_id"`` or the same ``"document"`` under another event id.
    """

    kind: ClaimKind
    row: DeliveryRow
    matched: Literal["event_id", "document"] | None = None


class DeliverOutcome(StrEnum):
    #: The email was handed to the relay and the row marked ``'sent'``.
    SENT = "sent"
    #: The relay refused it for good; the row is marked ``'skipped'`` with the reason.
    REJECTED = "rejected"
    #: Another process finished the row while this one waited for it: nothing sent.
    ALREADY_FINAL = "already_final"


@dataclass(frozen=True)
class Delivered:
    outcome: DeliverOutcome
    row: DeliveryRow


class Deliveries(Protocol):
    """The port of ``email_deliveries`` (the email sender's delivery store).

    Implemented by :class:`DeliveryStore` (PostgreSQL) and by the twin
    :class:`streams.apps.email.twin.InMemoryDeliveryStore`; one contract
    suite (``tests/contracts/deliveries.py``) runs on both. Each method runs in a
    transaction of its own, committed before it returns; the semantics are
    :class:`DeliveryStore`'s (module docstring): a row unique by event id and by
    document key, ``claim`` before the send, ``deliver`` under the row lock (a second
    deliverer of the same document waits, then finds it final), ``record_skipped``
    for documents not emailed.

    Raises (every method): :class:`~streams.apps.email.errors.StoreUnavailable` for a
    transient failure (nothing written; a lock wait beyond the lock timeout is one).
    """

    def claim(self, new: NewDelivery) -> Claim:
        """Claim the document's email before sending (``NEW``, ``RESUMED`` or ``DUPLICATE``)."""
        ...

    def record_skipped(self, new: NewDelivery, reason: str) -> Claim:
        """Record that the document is not emailed (``NEW`` or ``DUPLICATE``)."""
        ...

    def deliver(self, document_key: str, send: Callable[[], None]) -> Delivered:
        """Send the claimed email and mark it, under the row lock (``SENT``, ``REJECTED``
        or ``ALREADY_FINAL``); a transient error of ``send`` propagates, nothing marked."""
        ...

    def dead_lettered(self, source: SourceCoordinates) -> bool:
        """Whether the record at ``source`` was dead-lettered already (``dead_letters``)."""
        ...

    def record_dead_letter(self, letter: DeadLetterRecord) -> None:
        """Record that a record was dead-lettered (after the topic acknowledged it)."""
        ...

    def get(
        self, *, event_id: str | None = None, document_key: str | None = None
    ) -> DeliveryRow | None:
        """The row of ``event_id`` or of ``document_key`` (exactly one must be given;
        ``ValueError`` otherwise)."""
        ...


def _unavailable(exc: Exception) -> StoreUnavailable:
    sqlstate = getattr(exc, "sqlstate", None)
    return StoreUnavailable(f"email_deliveries unavailable: {type(exc).__name__}: {exc}", sqlstate)


def _locked(row: DeliveryRow | None, document_key: str) -> DeliveryRow:
    """The row an UPDATE of a row locked in the same transaction returned."""
    if row is None:  # rows are never deleted while locked; kept as a named failure
        raise StoreUnavailable(f"email_deliveries row {document_key} vanished under its lock")
    return row


class DeliveryStore:
    """``email_deliveries`` on a psycopg pool (connections with ``autocommit=False``).

    Args:
        lock_timeout_s: longest wait for a row locked by another sender (seconds);
            beyond it the call raises :class:`StoreUnavailable` (SQLSTATE 55P03).
    """

    def __init__(self, pool: ConnectionPool, *, lock_timeout_s: float = 10.0) -> None:
        self._pool = pool
        self._lock_timeout_ms = max(1, int(lock_timeout_s * 1000))

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
        """A connection in a transaction committed on exit; transient failures wrapped."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = '{self._lock_timeout_ms}ms'")
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise _unavailable(exc) from exc

    @staticmethod
    def _one(
        conn: psycopg.Connection[tuple[object, ...]], sql: str, params: tuple[object, ...]
    ) -> DeliveryRow | None:
        with conn.cursor(row_factory=class_row(DeliveryRow)) as cur:
            cur.execute(sql.replace("{cols}", _COLUMNS), params)
            return cur.fetchone()

    def _insert(
        self,
        conn: psycopg.Connection[tuple[object, ...]],
        new: NewDelivery,
        status: DeliveryStatus,
        skip_reason: str | None,
    ) -> DeliveryRow | None:
        ref = new.ref
        return self._one(
            conn,
            """
            INSERT INTO email_deliveries (
                event_id, document_key, document_type, document_id, customer_id, recipient,
                message_id, status, skip_reason, attempts,
                source_topic, source_partition, source_offset)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT DO NOTHING
            RETURNING {cols}
            """,
            (
                new.event_id,
                ref.document_key,
                ref.document_type,
                ref.document_id,
                ref.customer_id,
                ref.recipient,
                ref.message_id,
                status,
                skip_reason,
                1 if status == "sending" else 0,
                new.source_topic,
                new.source_partition,
                new.source_offset,
            ),
        )

    def _existing(self, conn: psycopg.Connection[tuple[object, ...]], new: NewDelivery) -> Claim:
        row = self._one(
            conn,
            """
            SELECT {cols} FROM email_deliveries
            WHERE document_key = %s OR event_id = %s
            ORDER BY (document_key = %s) DESC
            LIMIT 1
            """,
            (new.ref.document_key, new.event_id, new.ref.document_key),
        )
        if row is None:  # the conflicting row was inserted and rolled back meanwhile
            raise StoreUnavailable("email_deliveries row vanished after a conflict; retry")
        matched: Literal["event_id", "document"] = (
            "event_id" if row.event_id == new.event_id else "document"
        )
        return Claim(ClaimKind.DUPLICATE, row, matched)

    def claim(self, new: NewDelivery) -> Claim:
        """Claim the document's email before sending, in its own committed transaction.

        * no row for the event or the document: insert ``'sending'`` (attempts 1) → ``NEW``;
        * the document's row is ``'sending'``: attempts + 1 → ``RESUMED`` (send again,
          same ``Message-ID``);
        * a final row for the event id or the document → ``DUPLICATE`` (send nothing).

        Raises:
            StoreUnavailable: transient database failure (nothing was claimed).
        """
        with self._transaction() as conn:
            row = self._insert(conn, new, "sending", None)
            if row is not None:
                return Claim(ClaimKind.NEW, row)
            row = self._one(
                conn,
                """
                UPDATE email_deliveries SET attempts = attempts + 1
                WHERE document_key = %s AND status = 'sending'
                RETURNING {cols}
                """,
                (new.ref.document_key,),
            )
            if row is not None:
                return Claim(ClaimKind.RESUMED, row)
            return self._existing(conn, new)

    def record_skipped(self, new: NewDelivery, reason: str) -> Claim:
        """Record that the document is not emailed (``status='skipped'``, ``skip_reason``).

        ``NEW`` when this call wrote the row (inserted, or turned a ``'sending'`` row
        of the document into ``'skipped'``), ``DUPLICATE`` when a final row exists.

        Raises:
            StoreUnavailable: transient database failure.
        """
        with self._transaction() as conn:
            row = self._insert(conn, new, "skipped", reason)
            if row is not None:
                return Claim(ClaimKind.NEW, row)
            row = self._one(
                conn,
                """
                UPDATE email_deliveries SET status = 'skipped', skip_reason = %s
                WHERE document_key = %s AND status = 'sending'
                RETURNING {cols}
                """,
                (reason, new.ref.document_key),
            )
            if row is not None:
                return Claim(ClaimKind.NEW, row)
            return self._existing(conn, new)

    def dead_lettered(self, source: SourceCoordinates) -> bool:
        """Whether the record at ``source`` was dead-lettered already (``dead_letters``,
        migration 0007): a redelivered bad record is not dead-lettered again.

        Raises:
            StoreUnavailable: transient database failure.
        """
        with self._transaction() as conn:
            return bool(
                dead_letters.recorded(conn, source.topic, source.partition, [source.offset])
            )

    def record_dead_letter(self, letter: DeadLetterRecord) -> None:
        """Record that a record was dead-lettered (after the topic acknowledged it).

        Raises:
            StoreUnavailable: transient database failure.
        """
        with self._transaction() as conn:
            dead_letters.record(conn, [letter])

    def deliver(self, document_key: str, send: Callable[[], None]) -> Delivered:
        """Send the claimed email of ``document_key`` and mark it, under the row lock.

        In one transaction: lock the row (``FOR UPDATE``, bounded by ``lock_timeout``);
        if it is no longer ``'sending'`` return ``ALREADY_FINAL`` without calling
        ``send``; else call ``send()`` and mark ``'sent'`` with ``sent_at = now()``,
        or, when ``send`` raises a :class:`PermanentEmailError`, mark ``'skipped'``
        with its reason (``REJECTED``). The commit happens before this returns.

        Raises:
            StoreUnavailable: transient database failure (row left ``'sending'``;
                if ``send`` had succeeded, a retry sends again with the same Message-ID).
            TransientEmailError: whatever transient error ``send`` raised (row left
                ``'sending'``, nothing committed).
        """
        with self._transaction() as conn:
            row = self._one(
                conn,
                "SELECT {cols} FROM email_deliveries WHERE document_key = %s FOR UPDATE",
                (document_key,),
            )
            if row is None:
                raise StoreUnavailable(f"no email_deliveries row for {document_key}; retry")
            if row.status != "sending":
                return Delivered(DeliverOutcome.ALREADY_FINAL, row)
            try:
                send()
            except PermanentEmailError as exc:
                marked = self._one(
                    conn,
                    """
                    UPDATE email_deliveries SET status = 'skipped', skip_reason = %s
                    WHERE document_key = %s RETURNING {cols}
                    """,
                    (exc.reason, document_key),
                )
                return Delivered(DeliverOutcome.REJECTED, _locked(marked, document_key))
            marked = self._one(
                conn,
                """
                UPDATE email_deliveries SET status = 'sent', sent_at = now()
                WHERE document_key = %s RETURNING {cols}
                """,
                (document_key,),
            )
            return Delivered(DeliverOutcome.SENT, _locked(marked, document_key))

    def get(
        self, *, event_id: str | None = None, document_key: str | None = None
    ) -> DeliveryRow | None:
        """The row of ``event_id`` or of ``document_key`` (exactly one must be given).

        Raises:
            ValueError: neither or both were given.
            StoreUnavailable: transient database failure.
        """
        if (event_id is None) == (document_key is None):
            raise ValueError("give exactly one of event_id, document_key")
        column, value = (
            ("event_id", event_id) if event_id is not None else ("document_key", document_key)
        )
        with self._transaction() as conn:
            return self._one(
                conn, f"SELECT {{cols}} FROM email_deliveries WHERE {column} = %s", (value,)
            )
