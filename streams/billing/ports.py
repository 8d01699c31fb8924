"""Ports: the small interfaces the billing core calls, one ``typing.Protocol`` each.

Every port has a real adapter (``streams/adapters/``), an in-memory twin
(:mod:`streams.adapters.memory`) and one contract suite (``tests/contracts/``)
run against both, so the twin cannot drift from the real thing (CONVENTIONS
"Ports with two implementations").

Ports, real adapters and twins::

    TaxService     streams.adapters.tax.client.HttpTaxService  streams.adapters.memory.tax.InMemoryTaxService
    TaxCache       streams.adapters.tax.cache.RedisTaxCache    streams.adapters.memory.tax_cache.InMemoryTaxCache
    MailTransport  streams.email.transport.SmtpTransport       streams.adapters.memory.mail.InMemoryMailTransport

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from email.message import EmailMessage
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
from streams.domain.invoice import TaxedLine, TaxLine, UsageLine

__all__ = [
    "CloseStore",
    "DeadLetterSink",
    "FenceStore",
    "HoldStore",
    "InvoiceStore",
    "MailTransport",
    "Rate",
    "RateKey",
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
