"""The email sender: a member of the consumer group ``settings.worker.email_group`` on
``{topic_prefix}billing.invoices.v1`` that emails every issued invoice and credit note
once (docs/design.md "Email", invariants 2 and 6).

Per record (:meth:`EmailSender.process`):

1. decode the CloudEvents binary-mode record
   (``allowed=(InvoiceIssued, CreditNoteIssued, InvoiceVoided)``);
   an **undecodable record** is dead-lettered as it was read to
   ``billing.invoices.dlq.v1`` with ``dlq.reason`` and its source coordinates
   (:class:`streams.core.billing.dead_letters.DeadLetters`; docs/design.md, invariant 5), logged
   at ERROR and counted (``invoicing_email_invalid_records_total``); then its
   offset is committed. If the dead letter cannot be delivered, the record is
   retried like a transient failure (never skipped unrecorded). The topic is
   written only by our own outbox, so a bad record is a bug of its producer,
   fixed there and republished;
2. ``invoice.voided`` → one email saying so, to the address the invoice was issued to,
   with the voided invoice's PDF (both read from the stored invoice:
   :meth:`EmailSender._void`), claimed and marked like any document's under
   ``document_key`` ``invoice_void:{id}:r{revision}``;
3. a total that rounds to zero → no email; the row is recorded ``'skipped'`` with
   ``skip_reason='zero_total'`` (auditable, counted). Emails are sent exactly for
   documents whose total is not zero;
4. otherwise: render the email with its PDF (the stored document, every line:
   :mod:`streams.apps.email.attachments`) and the link to the hosted page; then claim
   the ``email_deliveries`` row (``'sending'``), send through SMTP
   under the row lock, mark ``'sent'`` — see :mod:`streams.apps.email.store`. A
   duplicate event (same event id, or the same document under a new event id) is
   a no-op. A row still ``'sending'`` (a crash between send and mark) is
   **resumed**: the email is sent again with the same ``Message-ID`` and
   ``attempts`` grows — at-least-once, recognisable by ``Message-ID`` at the
   receiver. No scan at start-up is needed: since the offset is committed only
   after the mark, such a row's record is always redelivered.

Failures:

* transient (SMTP unreachable or 4xx, database unavailable) → retried with
  exponential backoff and jitter (tenacity) for at most a quarter of
  ``max.poll.interval.ms``; then the consumer seeks back to the record, keeps
  polling (so the group membership stays alive) and tries again. The offset is
  never committed past an email that was not sent;
* permanent (a 5xx refusal of this recipient or message, a document that cannot
  be rendered) → the row is marked ``'skipped'`` with ``skip_reason``
  ``smtp_rejected: …`` / ``render_failed: …``, an ERROR log line, a metric; the
  offset is committed. No new status is needed, so the schema is unchanged.

Commit order: :meth:`EmailSender.handle`, through the kernel's commit point
(:class:`streams.core.billing.commit.CommitPoint`) — the row is final in PostgreSQL,
then the offset is committed to Kafka synchronously.

Metrics (prometheus_client, default registry), all counters:
``invoicing_email_sent_total{document_type}``,
``invoicing_email_skipped_total{reason}`` (``zero_total``, ``smtp_rejected``, ``render_failed``),
``invoicing_email_duplicates_total{matched}`` (``event_id``, ``document``),
``invoicing_email_failures_total{kind}`` (``transient`` per failed attempt, ``permanent``),
``invoicing_email_resumed_total`` (deliveries resumed from a ``'sending'`` row),
``invoicing_email_invalid_records_total``, ``invoicing_email_ignored_total{type}``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.message import EmailMessage
from enum import StrEnum
from typing import Literal

from confluent_kafka import KafkaException, Message, TopicPartition
from prometheus_client import Counter, start_http_server
from psycopg_pool import ConnectionPool
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    stop_when_event_set,
    wait_exponential_jitter,
)

from streams.adapters.documents.source import DocumentSource
from streams.adapters.documents.tokens import PageLinks
from streams.adapters.smtp import SmtpTransport
from streams.apps.email.attachments import DocumentFiles, document_pdf, stored_pdf
from streams.apps.email.errors import EmailConfigurationError, RenderError, TransientEmailError
from streams.apps.email.prerender import Prerenderer
from streams.apps.email.records import announced, first_of_each_partition
from streams.apps.email.records import coords as _coords
from streams.apps.email.records import headers as _headers
from streams.apps.email.render import (
    MESSAGE_ID_DOMAIN,
    DocumentRef,
    document_ref,
    is_zero_total,
    render_email,
    render_void_email,
    void_ref,
)
from streams.apps.email.store import (
    Claim,
    ClaimKind,
    Deliveries,
    DeliverOutcome,
    DeliveryStore,
    NewDelivery,
)
from streams.core.billing.commit import CommitPoint
from streams.core.billing.dead_letters import DeadLetterError
from streams.core.billing.failures import Disposition, classify
from streams.core.billing.ports import DeadLetterSink, KafkaSource, MailTransport
from streams.core.billing.rows import DeadLetterRecord, SourceCoordinates
from streams.core.domain import formatting
from streams.core.domain.codec import decode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import CreditNoteIssued, Envelope, InvoiceIssued, InvoiceVoided
from streams.core.domain.money import UnknownCurrency
from streams.settings import Settings
from streams.topics import INVOICES, INVOICES_DLQ

logger = logging.getLogger("streams.apps.email.sender")

#: The event types this topic may carry (the codec refuses others).
ALLOWED_TYPES = (InvoiceIssued, CreditNoteIssued, InvoiceVoided)

EMAILS_SENT = Counter(
    "invoicing_email_sent_total", "Emails handed to the SMTP relay.", ["document_type"]
)
EMAILS_SKIPPED = Counter(
    "invoicing_email_skipped_total",
    "Documents recorded as not emailed (status 'skipped').",
    ["reason"],
)
EMAIL_DUPLICATES = Counter(
    "invoicing_email_duplicates_total",
    "Records absorbed because their event or document already had a final row.",
    ["matched"],
)
EMAIL_FAILURES = Counter(
    "invoicing_email_failures_total",
    "Failed delivery attempts: transient (retried) or permanent (recorded as skipped).",
    ["kind"],
)
EMAIL_RESUMED = Counter(
    "invoicing_email_resumed_total",
    "Deliveries that found their row still 'sending' from an earlier delivery "
    "(a crash between send and mark, or an earlier delivery that failed transiently).",
)
INVALID_RECORDS = Counter(
    "invoicing_email_invalid_records_total",
    "Records of the invoices topic that could not be decoded (logged and skipped).",
)
IGNORED_RECORDS = Counter(
    "invoicing_email_ignored_total", "Records that need no email (by event type).", ["type"]
)


class Outcome(StrEnum):
    #: The email left (first delivery or a resumed one).
    SENT = "sent"
    #: Not emailed, row recorded ``'skipped'`` (``reason``: zero_total, smtp_rejected…, render_failed…).
    SKIPPED = "skipped"
    #: The event or its document already had a final row: nothing done.
    DUPLICATE = "duplicate"
    #: An event type that gets no email (none today; kept for the metric's readers).
    IGNORED = "ignored"
    #: An undecodable record (logged at ERROR, counted, skipped).
    INVALID = "invalid"


@dataclass(frozen=True)
class ProcessResult:
    """What :meth:`EmailSender.process` did with one record.

    ``resumed`` is true when the record found its document's row still
    ``'sending'`` from an earlier delivery (crash between send and mark).
    """

    outcome: Outcome
    topic: str
    partition: int
    offset: int
    event_id: str | None = None
    document_key: str | None = None
    message_id: str | None = None
    reason: str | None = None
    resumed: bool = False


def invoices_topic(settings: Settings) -> str:
    """The topic the sender consumes: ``settings.kafka.topic_prefix + "billing.invoices.v1"``."""
    return INVOICES.with_prefix(settings.kafka.topic_prefix).name


def invoices_dlq_topic(settings: Settings) -> str:
    """The sender's dead-letter topic: ``topic_prefix + "billing.invoices.dlq.v1"``."""
    return INVOICES_DLQ.with_prefix(settings.kafka.topic_prefix).name


class EmailSender:
    """Processes records of the invoices topic into emails; owns the commit order.

    Args:
        settings: ``smtp`` (relay, from address, timeout), ``kafka``
            (``max_poll_interval_ms`` bounds the retry budget), ``worker``.
        pool: psycopg pool (``autocommit=False`` connections) for ``email_deliveries``;
            not needed when ``deliveries`` is given.
        consumer: the group member whose offsets :meth:`handle` commits; not needed
            by :meth:`process`.
        transport: defaults to :class:`SmtpTransport` on ``settings.smtp``.
        stop: when set, retries of a transient failure stop early (shutdown).
        dead_letters: where undecodable records go (:func:`invoices_dlq_topic`);
            :func:`streams.bootstrap.email_sender` always gives one. None (unit tests of
            :meth:`process` only): such records are logged and counted only.
        deliveries: the ``email_deliveries`` store (default: :class:`DeliveryStore` on
            ``pool``, lock timeout ``settings.smtp.timeout_s``).
        documents: where the PDF's stored document is read
            (:func:`streams.bootstrap.email_sender` always gives one); None: no PDF.
        links: the hosted page's links (always given by the bootstrap); None: no link.

    Raises:
        EmailConfigurationError: ``settings.smtp.from_address`` is not an address.
        TypeError: neither ``pool`` nor ``deliveries`` was given.
    """

    def __init__(
        self,
        settings: Settings,
        pool: ConnectionPool | None = None,
        *,
        consumer: KafkaSource | None = None,
        transport: MailTransport | None = None,
        stop: threading.Event | None = None,
        domain: str = MESSAGE_ID_DOMAIN,
        dead_letters: DeadLetterSink | None = None,
        deliveries: Deliveries | None = None,
        documents: DocumentSource | None = None,
        links: PageLinks | None = None,
        prerender: Prerenderer | None = None,
    ) -> None:
        try:
            Address(addr_spec=settings.smtp.from_address)
        except (ValueError, IndexError, HeaderParseError) as exc:
            raise EmailConfigurationError(
                f"settings.smtp.from_address {settings.smtp.from_address!r} is not an address"
            ) from exc
        self._settings = settings
        if deliveries is None:
            if pool is None:
                raise TypeError("EmailSender needs a pool or a deliveries store")
            deliveries = DeliveryStore(pool, lock_timeout_s=settings.smtp.timeout_s)
        self._store: Deliveries = deliveries
        self._consumer = consumer
        self._commit_point = (
            CommitPoint(
                consumer,
                consequence="row already final: the next owner absorbs the redelivery",
                wait_s=settings.kafka.max_poll_interval_ms / 1000 / 4,  # commit.py
            )
            if consumer is not None
            else None
        )
        self._transport: MailTransport = transport or SmtpTransport(settings.smtp)
        self._stop = stop or threading.Event()
        self._domain = domain
        self._dead_letters = dead_letters
        self._documents = documents
        self._links = links
        self._prerender = prerender
        #: Longest time one record is retried before seeking back (seconds).
        self.retry_budget_s = max(1.0, settings.kafka.max_poll_interval_ms / 1000 / 4)

    @property
    def store(self) -> Deliveries:
        return self._store

    # ------------------------------------------------------------------ one record

    def process(self, msg: Message) -> ProcessResult:
        """Do what ``msg`` asks (see the module docstring); never commits an offset.

        On return, the record's ``email_deliveries`` row (if any) is final and
        committed in PostgreSQL.

        Raises:
            TransientEmailError: SMTP or the database stayed unavailable for
                :attr:`retry_budget_s` (or ``stop`` was set): the record must be
                processed again, its offset not committed.
        """
        coords = _coords(msg)
        try:
            envelope = decode(msg.key(), msg.value(), _headers(msg), allowed=ALLOWED_TYPES)
        except InvalidEvent as exc:
            return self._invalid(msg, coords, None, exc.reason)
        try:
            return self._process_event(msg, coords, envelope)
        except TransientEmailError:
            raise
        except Exception as exc:
            # One table says what this is (streams/core/billing/failures.py): a permanent failure
            # is this record's (a value the database refuses, arithmetic on its amounts):
            # dead-lettered once, never retried; anything else is retried, and alerted.
            failure = classify(exc)
            if failure.permanent:
                EMAIL_FAILURES.labels(kind="permanent").inc()
                return self._invalid(
                    msg,
                    coords,
                    envelope.id,
                    f"cannot be processed: {failure.reason}",
                    kind="unwritable",
                )
            if failure.disposition is Disposition.UNEXPECTED:
                logger.error(
                    "ALERT email of event %s failed unexpectedly", envelope.id, exc_info=exc
                )
            raise TransientEmailError(failure.reason) from exc

    def _process_event(
        self, msg: Message, coords: tuple[str, int, int], envelope: Envelope
    ) -> ProcessResult:
        """:meth:`process` once the record decoded."""
        data = envelope.data
        if isinstance(data, InvoiceVoided):
            return self._void(msg, coords, envelope.id, data)
        if not isinstance(data, InvoiceIssued | CreditNoteIssued):  # the codec enforces it
            return self._invalid(msg, coords, envelope.id, f"unexpected data {type(data).__name__}")
        try:
            ref = document_ref(data, domain=self._domain)
        except RenderError as exc:
            return self._invalid(msg, coords, envelope.id, exc.reason)
        new = NewDelivery(envelope.id, ref, *coords)
        known = self._already_final(new)
        if known is not None:  # a redelivery or a republish: no PDF rendered for nothing
            return known
        try:
            zero = is_zero_total(data)
            # no PDF for a document that is not emailed (a zero total)
            files = self._files(ref) if not zero else None
            link = (
                self._links.url(
                    "invoice" if isinstance(data, InvoiceIssued) else "credit_note",
                    ref.document_id,
                    data.issued_at,
                )
                if self._links is not None
                else None
            )
            message = render_email(
                data,
                event_id=envelope.id,
                from_address=self._settings.smtp.from_address,
                domain=self._domain,
                link=link,
                attachment=None if files is None else files.pdf,
                lines=None if files is None else files.lines,
            )
        except RenderError as exc:
            EMAIL_FAILURES.labels(kind="permanent").inc()
            logger.error(
                "cannot render email of %s (event %s at %s/%d@%d): %s",
                ref.document_key,
                envelope.id,
                *coords,
                exc.reason,
            )
            return self._skip(new, f"render_failed: {exc.reason}", "render_failed")
        if zero:
            return self._skip(new, "zero_total", "zero_total")
        return self._deliver(new, message)

    def _files(self, ref: DocumentRef) -> DocumentFiles | None:
        """The PDF (and CSV of lines) of ``ref``'s stored document: rendered ahead when
        the prerenderer has it, else here; None without a document source.

        Raises:
            RenderError: the document is not stored or cannot be rendered.
        """
        if self._documents is None:
            return None
        if self._prerender is not None:
            ahead = self._prerender.take(ref)
            if ahead is not None:
                return ahead
        return document_pdf(self._documents, ref)

    def _void(
        self, msg: Message, coords: tuple[str, int, int], event_id: str, data: InvoiceVoided
    ) -> ProcessResult:
        """One email announcing the void of an invoice revision, to the address the
        invoice was issued to, with the voided invoice's PDF and its page's link.

        The event carries neither the address nor the amounts: both come from the stored
        invoice (written before the void in an earlier transaction). Not stored (or no
        document source) → recorded ``'skipped'`` ``render_failed: …``; a voided invoice
        whose total rounds to zero was never emailed → ``'skipped'`` ``zero_total``.
        Claim, send and mark as for any document (exactly once per ``document_key``
        ``invoice_void:{id}:r{revision}``).
        """
        try:
            invoice_id = void_ref(data, recipient="", domain=self._domain).document_id
        except RenderError as exc:
            return self._invalid(msg, coords, event_id, exc.reason)
        stored = recipient = None
        if self._documents is not None:
            stored = self._documents.load("invoice", invoice_id)
            recipient = self._documents.recipient(invoice_id)
        ref = void_ref(data, recipient=recipient or "", domain=self._domain)
        new = NewDelivery(event_id, ref, *coords)
        if stored is None or recipient is None:
            EMAIL_FAILURES.labels(kind="permanent").inc()
            reason = f"render_failed: voided invoice {invoice_id} is not stored"
            logger.error("cannot email the void of %s (event %s): %s", invoice_id, event_id, reason)
            return self._skip(new, reason, "render_failed")
        try:
            if formatting.rounded(stored.total, stored.currency).is_zero():
                return self._skip(new, "zero_total", "zero_total")
            files = stored_pdf(stored, ref)
            message = render_void_email(
                data,
                stored,
                recipient=recipient,
                event_id=event_id,
                from_address=self._settings.smtp.from_address,
                domain=self._domain,
                link=(
                    self._links.url("invoice", invoice_id, stored.issued_at)
                    if self._links is not None
                    else None
                ),
                attachment=files.pdf,
                lines=files.lines,
            )
        except (RenderError, UnknownCurrency) as exc:
            reason = exc.reason if isinstance(exc, RenderError) else f"unknown currency {exc}"
            EMAIL_FAILURES.labels(kind="permanent").inc()
            logger.error("cannot render the void email of %s: %s", ref.document_key, reason)
            return self._skip(new, f"render_failed: {reason}", "render_failed")
        return self._deliver(new, message)

    def _invalid(
        self,
        msg: Message,
        coords: tuple[str, int, int],
        event_id: str | None,
        reason: str,
        *,
        kind: str = "invalid",
    ) -> ProcessResult:
        """Dead-letter ``msg`` as it was read (when a dead-letter topic is configured),
        once: a record found in ``dead_letters`` (a redelivery) is not published again;
        otherwise published, then recorded there. Then log and count it; the caller
        commits its offset.

        Raises:
            TransientEmailError: the dead letter was not delivered, or the database
                could not say or record it: the record is processed again, its offset
                not committed.
        """
        source = SourceCoordinates(*coords)
        if self._dead_letters is not None and not self._store.dead_lettered(source):
            try:
                self._dead_letters.publish(
                    key=msg.key(),
                    value=msg.value(),
                    headers=[(name, value or b"") for name, value in _headers(msg)],
                    source_topic=coords[0],
                    source_partition=coords[1],
                    source_offset=coords[2],
                    kind=kind,
                    reason=reason,
                    attributed=msg.key() is not None,
                )
            except DeadLetterError as exc:
                raise TransientEmailError(
                    f"dead-lettering {coords[0]}/{coords[1]}@{coords[2]} failed: {exc}"
                ) from exc
            self._store.record_dead_letter(
                DeadLetterRecord(
                    *coords,
                    self._dead_letters.topic,
                    kind,
                    reason,
                    event_id,
                    [],
                )
            )
        INVALID_RECORDS.inc()
        logger.error(
            "undecodable record %s/%d@%d (event id %s) dead-lettered, no email: %s",
            *coords,
            event_id or "?",
            reason,
        )
        return ProcessResult(Outcome.INVALID, *coords, event_id=event_id, reason=reason)

    def _retrying(self) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            logger.warning(
                "transient failure (attempt %d), retrying: %s", state.attempt_number, exc
            )

        return Retrying(
            retry=retry_if_exception_type(TransientEmailError),
            stop=stop_after_delay(self.retry_budget_s) | stop_when_event_set(self._stop),
            wait=wait_exponential_jitter(multiplier=0.2, max=5.0, jitter=0.5),
            before_sleep=before_sleep,
            reraise=True,
        )

    @contextmanager
    def _count_transient(self) -> Iterator[None]:
        try:
            yield
        except TransientEmailError:
            EMAIL_FAILURES.labels(kind="transient").inc()
            raise

    @staticmethod
    def _result(
        new: NewDelivery, outcome: Outcome, *, reason: str | None = None, resumed: bool = False
    ) -> ProcessResult:
        return ProcessResult(
            outcome,
            new.source_topic,
            new.source_partition,
            new.source_offset,
            event_id=new.event_id,
            document_key=new.ref.document_key,
            message_id=new.ref.message_id,
            reason=reason,
            resumed=resumed,
        )

    def _already_final(self, new: NewDelivery) -> ProcessResult | None:
        """The duplicate result when the document's row is final already (``'sent'`` or
        ``'skipped'``), before anything is rendered; else None (the claim decides, as
        before: this read only saves a PDF render for a redelivered record).

        Raises:
            TransientEmailError: the delivery store stayed unavailable.
        """
        for attempt in self._retrying():
            with attempt, self._count_transient():
                row = self._store.get(document_key=new.ref.document_key)
        if row is None or not row.final:
            return None
        matched: Literal["event_id", "document"] = (
            "event_id" if row.event_id == new.event_id else "document"
        )
        return self._duplicate(new, Claim(ClaimKind.DUPLICATE, row, matched))

    def _duplicate(self, new: NewDelivery, claim: Claim) -> ProcessResult:
        matched = claim.matched or "document"
        EMAIL_DUPLICATES.labels(matched=matched).inc()
        logger.info(
            "duplicate %s (event %s, matched by %s, row status %s): nothing sent",
            new.ref.document_key,
            new.event_id,
            matched,
            claim.row.status,
        )
        return self._result(new, Outcome.DUPLICATE, reason=f"duplicate_{matched}")

    def _skip(self, new: NewDelivery, reason: str, label: str) -> ProcessResult:
        for attempt in self._retrying():
            with attempt, self._count_transient():
                claim = self._store.record_skipped(new, reason)
        if claim.kind is ClaimKind.DUPLICATE:
            return self._duplicate(new, claim)
        EMAILS_SKIPPED.labels(reason=label).inc()
        logger.info("not emailing %s (event %s): %s", new.ref.document_key, new.event_id, reason)
        return self._result(new, Outcome.SKIPPED, reason=reason)

    def _deliver(self, new: NewDelivery, message: EmailMessage) -> ProcessResult:
        def send() -> None:
            self._transport.send(
                message,
                from_address=self._settings.smtp.from_address,
                to_address=new.ref.recipient,
            )

        resumed: bool | None = None
        for attempt in self._retrying():
            with attempt, self._count_transient():
                claim = self._store.claim(new)
                if resumed is None:  # what the record found, before our own retries
                    resumed = claim.kind is ClaimKind.RESUMED
                if claim.kind is ClaimKind.DUPLICATE:
                    delivered = None
                else:
                    delivered = self._store.deliver(new.ref.document_key, send)
        if delivered is None:
            return self._duplicate(new, claim)
        if resumed:
            EMAIL_RESUMED.inc()
        if delivered.outcome is DeliverOutcome.ALREADY_FINAL:
            # another process finished the row while this one waited for its lock
            matched: Literal["event_id", "document"] = (
                "event_id" if delivered.row.event_id == new.event_id else "document"
            )
            return self._duplicate(new, Claim(ClaimKind.DUPLICATE, delivered.row, matched))
        if delivered.outcome is DeliverOutcome.REJECTED:
            EMAIL_FAILURES.labels(kind="permanent").inc()
            EMAILS_SKIPPED.labels(reason="smtp_rejected").inc()
            logger.error(
                "relay refused %s for %s (event %s): %s",
                new.ref.message_id,
                new.ref.recipient,
                new.event_id,
                delivered.row.skip_reason,
            )
            return self._result(
                new, Outcome.SKIPPED, reason=delivered.row.skip_reason, resumed=bool(resumed)
            )
        EMAILS_SENT.labels(document_type=new.ref.document_type).inc()
        logger.info(
            "sent %s to %s (event %s, %s/%d@%d, attempt %d)",
            new.ref.message_id,
            new.ref.recipient,
            new.event_id,
            new.source_topic,
            new.source_partition,
            new.source_offset,
            delivered.row.attempts,
        )
        return self._result(new, Outcome.SENT, resumed=bool(resumed))

    # ------------------------------------------------------------------ commit order

    def handle(self, msg: Message) -> ProcessResult:
        """Process one record, then commit its offset: the one place that owns the order.

        Order (docs/conventions.md "One commit point", docs/design.md "Email"; the commit goes
        through :class:`streams.core.billing.commit.CommitPoint`):

        1. :meth:`process` — the ``email_deliveries`` row is claimed in a committed
           transaction *before* the SMTP send, and marked ``'sent'``/``'skipped'``
           in a committed transaction after it (undecodable and voided records
           have no row);
        2. **only then** the offset ``msg.offset() + 1`` of the record's partition
           is committed to Kafka, synchronously.

        Consequences: a crash before 2 redelivers the record; its row is final, so
        the redelivery is a duplicate no-op (or, if the crash came between send and
        mark, a resend with the same ``Message-ID``). A transient failure in 1
        raises before 2, so the offset never moves past an unsent email. A failed
        offset commit (the partition was revoked meanwhile) is logged and counted
        (``invoicing_offset_commit_failures_total``), not raised: the row is final,
        so the new owner's redelivery is a no-op.

        Raises:
            TransientEmailError: from :meth:`process`; nothing committed.
            RuntimeError: no consumer was given to this sender.
        """
        if self._commit_point is None:
            raise RuntimeError("EmailSender.handle needs the consumer whose offsets it commits")
        topic, partition, offset = _coords(msg)
        result, _committed = self._commit_point.write_then_commit(
            lambda: self.process(msg), [TopicPartition(topic, partition, offset + 1)]
        )
        return result

    # ------------------------------------------------------------------ loop

    def run(self, *, poll_timeout_s: float = 0.5, pause_s: float = 1.0) -> None:
        """Poll and :meth:`handle` records one at a time, in order, until ``stop`` is set.

        With a prerenderer, the records already fetched after the first one (up to its
        ``limit``) come in the same poll and their PDFs are rendered ahead while each is
        handled in turn (:mod:`streams.apps.email.prerender`); the order and the commit
        after each record are the same.

        The consumer must already be subscribed. A record whose processing stays
        transiently failing is sought back to (with every later record of the poll, in
        its partition and the others) and polled again after ``pause_s`` (polling keeps
        the group membership alive meanwhile). A message-level Kafka error is logged; a
        fatal one raises. On ``stop``, the records of the poll not handled yet are given
        back the same way, uncommitted (redelivered to whoever polls next).

        Raises:
            KafkaException: a fatal consumer error.
            RuntimeError: no consumer was given to this sender.
        """
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("EmailSender.run needs a consumer")
        try:
            while not self._stop.is_set():
                records = self._poll(consumer, poll_timeout_s)
                for n, msg in enumerate(records):
                    stopping = self._stop.is_set()
                    if stopping or not self._run_one(msg):
                        # back to this record, and each other partition to its first
                        # record of this poll not handled yet: none is skipped, whoever
                        # polls next (this consumer again, or the next owner)
                        for later in first_of_each_partition(records[n:]):
                            self._seek_back(consumer, later)
                        if not stopping:
                            self._stop.wait(pause_s)
                        break
                if self._prerender is not None:
                    self._prerender.discard()
        finally:
            if self._prerender is not None:
                self._prerender.discard()

    def _poll(self, consumer: KafkaSource, timeout_s: float) -> list[Message]:
        """The next record, waiting up to ``timeout_s``; with a prerenderer, also those
        already fetched behind it (no wait for more), their PDFs started."""
        first = consumer.poll(timeout_s)
        if first is None:
            return []
        if self._prerender is None or self._documents is None:
            return [first]
        behind = self._prerender.limit - 1
        records = [first, *(consumer.consume(behind, 0) if behind else ())]
        self._prerender.prepare(
            announced(records),
            deliveries=self._store,
            documents=self._documents,
            domain=self._domain,
        )
        return records

    def _run_one(self, msg: Message) -> bool:
        """Handle ``msg``; False when it stays transiently failing (not committed)."""
        err = msg.error()
        if err is not None:
            if err.fatal():
                raise KafkaException(err)
            logger.warning("consumer error: %s", err)
            return True
        try:
            self.handle(msg)
        except TransientEmailError as exc:
            logger.warning(
                "record %s/%s@%s not done, will retry: %s",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                exc,
            )
            return False
        return True

    @staticmethod
    def _seek_back(consumer: KafkaSource, msg: Message) -> None:
        try:
            consumer.seek(TopicPartition(*_coords(msg)))
        except KafkaException as exc:  # the partition was revoked meanwhile
            logger.info(
                "seek back to %s/%s@%s: %s", msg.topic(), msg.partition(), msg.offset(), exc
            )


def _log_partitions(what: str) -> Callable[[KafkaSource, list[TopicPartition]], None]:
    def callback(consumer: KafkaSource, partitions: list[TopicPartition]) -> None:
        logger.info("%s: %s", what, ", ".join(f"{p.topic}[{p.partition}]" for p in partitions))

    return callback


def serve(sender: EmailSender, consumer: KafkaSource, settings: Settings) -> None:
    """Subscribe ``consumer`` to :func:`invoices_topic` and run ``sender`` until its
    ``stop`` is set. Serves Prometheus metrics on ``settings.worker.metrics_host:metrics_port``
    when that is not 0 (stopped on return). The caller built ``sender`` with
    ``consumer`` and closes both (:func:`streams.bootstrap.run_email_sender` does).

    Raises:
        KafkaException: a fatal consumer error.
    """
    server = None
    try:
        if settings.worker.metrics_port:
            host = settings.worker.metrics_host
            server, _thread = start_http_server(settings.worker.metrics_port, addr=host)
            logger.info("metrics on http://%s:%d/metrics", host, settings.worker.metrics_port)
        topic = invoices_topic(settings)
        consumer.subscribe(
            [topic],
            on_assign=_log_partitions("assigned"),
            on_revoke=_log_partitions("revoked"),
            on_lost=_log_partitions("lost"),
        )
        logger.info("email sender of group %s consuming %s", settings.worker.email_group, topic)
        sender.run()
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
