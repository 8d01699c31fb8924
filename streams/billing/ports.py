"""Ports: the small interfaces the billing core calls, one ``typing.Protocol`` each.

Every port has a real adapter (``streams/adapters/``), an in-memory twin
(:mod:`streams.adapters.memory`) and one contract suite (``tests/contracts/``)
run against both, so the twin cannot drift from the real thing (CONVENTIONS
"Ports with two implementations").

Ports, real adapters and twins::

    TaxService     streams.adapters.tax.client.HttpTaxService  streams.adapters.memory.tax.InMemoryTaxService
    TaxCache       streams.adapters.tax.cache.RedisTaxCache    streams.adapters.memory.tax_cache.InMemoryTaxCache
    MailTransport  streams.email.transport.SmtpTransport       streams.adapters.memory.mail.InMemoryMailTransport
    KafkaSource    confluent_kafka.Consumer                    streams.adapters.memory.kafka.InMemoryConsumer
    KafkaSink      confluent_kafka.Producer                    streams.adapters.memory.kafka.InMemoryProducer
    Database       psycopg_pool.ConnectionPool                 streams.adapters.memory.database.InMemoryDatabase
    UsageStore …   the modules of streams.billing.store         the modules of streams.adapters.memory.store
    FenceStore     streams.billing.fencing                      streams.adapters.memory.fencing
    DeadLetterSink streams.billing.dead_letters.DeadLetters     streams.adapters.memory.dead_letters.InMemoryDeadLetterSink

Errors are split by what the caller does next (CONVENTIONS "Errors you can act
on"): a **transient** error means "the same call may succeed later, retry it (with
the same idempotency key), never dead-letter"; a **permanent** one means "the
same input fails again: record it and move on".

* Tax: :class:`TaxUnavailable` (transient) and :class:`TaxRejected` (permanent),
  both :class:`TaxError`, defined here because they are part of the port.
* Mail: :class:`streams.email.errors.SmtpTransientError` (transient) and
  :class:`streams.email.errors.SmtpPermanentError` (permanent), defined with the
  email sender's exception tree (not imported here: the kernel does not depend on
  the email package).

The tax port's value types (:class:`~streams.domain.invoice.TaxLine`,
:class:`~streams.domain.invoice.TaxedLine`) live in the domain; :class:`Rate`
(a code and a rate, what the cache stores per region) lives here.

The kernel's stores, fences and dead-letter sink have ports here too
(:class:`UsageStore`, :class:`InvoiceStore`, :class:`HoldStore`,
:class:`CloseStore`, :class:`FenceStore`, :class:`DeadLetterSink`). The stores
are modules of functions that take an open connection first and run inside the
caller's transaction (docs/architecture.md "Stores are functions of a
connection"), so a store's Protocol is generic in the connection type ``C``: the
PostgreSQL modules of :mod:`streams.billing.store` implement
``UsageStore[psycopg.Connection[Any]]`` and so on (mypy checks a module against a
Protocol; ``tests/unit/test_ports.py`` pins it), and an in-memory twin
implements the same Protocol over its own transaction object. Pure helpers that
touch no table (``invoice_number``, ``credit_note_number``) are not part of a port.
Where a connection comes from is the :class:`Database` port (a psycopg pool, or the
twin's in-memory database); which store implementation a writer uses is a
:class:`streams.billing.stores.Stores` set (PostgreSQL by default).

The Kafka clients the loops use have ports too: :class:`KafkaSource` (a consumer-group
member: the invoicing worker's and the email sender's consumer) and
:class:`KafkaSink` (a producer: the dead-letter topics). They are the subset of
``confluent_kafka.Consumer`` / ``Producer`` the loops call, with librdkafka's value
types (``TopicPartition``, ``Message``, ``KafkaError``) and its exceptions
(``KafkaException`` carrying a ``KafkaError`` whose ``code()`` says what failed;
``RuntimeError`` on a closed consumer), so the real clients implement them as they
are and the worker's error handling is the same on both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from email.message import EmailMessage
from typing import Literal, Protocol, SupportsBytes, TypeVar, overload

from confluent_kafka import KafkaError, Message, TopicPartition

from streams.billing.fencing import CloseRequest, FencingToken, LeaseFence
from streams.billing.rows import (
    CloseMarker,
    CreditNoteDraft,
    Customer,
    DeadLetterRecord,
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
)
from streams.billing.store.invoices import Document, OutboxEvent, UnsentInvoice
from streams.billing.store.metering import MeteredRead
from streams.domain.events import CustomerUpserted, EventData, SubscriptionEvent
from streams.domain.invoice import TaxedLine, TaxLine, UsageLine
from streams.domain.rating import PriceBook
from streams.domain.rating.published import Entry

__all__ = [
    "CloseStore",
    "Connection",
    "Database",
    "DeadLetterSink",
    "DeadLetterStore",
    "DeliveryReport",
    "FenceStore",
    "HoldStore",
    "InvoiceStore",
    "KafkaSink",
    "KafkaSource",
    "MailTransport",
    "MeteringStore",
    "PriceBookStore",
    "Rate",
    "RateKey",
    "RebalanceCallback",
    "TaxCache",
    "TaxError",
    "TaxRejected",
    "TaxService",
    "TaxUnavailable",
    "UsageStore",
]


# --------------------------------------------------------------------------- tax: errors


class TaxError(Exception):
    """Root of the tax port's exceptions.

    Attributes:
        status: HTTP status of the last answer, ``None`` when there was none
            (timeout, connection error, refused before sending).
        idempotency_key: key of the request that failed (``key:i`` for chunk ``i``).
        attempts: attempts made for that request (0 = refused before sending).
        retry_after_s: seconds the service asked us to wait (``Retry-After``), if it did.

    Tree::

        TaxError
        ├── TaxUnavailable   transient: retries exhausted (timeouts, connection errors,
        │                    408/429/5xx) — retry the job later, do not dead-letter
        └── TaxRejected      permanent: 4xx (409 conflict, 413 too large, 422 invalid)
                             or an invalid answer — the same document fails again
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        idempotency_key: str | None = None,
        attempts: int = 0,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.idempotency_key = idempotency_key
        self.attempts = attempts
        self.retry_after_s = retry_after_s


class TaxUnavailable(TaxError):
    """Transient: the service did not answer usably within the attempts allowed.
    The same document may succeed later (same idempotency key)."""


class TaxRejected(TaxError):
    """Permanent: the service refused the document (4xx) or answered something
    invalid, or the document is invalid before sending. Retrying fails again."""


# --------------------------------------------------------------------------- tax: values


@dataclass(frozen=True)
class Rate:
    """The code and rate applied to a line: ``tax_code`` like ``US-WA-STD``, ``rate`` a
    fraction (``Decimal("0.065")`` = 6.5 %)."""

    tax_code: str
    rate: Decimal


#: What a rate depends on: ``(region_id, product tax code)``, either ``None``.
RateKey = tuple[str | None, str | None]


# --------------------------------------------------------------------------- tax: ports


class TaxService(Protocol):
    """The tax service: the tax of each line of one document (DESIGN "Tax service").

    ``calculate(idempotency_key=…, customer_id=…, currency=…, lines=…, commit=True)``
    returns one :class:`~streams.domain.invoice.TaxedLine` per input line, in input
    order; ``tax`` is ``amount * rate`` exactly (``Decimal`` in the currency's units,
    never rounded: rounding is the invoice's, :mod:`streams.domain.invoice`), the
    ``rate`` a fraction. No lines → ``[]`` without a call.

    Idempotency: ``commit=True`` records the document under its key, so the same key
    with the same content (amounts compared by value) answers the same lines again and
    taxes nothing twice; the same key with other content is refused (409,
    :class:`TaxRejected`). ``commit=False`` is a quote: nothing is stored, nothing
    conflicts. The key is the invoice id and revision.

    Size: a document of more than 1,000 lines goes out as requests of at most 1,000
    lines (``max_lines_per_request``); request ``i`` carries the key ``f"{key}:{i}"``
    (:func:`streams.adapters.tax.wire.chunk_key`), so a retried document replays the
    requests that were already committed.

    Synchronous and thread-safe: called from the workers' job threads.

    Raises:
        TaxUnavailable: transient (timeouts, connection errors, 408/429/5xx after the
            allowed attempts): retry the job later with the same key.
        TaxRejected: permanent: the document is invalid (``status`` ``None`` when
            refused before sending; 422 for an unknown product tax code), too large
            (413), conflicts with what the key committed (409), or the answer was
            invalid (200).
    """

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        """Tax of each line, in input order (see the class docstring)."""
        ...


class TaxCache(Protocol):
    """The tax client's cache: committed answers by idempotency key, and rates by
    :data:`RateKey`, each kept ``ttl_s`` seconds after it was written.

    A cache is an optimisation only: an unavailable cache (Redis down, an entry that
    does not decode) **is a miss** — no method raises; a ``put`` that fails is
    forgotten. So the cache can slow the system down, never make it wrong (DESIGN
    "Redis").

    ``fingerprint`` is :func:`streams.adapters.tax.wire.document_fingerprint` of the
    document: a stored answer is returned only for the same key *and* the same
    content, so a conflicting document still reaches the service (and gets its 409).
    """

    def get_document(self, idempotency_key: str, fingerprint: str) -> list[TaxedLine] | None:
        """The committed answer stored for this key and content, in stored order, or
        ``None`` (absent, expired, other fingerprint, cache unavailable)."""
        ...

    def put_document(
        self, idempotency_key: str, fingerprint: str, lines: Sequence[TaxedLine]
    ) -> None:
        """Store a committed answer under its key (replacing any entry; expires after
        ``ttl_s``). Decimals are kept exactly."""
        ...

    def get_rates(self, keys: Iterable[RateKey]) -> dict[RateKey, Rate]:
        """The cached rates among ``keys``; missing (or expired) ones are absent;
        ``{}`` when the cache is unavailable."""
        ...

    def put_rates(self, rates: Mapping[RateKey, Rate]) -> None:
        """Store rates (each replacing any entry, expiring after ``ttl_s``)."""
        ...


# --------------------------------------------------------------------------- mail


class MailTransport(Protocol):
    """Sends one email message to one envelope recipient.

    ``send(message, from_address=…, to_address=…)`` hands ``message`` (an
    :class:`email.message.EmailMessage` with its headers, ``Message-ID`` included,
    as built by :mod:`streams.email.render`) to the relay with the given SMTP
    envelope. When it returns, the message is accepted: it will be received once,
    with its ``Message-ID`` and headers unchanged. A message whose send raised may be
    sent again (the ``Message-ID`` derives from the document, so a resend is
    recognisable).

    Raises:
        streams.email.errors.SmtpTransientError: retry later: the relay is down or
            unreachable, timed out, answered 4xx, or refused what every message
            needs (connect, HELO, the sender). ``code`` is the SMTP reply code or
            ``None``.
        streams.email.errors.SmtpPermanentError: this message is refused for good
            (a 5xx for the recipient or the data, or a feature it needs is missing).
            ``code`` is the SMTP reply code.
    """

    def send(self, message: EmailMessage, *, from_address: str, to_address: str) -> None:
        """Deliver ``message`` (see the class docstring)."""
        ...


# --------------------------------------------------------------------------- stores, fences, dead letters

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
    (:mod:`streams.billing.store.dead_letters`, migration 0007)."""

    def recorded(
        self, conn: C, topic: str, partition: int, offsets: Iterable[int]
    ) -> dict[int, DeadLetterRecord]: ...
    def record(self, conn: C, letters: Sequence[DeadLetterRecord]) -> None: ...


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


class MeteringStore(Protocol[C]):
    """``metered_usage`` and ``subscription_events``, what the worker stores and the
    invoice job rates (:mod:`streams.billing.store.metering`)."""

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
    def subscriptions_before(
        self, conn: C, customer_id: str, topic: str, partition: int, before_offset: int
    ) -> list[SubscriptionEvent]: ...


class PriceBookStore(Protocol[C]):
    """The published price book (``billable_metrics``, ``plan_versions``;
    :mod:`streams.billing.store.pricing`), as the invoice job reads it."""

    def book_fingerprint(self, conn: C) -> tuple[int, int]: ...
    def published_book(self, conn: C) -> PriceBook: ...
    def insert_entries(self, conn: C, entries: list[Entry], *, published_by: str) -> int: ...


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


# --------------------------------------------------------------------------- database


class Connection(Protocol):
    """What the kernel's writers need of a store connection besides the stores:
    ``with conn.transaction():`` (a transaction, or a savepoint inside one; see
    :class:`Database`). ``psycopg.Connection`` has it; so has the twin's connection."""

    def transaction(self) -> AbstractContextManager[object]:
        """Begin a transaction (a savepoint inside an open one), committed when the block
        ends, rolled back when it raises."""
        ...


#: The connection type a :class:`Database` hands out.
C_co = TypeVar("C_co", covariant=True)


class Database(Protocol[C_co]):
    """Where store connections come from: ``with database.connection() as conn:``.

    The connection is not in autocommit mode: the first statement (or
    ``conn.transaction()``) begins a transaction; leaving the block commits it, or
    rolls it back when the block raises. ``conn.transaction()`` inside an open
    transaction is a savepoint (rolled back alone when its block raises). This is
    ``psycopg_pool.ConnectionPool`` with ``autocommit=False`` connections (what
    :func:`streams.bootstrap.postgres_pool` builds); the twin is
    :class:`streams.adapters.memory.database.InMemoryDatabase`.

    Raises (from the block's statements): ``psycopg.Error`` — ``psycopg.OperationalError``
    when the database cannot be used (the twin raises it for an injected failure too).
    """

    def connection(self, timeout: float | None = None) -> AbstractContextManager[C_co]:
        """A connection for the length of the ``with`` block (see the class docstring),
        waiting at most ``timeout`` seconds for one (None: the database's default).

        Raises:
            psycopg_pool.PoolTimeout: no connection within ``timeout``.
        """
        ...


# --------------------------------------------------------------------------- kafka

#: The delivery report callback of :meth:`KafkaSink.produce`: ``(error or None, message)``;
#: on success the message carries its partition and offset.
DeliveryReport = Callable[[KafkaError | None, Message], None]


class KafkaSink(Protocol):
    """A Kafka producer (``confluent_kafka.Producer``, built by
    :func:`streams.adapters.kafka.make_producer`: murmur2 partitioner, idempotent,
    ``acks=all``).

    ``produce`` queues one record — partition chosen by the key's murmur2 (the Java
    client's partitioner), unless ``partition`` is given — and returns; the record's
    delivery report reaches ``on_delivery`` from a later :meth:`poll` or :meth:`flush`
    of this producer (on the caller's thread), with ``None`` and the delivered message
    (partition, offset), or with the error that refused it.

    Raises (from ``produce``):
        BufferError: the local queue is full.
        KafkaException: refused before queueing: ``MSG_SIZE_TOO_LARGE`` (larger than
            ``message.max.bytes``), ``_UNKNOWN_TOPIC``, …
    """

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        partition: int = -1,
        on_delivery: DeliveryReport | None = None,
    ) -> None:
        """Queue one record (see the class docstring)."""
        ...

    def poll(self, timeout: float = -1) -> int:
        """Serve delivery reports (waiting up to ``timeout`` seconds for one); returns
        how many were served."""
        ...

    def flush(self, timeout: float = -1) -> int:
        """Wait until every queued record is delivered (or refused) and its report
        served, at most ``timeout`` seconds; returns how many are still queued."""
        ...


#: A rebalance callback of :meth:`KafkaSource.subscribe`: ``(consumer, partitions)``.
RebalanceCallback = Callable[["KafkaSource", list[TopicPartition]], None]


class KafkaSource(Protocol):
    """A member of a Kafka consumer group (``confluent_kafka.Consumer`` built by
    :func:`streams.adapters.kafka.make_consumer`: auto-commit off, cooperative-sticky,
    no static membership).

    **Group membership.** :meth:`subscribe` joins the group; the group coordinator
    assigns the topics' partitions among the members. Every rebalance increments the
    group's generation. With cooperative-sticky assignment a member keeps the
    partitions it has across rebalances and only the partitions that move are
    revoked (``on_revoke``) from their owner before they are assigned
    (``on_assign``, incremental: the partitions added, possibly none) to another
    member. A member removed by the coordinator (session timeout, poll interval
    exceeded) gets ``on_lost`` with what it had, and rejoins under a new member id.
    The callbacks run on the caller's thread, inside :meth:`poll`, :meth:`consume`
    or :meth:`close` (which revokes what the member has before leaving).

    **Fencing token.** :meth:`consumer_group_metadata` is librdkafka's serialised
    group metadata, whose bytes are the ``CGMDv2`` format parsed by
    :func:`streams.adapters.kafka.parse_group_metadata`: the generation (the one of
    the last rebalance this member took part in; -1 before joining) and the member id.

    **Reading.** A newly assigned partition starts at the group's committed offset,
    else at ``auto.offset.reset``. :meth:`pause` stops returning a partition's records
    until :meth:`resume`; :meth:`seek` sets where reading continues. Records are
    ``confluent_kafka.Message`` objects (``headers()`` is ``None`` when a record has none;
    ``error()`` set on an error event instead of a record).

    **Offsets.** :meth:`commit` stores the next offset to read per partition for the
    group (auto-commit is off: nothing else commits); :meth:`committed` reads them back
    (``OFFSET_INVALID``, -1001, when none).

    Raises:
        KafkaException: with a ``KafkaError``: a commit refused by the coordinator
            (``REBALANCE_IN_PROGRESS``, ``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID``…),
            a seek of a partition not assigned (``_UNKNOWN_PARTITION``/``_STATE``).
        RuntimeError: any call after :meth:`close` ("Consumer closed").
    """

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join the group for ``topics`` (see the class docstring)."""
        ...

    def poll(self, timeout: float = -1) -> Message | None:
        """One record (or error event), waiting up to ``timeout`` seconds; None if none came."""
        ...

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records, waiting up to ``timeout`` seconds for them."""
        ...

    def assignment(self) -> list[TopicPartition]:
        """The partitions currently assigned to this member."""
        ...

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop returning records of ``partitions`` (kept across rebalances) until resumed."""
        ...

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Return records of ``partitions`` again."""
        ...

    def seek(self, partition: TopicPartition) -> None:
        """Continue reading ``partition.partition`` at ``partition.offset``."""
        ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...
    ) -> None: ...
    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        """Commit ``offsets`` (next offsets to read) for the group; synchronous returns
        the committed partitions, asynchronous reports only a local refusal."""
        ...

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """The group's committed offsets of ``partitions`` (``OFFSET_INVALID`` when none)."""
        ...

    def consumer_group_metadata(self) -> SupportsBytes:
        """The group metadata; ``bytes(...)`` of it is the ``CGMDv2`` format."""
        ...

    def close(self) -> None:
        """Revoke what this member has (``on_revoke``), leave the group, and close."""
        ...
