"""The invoicing worker: a member of consumer group ``invoicing`` on ``billing.account-events.v1``.

Per partition, records are handled in offset order:

- ``customer.upserted``, ``usage.recorded``, ``usage.metered`` and
  ``subscription.*`` are stored in batches (one fenced transaction per partition
  per poll, then the offset commit — the commit point of
  :mod:`streams.billing.commit`); usage, metered usage and subscription events
  are deduplicated by event id, and the same id with a different payload is
  dead-lettered as a conflict, never overwritten (its customer held: the period
  of a metered event, every period for a subscription event);
- a ``billing_period.closed`` marker first flushes what precedes it, then
  **pauses** the partition and hands an invoice job to a thread pool
  (:mod:`streams.invoicing.jobs`). The poll loop keeps polling — which keeps the
  membership alive, the Kafka form of lease renewal — and when the job reports,
  commits the marker's offset, seeks past it and resumes the partition;
- an undecodable or invalid record goes to the dead-letter topic with its reason
  and source coordinates, and the invoice of every customer it could belong to
  (key, ``ce_subject``, the value's ``customer_id``) is **held** (a row each in
  ``invoice_holds``) so nobody is invoiced from partial data; a record that names
  no usable customer is dead-lettered all the same, logged at ERROR and counted.

**Bad input never stalls a partition** (DESIGN §3 invariant 5, issue 10). Every
failure is classified by :func:`streams.billing.failures.classify`: transient and
unexpected ones back the partition off and retry; a permanent one is dealt with
once. A batch whose transaction fails permanently (PostgreSQL refuses a value of
one record) is **bisected** until the one record is found; it is dead-lettered
(``unwritable``) and its customer held, and its neighbours are written. Each
dead letter is produced and acknowledged *before* the transaction that moves past
it (never inside one), which records it in ``dead_letters`` with the holds; every
batch first reads those rows for its offsets, so a record dead-lettered once is
skipped on every redelivery — never dead-lettered, never tried again.

**The poll thread is never held** by a dependency that is away: every database
call of the poll thread waits at most ``db_timeout_s`` for a connection, and after
a transient failure the poll thread stops calling the database for a backoff
(claims stay pending, partitions paused), so a PostgreSQL outage costs one short
wait per backoff instead of the pool's timeout per partition per poll; the
dead-letter topic likewise (one bounded flush per batch, a backoff after a
failure, letters still in flight never produced twice).

Ownership: on assignment the worker parses its fencing token from
``consumer_group_metadata()`` and claims each partition's fence row upward
(the partition fence of :mod:`streams.billing.fencing`); on revoke or loss it
cancels that partition's in-flight job (and counts "partition lost while a job
was in flight"). Every write transaction checks the fence; a refused write drops
the partition's work without committing offsets. What the worker knows of each
assigned partition is one :class:`~streams.invoicing.partitions.PartitionState`.

The SQL, the fences, the issuance transaction, the commit point, the dead-letter
sink and the failure table are the billing kernel's (:mod:`streams.billing`); the
worker is the loop around them, built by :func:`streams.bootstrap.invoicing_worker`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaException, TopicPartition
from psycopg_pool import PoolTimeout

from streams import topics
from streams.adapters.kafka import Record, group_metadata, record_of
from streams.billing import fencing, rows
from streams.billing.commit import CommitPoint, write_fenced
from streams.billing.dead_letters import (
    DeadLetterError,
    DeadLetters,
    Delivery,
    Letter,
    customers_of,
    header_text,
    period_of,
)
from streams.billing.failures import Disposition, Failure, TransientError, classify
from streams.billing.metrics import CLAIMS_REFUSED, FENCING_REFUSALS
from streams.billing.ports import Database, KafkaSink, KafkaSource, TaxService
from streams.billing.stores import POSTGRES, Stores
from streams.domain.codec import decode
from streams.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.invoicing.jobs import JobContext, JobResult, Outcome, run_invoice_job
from streams.invoicing.metrics import (
    BISECTIONS,
    DATABASE_BACKOFFS,
    FAILURES,
    HOLDS,
    INVOICES,
    JOBS_IN_FLIGHT,
    OWNED_PARTITIONS,
    PARTITIONS_LOST_WITH_JOB,
    RECORDS,
)
from streams.invoicing.partitions import InvoiceJob, PartitionState
from streams.settings import Settings

log = logging.getLogger("streams.invoicing.worker")

#: The event types the worker reads; any other type on the topic is dead-lettered.
#: A new stored type is added here and to the batch routing of :meth:`InvoicingWorker._handle`
#: and the batch write; its failures need no new handling (streams/billing/failures.py).
ACCOUNT_EVENT_TYPES = (
    CustomerUpserted,
    UsageRecorded,
    BillingPeriodClosed,
    UsageMetered,
    SubscriptionStarted,
    SubscriptionChanged,
    SubscriptionEnded,
)


@dataclass
class _Batch:
    """Effects of a run of records of one partition, written in one transaction.

    ``letters`` are the dead letters handed to the producer for this run
    (``deliveries``, waited for before the transaction) and recorded in
    ``dead_letters`` by it; ``holds`` the holds they cause.
    """

    customers: list[tuple[str, CustomerUpserted, rows.SourceCoordinates]] = field(
        default_factory=list
    )
    usage: list[rows.UsageRecord] = field(default_factory=list)
    metered: list[rows.MeteredRecord] = field(default_factory=list)
    subscriptions: list[rows.SubscriptionRecord] = field(default_factory=list)
    holds: list[rows.HoldRequest] = field(default_factory=list)
    messages: list[Record] = field(default_factory=list)
    letters: list[rows.DeadLetterRecord] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)

    def offsets(self) -> list[int]:
        """The offsets with an effect in this batch, in order."""
        found = {source.offset for _id, _data, source in self.customers}
        found |= {record.source.offset for record in self.usage}
        found |= {record.source.offset for record in self.metered}
        found |= {record.source.offset for record in self.subscriptions}
        found |= {hold["source"].offset for hold in self.holds}
        found |= {letter.source_offset for letter in self.letters}
        return sorted(found)

    def split(self, at: int) -> tuple[_Batch, _Batch]:
        """The effects of offsets below ``at``, and the others (deliveries stay out)."""
        left, right = _Batch(), _Batch()
        for item in self.customers:
            (left if item[2].offset < at else right).customers.append(item)
        for record in self.usage:
            (left if record.source.offset < at else right).usage.append(record)
        for metered in self.metered:
            (left if metered.source.offset < at else right).metered.append(metered)
        for event in self.subscriptions:
            (left if event.source.offset < at else right).subscriptions.append(event)
        for hold in self.holds:
            (left if hold["source"].offset < at else right).holds.append(hold)
        for letter in self.letters:
            (left if letter.source_offset < at else right).letters.append(letter)
        for msg in self.messages:
            (left if msg.offset < at else right).messages.append(msg)
        return left, right

    def has_record_at(self, offset: int) -> bool:
        """Whether a stored effect (customer, usage, metered or subscription event)
        comes from ``offset``."""
        return (
            any(s.offset == offset for _i, _d, s in self.customers)
            or any(r.source.offset == offset for r in self.usage)
            or any(m.source.offset == offset for m in self.metered)
            or any(e.source.offset == offset for e in self.subscriptions)
        )


class _Raced(TransientError):
    """A usage id was stored by someone else between the batch's read and its write."""


class _RecordConflicts(Exception):
    """Metered or subscription events of the batch conflict with stored ones (same id,
    another payload): the batch's transaction is rolled back, they are dead-lettered,
    and the batch is written without them."""

    def __init__(self, conflicts: list[rows.RecordConflict]) -> None:
        super().__init__(f"{len(conflicts)} conflicting metered or subscription event(s)")
        self.conflicts = conflicts


class _Gate:
    """Backoff of a dependency the poll thread calls: after a failure it stays closed
    for ``initial_s`` seconds, doubling up to ``max_s`` while failures repeat."""

    def __init__(self, name: str, initial_s: float, max_s: float) -> None:
        self.name = name
        self.initial_s = initial_s
        self.max_s = max_s
        self.closed_until = 0.0
        self.failures = 0

    def open(self) -> bool:
        return time.monotonic() >= self.closed_until

    def failed(self, reason: str) -> None:
        self.failures += 1
        wait = min(self.max_s, self.initial_s * 2 ** min(self.failures - 1, 10))
        self.closed_until = time.monotonic() + wait
        if self.name == "database":
            DATABASE_BACKOFFS.inc()
        log.warning(
            "%s unavailable (%s); the poll thread leaves it alone for %.1fs",
            self.name,
            reason,
            wait,
        )

    def succeeded(self) -> None:
        if self.failures:
            log.info("%s available again after %d failure(s)", self.name, self.failures)
        self.failures = 0
        self.closed_until = 0.0


@dataclass(frozen=True)
class _Decoded:
    """A record of the run, decoded (``envelope``) or refused (``reason``)."""

    msg: Record
    source: rows.SourceCoordinates
    envelope: Envelope | None
    reason: str | None


class InvoicingWorker:
    """One member of the invoicing consumer group. ``run()`` polls until ``stop`` is set.

    Built by :func:`streams.bootstrap.invoicing_worker` (the composition root); it
    builds no client itself.

    Args:
        settings: the settings (topics from ``kafka.topic_prefix``; group from
            ``worker.invoicing_group``; ``worker.batch_size``, ``worker.max_jobs``).
        pool: PostgreSQL pool of the application role (``max_jobs + 2`` connections),
            or another :class:`~streams.billing.ports.Database` with its ``stores``.
        tax: the tax service.
        consumer: a consumer of group ``worker.invoicing_group`` (manual commits,
            cooperative-sticky); this worker subscribes and closes it.
        producer: for the dead-letter topic; this worker flushes it on shutdown.
        stores: the store implementations ``pool``'s connections take (default: the
            PostgreSQL ones, :data:`streams.billing.stores.POSTGRES`).
        stop: when set, :meth:`run` finishes and returns.
        retry_backoff_s: pause of a partition after a transient failure (seconds).
        db_timeout_s: longest wait of the poll thread for a database connection
            (seconds); after a transient failure the poll thread leaves the database
            alone for ``retry_backoff_s``, doubling up to 30 s.
        dead_letter_timeout_s: longest wait for the dead letters of one batch (seconds).
        shutdown_grace_s: on stop, how long running invoice jobs may take to finish
            (queued ones are cancelled at once; their markers are redelivered).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        pool: Database[Any],
        tax: TaxService,
        consumer: KafkaSource,
        producer: KafkaSink,
        stores: Stores[Any] = POSTGRES,
        stop: threading.Event | None = None,
        retry_backoff_s: float = 2.0,
        db_timeout_s: float = 2.0,
        dead_letter_timeout_s: float = 10.0,
        shutdown_grace_s: float = 30.0,
    ) -> None:
        prefix = settings.kafka.topic_prefix
        self.settings = settings
        self.group_id = settings.worker.invoicing_group
        self.topic = topics.ACCOUNT_EVENTS.with_prefix(prefix).name
        self.invoices_topic = topics.INVOICES.with_prefix(prefix).name
        self.pool = pool
        self.stores = stores
        self.consumer = consumer
        self.producer = producer
        self.commit_point = CommitPoint(self.consumer)
        self.dead_letters = DeadLetters(
            self.producer,
            topics.ACCOUNT_EVENTS_DLQ.with_prefix(prefix).name,
            self.group_id,
            timeout_s=dead_letter_timeout_s,
        )
        self.jobs_ctx = JobContext(
            pool=pool, tax=tax, invoices_topic=self.invoices_topic, stores=stores
        )
        self.executor = ThreadPoolExecutor(
            max_workers=settings.worker.max_jobs, thread_name_prefix="invoice-job"
        )
        self.stop = stop or threading.Event()
        self.retry_backoff_s = retry_backoff_s
        self.db_timeout_s = db_timeout_s
        self.shutdown_grace_s = shutdown_grace_s
        self._db = _Gate("database", retry_backoff_s, 30.0)
        self._dlq = _Gate("the dead-letter topic", retry_backoff_s, 30.0)
        #: partition → what we track for it, from its assignment to its revoke or loss
        self.partitions: dict[int, PartitionState] = {}
        self.stats: dict[str, int] = defaultdict(int)
        #: close marker event id → invoice jobs that met another writer's tax document
        self._contended: dict[str, int] = defaultdict(int)

    # ------------------------------------------------------------------ partition state

    def _owned(self, partition: int) -> PartitionState | None:
        """The partition's state if it is claimed and not fenced, else None."""
        state = self.partitions.get(partition)
        return state if state is not None and state.owned else None

    def _jobs(self) -> list[PartitionState]:
        """The states of the partitions with an invoice job in flight."""
        return [state for state in self.partitions.values() if state.job is not None]

    def _gauges(self) -> None:
        OWNED_PARTITIONS.set(sum(1 for state in self.partitions.values() if state.owned))
        JOBS_IN_FLIGHT.set(len(self._jobs()))

    def _failed(self, stage: str, exc: BaseException) -> Failure:
        """Classify ``exc`` (the one table), count it, close the database gate when
        the database is what failed, and log an unexpected one with its traceback."""
        failure = classify(exc)
        FAILURES.labels(stage, failure.disposition.value).inc()
        self.stats[f"failures_{failure.disposition.value}"] += 1
        if failure.disposition is Disposition.TRANSIENT and isinstance(
            exc, psycopg.Error | PoolTimeout
        ):
            self._db.failed(failure.reason)
        if failure.disposition is Disposition.UNEXPECTED:
            log.error("ALERT unexpected failure (%s): %s", stage, failure.reason, exc_info=exc)
        return failure

    # ------------------------------------------------------------------ rebalance callbacks

    def _on_assign(self, consumer: KafkaSource, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        # librdkafka keeps a partition's pause flag across revoke/loss and re-assignment to
        # the same consumer (measured with librdkafka 2.16): a partition paused for an invoice
        # job when it was lost would come back paused and never be read again. A new
        # assignment starts unpaused; our own state for it was cleared by _release.
        consumer.resume(partitions)
        gm = group_metadata(consumer)
        for tp in partitions:
            token = fencing.FencingToken(
                self.group_id, tp.topic, tp.partition, gm.generation_id, gm.member_id
            )
            self._claim(token)
        self._gauges()

    def _claim(self, token: fencing.FencingToken) -> None:
        """Claim ``token``'s partition. A refused claim is reported once (ALERT, counted)
        and not tried again; a claim that meets a database failure — or a database the
        poll thread is leaving alone — stays pending and is retried once the database
        is back (:meth:`_retry_claims`)."""
        state = self.partitions.setdefault(token.partition, PartitionState(token.partition))
        if not self._db.open():
            state.unclaimed = True
            state.pending_claim = token
            return
        try:
            with self.pool.connection(timeout=self.db_timeout_s) as conn:
                self.stores.fences.claim(conn, token)
        except fencing.ClaimRefused as exc:
            self._db.succeeded()
            CLAIMS_REFUSED.inc()
            self.stats["claims_refused"] += 1
            log.error(
                "ALERT fence claim refused: %s; partition left unprocessed "
                "(if the group was reset, run `invoicing fences reset %s`)",
                exc,
                token.group_id,
            )
            state.unclaimed = True
            state.pending_claim = None  # refused for good: never retried, never re-alerted
            return
        except Exception as exc:
            failure = self._failed("claim", exc)
            log.warning(
                "fence claim of partition %s failed (%s); will retry",
                token.partition,
                failure.reason,
            )
            state.unclaimed = True
            state.pending_claim = token
            return
        self._db.succeeded()
        state.claimed(token)
        log.info(
            "claimed %s[%s] at generation %s as %s",
            token.topic,
            token.partition,
            token.generation,
            token.member_id,
        )

    def _on_revoke(self, consumer: KafkaSource, partitions: list[TopicPartition]) -> None:
        self._release(partitions, "revoked")

    def _on_lost(self, consumer: KafkaSource, partitions: list[TopicPartition]) -> None:
        self._release(partitions, "lost")

    def _release(self, partitions: list[TopicPartition], how: str) -> None:
        for tp in partitions:
            state = self.partitions.pop(tp.partition, None)
            job = state.job if state is not None else None
            if job is not None:
                job.cancel.set()
                job.future.add_done_callback(self._orphan_done)
                PARTITIONS_LOST_WITH_JOB.labels(how).inc()
                self.stats["partitions_lost_with_job"] += 1
                log.error(
                    "partition lost while a job was in flight: %s[%s] %s (invoice job for %s %s cancelled)",
                    tp.topic,
                    tp.partition,
                    how,
                    job.marker.customer_id,
                    job.marker.billing_period,
                )
        self._gauges()

    # ------------------------------------------------------------------ main loop

    def run(self) -> None:
        """Subscribe and poll until ``stop`` is set; then finish, commit and leave the group.

        Errors of single records, of the database and of the tax service do not end
        the loop: they are retried, dead-lettered or held per record (module doc).

        Raises:
            KafkaException: a fatal consumer error (librdkafka's ``err.fatal()``, e.g.
                the consumer was fenced); the process should exit and be restarted,
                its partitions move to the other members meanwhile.
        """
        self.consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("invoicing worker polling %s as group %s", self.topic, self.group_id)
        try:
            while not self.stop.is_set():
                self.poll_once()
        finally:
            self._shutdown()

    def poll_once(self, timeout_s: float = 0.5) -> None:
        """One iteration: job results, pending claims and backoffs, then one poll.

        While invoice jobs run, the poll waits at most 50 ms so that a finished
        job's partition is resumed promptly (the next marker of that partition
        waits for it); otherwise up to ``timeout_s``.
        """
        self._collect_jobs()
        self._retry_claims()
        self._retry_commits()
        self._end_backoffs()
        messages = self._fetch(min(timeout_s, 0.05) if self._jobs() else timeout_s)
        by_partition: dict[int, list[Record]] = defaultdict(list)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.fatal():  # the client cannot go on (librdkafka "Fatal errors")
                    log.error("fatal consumer error, stopping: %s", err)
                    raise KafkaException(err)
                log.warning("consumer error: %s", err)
                continue
            record = record_of(msg)
            by_partition[record.partition].append(record)
        for partition, msgs in by_partition.items():
            self._handle_partition(partition, msgs)

    def _fetch(self, timeout_s: float) -> list[Any]:
        """Up to ``batch_size`` records: what is already fetched, else wait up to
        ``timeout_s`` for the first one. (``consume(n, timeout)`` alone waits the whole
        timeout unless ``n`` records arrive, which would delay every marker.)"""
        batch = self.settings.worker.batch_size
        messages = self.consumer.consume(num_messages=batch, timeout=0)
        if messages:
            return list(messages)
        first = self.consumer.poll(timeout_s)
        if first is None:
            return []
        return [first, *self.consumer.consume(num_messages=batch - 1, timeout=0)]

    def _pause(self, partition: int, rewind_to: int | None) -> None:
        """Pause ``partition``; when it resumes it restarts at the lowest ``rewind_to`` given
        (records fetched while it is paused are dropped, never skipped)."""
        state = self.partitions.get(partition)
        if rewind_to is not None and state is not None:
            state.rewind_at_most(rewind_to)
        try:
            self.consumer.pause([TopicPartition(self.topic, partition)])
        except KafkaException as exc:  # not assigned any more: nothing to pause
            log.debug("pause of partition %s failed: %s", partition, exc)

    def _resume(self, partition: int, at_offset: int | None = None) -> None:
        """Resume ``partition`` at ``at_offset`` (else at its rewind offset, if any)."""
        state = self.partitions.get(partition)
        rewind = state.take_rewind() if state is not None else None
        offset = at_offset if at_offset is not None else rewind
        try:
            if offset is not None:
                self.consumer.seek(TopicPartition(self.topic, partition, offset))
            self.consumer.resume([TopicPartition(self.topic, partition)])
        except KafkaException as exc:
            log.debug("seek/resume of partition %s failed: %s", partition, exc)

    def _retry_claims(self) -> None:
        if not self._db.open():
            return
        for state in list(self.partitions.values()):
            if state.pending_claim is not None:
                self._claim(state.pending_claim)
                if state.owned:
                    self._resume(state.partition)
                if not self._db.open():
                    return

    def _commit(self, partition: int, next_offset: int) -> None:
        """Commit ``next_offset`` of ``partition`` (after the database commit). A commit
        the broker refuses while we keep the partition (ILLEGAL_GENERATION or
        REBALANCE_IN_PROGRESS during a cooperative rebalance) is retried each poll:
        otherwise, with no later record on the partition, its committed offset would
        stay behind for good (lag never 0) until the partition moved."""
        committed = self.commit_point.commit([TopicPartition(self.topic, partition, next_offset)])
        state = self.partitions.get(partition)
        if state is None:
            return
        if committed:
            state.commit_done(next_offset)
        else:
            state.commit_refused(next_offset)

    def _retry_commits(self) -> None:
        for state in list(self.partitions.values()):
            if state.uncommitted is None:
                continue
            if state.owned:
                self._commit(state.partition, state.uncommitted)
            else:  # not ours any more: the next owner commits (or redoes, idempotently)
                state.uncommitted = None

    def _end_backoffs(self) -> None:
        now = time.monotonic()
        for state in list(self.partitions.values()):
            if state.backoff_until is not None and now >= state.backoff_until:
                state.backoff_until = None
                if state.owned and state.job is None:
                    self._resume(state.partition)

    # ------------------------------------------------------------------ records

    def _handle_partition(self, partition: int, msgs: list[Record]) -> None:
        state = self.partitions.get(partition)
        token = state.token if state is not None else None
        if (
            state is None
            or token is None
            or state.job is not None
            or state.backoff_until is not None
        ):
            # Not ours to process now. A claim pending: pause and restart here once
            # claimed. A job or a backoff: its end seeks explicitly. Fenced or
            # revoked: not ours at all.
            if state is not None and state.claiming:
                self._pause(partition, msgs[0].offset)
            return
        if not self._db.open():  # the database is away: keep these for later
            self._flush_failed(partition, msgs[0].offset, "the database is backing off")
            return
        run = self._decode_run(msgs)
        marker = run[-1] if run and _is_marker(run[-1]) else None
        records = run[:-1] if marker is not None else run
        try:
            known, stored = self._prepare(partition, records)
        except Exception as exc:
            failure = self._failed("read", exc)
            log.warning("reading for partition %s failed (%s); retrying", partition, failure.reason)
            self._flush_failed(partition, msgs[0].offset, failure.reason)
            return
        batch = _Batch()
        seen: dict[str, tuple[str, rows.SourceCoordinates]] = {}
        for item in records:
            msg, source = item.msg, item.source
            if msg.offset in known:  # dead-lettered on an earlier delivery: done with it
                self.stats["dead_letters_skipped_on_redelivery"] += 1
                batch.messages.append(msg)
                continue
            if item.envelope is None:
                if not self._dead_letter_invalid(batch, msg, source, item.reason or "invalid"):
                    self._flush_failed(partition, msgs[0].offset, "dead-letter publish failed")
                    return
                batch.messages.append(msg)
                continue
            data = item.envelope.data
            if isinstance(data, CustomerUpserted):
                batch.customers.append((item.envelope.id, data, source))
            elif isinstance(data, UsageRecorded):
                record = rows.UsageRecord(item.envelope.id, data, source)
                first = stored.get(record.event_id) or seen.get(record.event_id)
                if first is None:
                    seen[record.event_id] = (record.payload_sha256, source)
                    batch.usage.append(record)
                elif first[0] == record.payload_sha256:
                    batch.usage.append(record)  # a duplicate: a no-op
                elif not self._dead_letter_conflict(batch, record, first[1], msg):
                    self._flush_failed(partition, msgs[0].offset, "dead-letter publish failed")
                    return
            elif isinstance(data, UsageMetered):
                batch.metered.append(rows.MeteredRecord(item.envelope.id, data, source))
            elif isinstance(data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded):
                batch.subscriptions.append(rows.SubscriptionRecord(item.envelope.id, data, source))
            batch.messages.append(msg)
        next_offset = marker.msg.offset if marker is not None else msgs[-1].offset + 1
        if batch.messages and not self._flush(partition, token, batch, next_offset=next_offset):
            return
        if marker is not None and marker.envelope is not None:
            data = marker.envelope.data
            assert isinstance(data, BillingPeriodClosed)  # _is_marker checked it
            close = rows.CloseMarker(
                marker.envelope.id,
                data.customer_id,
                data.billing_period,
                data.reason,
                marker.source,
                data.lease_fencing_token,
            )
            if marker.msg.offset in known:  # a marker dead-lettered (rejected) before
                self._commit(partition, marker.msg.offset + 1)
                self._resume(partition, marker.msg.offset + 1)
                return
            self._start_job(partition, token, close)
            RECORDS.labels("billing_period.closed", "job_started").inc()
            # later records are fetched again after the job (it seeks past the marker)

    def _decode_run(self, msgs: list[Record]) -> list[_Decoded]:
        """The records up to and including the first close marker, each decoded or with
        the reason it is refused (a codec failure that is not an InvalidEvent is
        classified: permanent ones are refusals too)."""
        run: list[_Decoded] = []
        for msg in msgs:
            source = rows.SourceCoordinates(msg.topic, msg.partition, msg.offset)
            try:
                envelope = decode(msg.key, msg.value, msg.headers, allowed=ACCOUNT_EVENT_TYPES)
            except Exception as exc:
                failure = classify(exc)
                reason = getattr(exc, "reason", None) or failure.reason
                if not failure.permanent:  # a codec bug: never dead-letter good data for it
                    log.error("ALERT decoding %s failed: %s", source, failure.reason, exc_info=exc)
                    reason = f"the decoder failed ({failure.reason})"
                run.append(_Decoded(msg, source, None, reason))
                continue
            decoded = _Decoded(msg, source, envelope, None)
            run.append(decoded)
            if _is_marker(decoded):
                break
        return run

    def _prepare(
        self, partition: int, run: list[_Decoded]
    ) -> tuple[dict[int, rows.DeadLetterRecord], dict[str, tuple[str, rows.SourceCoordinates]]]:
        """One short read: the dead letters already recorded for the run's offsets, and
        the stored payload hash and source of every usage event id of the run (to tell
        duplicates from conflicts before anything is written or dead-lettered)."""
        offsets = [item.msg.offset for item in run]
        ids = [
            item.envelope.id
            for item in run
            if item.envelope is not None and isinstance(item.envelope.data, UsageRecorded)
        ]
        with self.pool.connection(timeout=self.db_timeout_s) as conn:
            known = self.stores.dead_letters.recorded(conn, self.topic, partition, offsets)
            stored = self.stores.usage.stored_payloads(conn, ids) if ids else {}
            conn.rollback()
        self._db.succeeded()
        return known, stored

    def _dead_letter_invalid(
        self, batch: _Batch, msg: Record, source: rows.SourceCoordinates, reason: str
    ) -> bool:
        """Dead-letter an undecodable or invalid record and queue a hold for every
        customer it could belong to (:func:`~streams.billing.dead_letters.customers_of`): its key, its
        ``ce_subject`` header, its value's ``customer_id``, when they differ each of
        them (the key alone could name the wrong customer, and the real one would be
        invoiced from partial data). A record attributable to nobody is still
        dead-lettered (invariant 5, DESIGN §3), with a reason that says no invoice
        is held, an ERROR log line and ``invoicing_dead_lettered_total{attribution=
        "unattributed"}`` (docs/architecture.md "Holds instead of partial invoices").

        The record is handed to the producer here; the batch waits for it before its
        transaction (:meth:`_flush`), which records it in ``dead_letters`` with the holds.

        Returns False when the producer refused the dead-letter record (the caller
        rewinds and retries after a backoff, without committing); never raises.
        """
        customers = customers_of(msg)
        if not customers:
            reason = (
                f"{reason}; could not be attributed to a customer (no usable UTF-8 key, "
                "ce_subject header or customer_id in the value): no invoice is held"
            )
        letter = Letter(
            msg.key,
            msg.value,
            list(msg.headers),
            source.topic,
            source.partition,
            source.offset,
            "invalid",
            reason,
            bool(customers),
        )
        try:
            batch.deliveries.append(self.dead_letters.submit(letter))
        except DeadLetterError as exc:
            log.warning("%s", exc)
            return False
        RECORDS.labels("invalid", "dead_lettered").inc()
        self.stats["dead_lettered"] += 1
        event_id = header_text(msg, "ce_id")
        batch.letters.append(
            rows.DeadLetterRecord(
                source.topic,
                source.partition,
                source.offset,
                self.dead_letters.topic,
                "invalid",
                reason,
                event_id,
                customers,
            )
        )
        if not customers:
            self.stats["dead_lettered_unattributed"] += 1
            log.error(
                "dead-lettered %s[%s]@%s without a hold: %s",
                source.topic,
                source.partition,
                source.offset,
                reason,
            )
            return True
        log.warning(
            "dead-lettered %s[%s]@%s (holding %s): %s",
            source.topic,
            source.partition,
            source.offset,
            ", ".join(customers),
            reason,
        )
        attributed = f" (attributed to {', '.join(customers)})" if len(customers) > 1 else ""
        for customer in customers:
            batch.holds.append(
                {
                    "customer_id": customer,
                    "billing_period": period_of(msg),
                    "reason": f"dead-lettered: {reason}{attributed}",
                    "event_id": event_id,
                    "source": source,
                }
            )
        return True

    def _dead_letter_conflict(
        self,
        batch: _Batch,
        record: rows.UsageRecord,
        stored_at: rows.SourceCoordinates,
        original: Record,
    ) -> bool:
        """Dead-letter a conflicting duplicate as it was read — the original key, value
        and headers (DESIGN §3 invariant 5: "the original record + reason") — and hold
        the customer's period; the stored line is kept. False when the producer refused."""
        reason = (
            f"event id {record.event_id} already recorded with a different payload "
            f"(stored from {stored_at.topic}[{stored_at.partition}]@{stored_at.offset}); "
            "the stored line is kept"
        )
        letter = Letter(
            original.key,
            original.value,
            list(original.headers),
            record.source.topic,
            record.source.partition,
            record.source.offset,
            "conflict",
            reason,
        )
        return self._submit_conflict(
            batch,
            letter,
            event_type="usage.recorded",
            event_id=record.event_id,
            customer_id=record.data.customer_id,
            billing_period=record.data.billing_period,
            source=record.source,
        )

    def _submit_conflict(
        self,
        batch: _Batch,
        letter: Letter,
        *,
        event_type: str,
        event_id: str,
        customer_id: str,
        billing_period: str | None,
        source: rows.SourceCoordinates,
    ) -> bool:
        """Submit a conflict's dead letter; on acceptance count it, and add to the batch
        its ``dead_letters`` row and the hold of ``customer_id``'s ``billing_period``
        (None: every period), written in the batch's transaction. False when the
        producer refused the letter (the batch is retried)."""
        try:
            batch.deliveries.append(self.dead_letters.submit(letter))
        except DeadLetterError as exc:
            log.warning("%s", exc)
            return False
        RECORDS.labels(event_type, "conflict").inc()
        self.stats["conflicts"] += 1
        log.warning("%s conflict dead-lettered: %s", event_type, letter.reason)
        batch.letters.append(
            rows.DeadLetterRecord(
                source.topic,
                source.partition,
                source.offset,
                self.dead_letters.topic,
                "conflict",
                letter.reason,
                event_id,
                [customer_id],
            )
        )
        batch.holds.append(
            {
                "customer_id": customer_id,
                "billing_period": billing_period,
                "reason": letter.reason,
                "event_id": event_id,
                "source": source,
            }
        )
        return True

    def _dead_letter_unwritable(self, batch: _Batch, msg: Record, failure: Failure) -> bool:
        """A valid record the database refused (found by bisecting): dead-letter it as
        ``unwritable`` with the database's reason and hold its customers."""
        source = rows.SourceCoordinates(msg.topic, msg.partition, msg.offset)
        customers = customers_of(msg)
        reason = (
            f"the database refused this record ({failure.reason}); the contract should "
            "have refused it (streams/domain/events.py)"
        )
        letter = Letter(
            msg.key,
            msg.value,
            list(msg.headers),
            source.topic,
            source.partition,
            source.offset,
            "unwritable",
            reason,
            bool(customers),
        )
        try:
            batch.deliveries.append(self.dead_letters.submit(letter))
        except DeadLetterError as exc:
            log.warning("%s", exc)
            return False
        self.stats["dead_lettered_unwritable"] += 1
        log.error("ALERT dead-lettered %s as unwritable: %s", source, reason)
        event_id = header_text(msg, "ce_id")
        batch.letters.append(
            rows.DeadLetterRecord(
                source.topic,
                source.partition,
                source.offset,
                self.dead_letters.topic,
                "unwritable",
                reason,
                event_id,
                customers,
            )
        )
        for customer in customers:
            batch.holds.append(
                {
                    "customer_id": customer,
                    "billing_period": period_of(msg),
                    "reason": f"dead-lettered: {reason}",
                    "event_id": event_id,
                    "source": source,
                }
            )
        return True

    def _flush(
        self, partition: int, token: fencing.FencingToken, batch: _Batch, *, next_offset: int
    ) -> bool:
        """Wait for the batch's dead letters, write the batch (fenced; bisected when a
        record makes it fail for good) and commit ``next_offset``. False when it failed
        (the partition is rewound, paused or dropped accordingly)."""
        if not batch.messages:
            return True
        first_offset = batch.messages[0].offset
        if not self._await_dead_letters(partition, first_offset, batch.deliveries):
            return False
        if not self._write(partition, token, batch, first_offset):
            return False
        if batch.holds:
            HOLDS.inc(len(batch.holds))
        RECORDS.labels("usage.recorded", "stored").inc(len(batch.usage))
        RECORDS.labels("customer.upserted", "stored").inc(len(batch.customers))
        RECORDS.labels("usage.metered", "stored").inc(len(batch.metered))
        RECORDS.labels("subscription", "stored").inc(len(batch.subscriptions))
        self.stats["usage_stored"] += len(batch.usage)
        self.stats["metered_stored"] += len(batch.metered)
        self._commit(partition, next_offset)
        return True

    def _await_dead_letters(
        self, partition: int, first_offset: int, deliveries: list[Delivery]
    ) -> bool:
        """Wait (bounded) for ``deliveries``; False (partition backed off) if they did not
        all arrive. Pending ones stay tracked and are not produced again on the retry."""
        if not deliveries:
            return True
        if not self._dlq.open():
            self._flush_failed(partition, first_offset, "the dead-letter topic is backing off")
            return False
        try:
            self.dead_letters.wait(deliveries)
        except DeadLetterError as exc:
            FAILURES.labels("dead_letter", Disposition.TRANSIENT.value).inc()
            self._dlq.failed(str(exc))
            self._flush_failed(partition, first_offset, str(exc))
            return False
        self._dlq.succeeded()
        return True

    def _write(
        self, partition: int, token: fencing.FencingToken, batch: _Batch, first_offset: int
    ) -> bool:
        """One fenced transaction for ``batch``; a permanent failure bisects it."""
        try:
            write_fenced(
                self.pool,
                token,
                _write_batch(batch, self.stores),
                stores=self.stores,
                timeout_s=self.db_timeout_s,
            )
        except fencing.Fenced as exc:
            self._fenced(partition, "records", exc)
            return False
        except _RecordConflicts as exc:
            # Metered or subscription events whose id is stored with another payload
            # (found by the store's insert; the transaction rolled back): dead-letter
            # them as read, outside any transaction, hold their customers, write the rest.
            return self._write_without_conflicts(partition, token, batch, first_offset, exc)
        except Exception as exc:
            failure = self._failed("write", exc)
            if failure.permanent:
                return self._bisect(partition, token, batch, first_offset, failure)
            log.warning(
                "writing %s records of partition %s failed (%s); retrying",
                len(batch.messages),
                partition,
                failure.reason,
            )
            self._flush_failed(partition, first_offset, failure.reason)
            return False
        self._db.succeeded()
        return True

    def _bisect(
        self,
        partition: int,
        token: fencing.FencingToken,
        batch: _Batch,
        first_offset: int,
        failure: Failure,
    ) -> bool:
        """A batch that fails for good: write each half on its own (each its own
        transaction, in order) until the record that fails is alone; dead-letter it as
        ``unwritable`` and hold its customers. Its neighbours are written."""
        offsets = batch.offsets()
        if len(offsets) > 1:
            BISECTIONS.inc()
            left, right = batch.split(offsets[len(offsets) // 2])
            return self._write(partition, token, left, first_offset) and self._write(
                partition, token, right, first_offset
            )
        offset = offsets[0] if offsets else first_offset
        if batch.has_record_at(offset):
            msg = next((m for m in batch.messages if m.offset == offset), None)
            if msg is None:  # pragma: no cover - a record's effects come with its message
                self._flush_failed(partition, first_offset, failure.reason)
                return False
            bad = _Batch(messages=[msg])
            if not self._dead_letter_unwritable(bad, msg, failure):
                self._flush_failed(partition, first_offset, "dead-letter publish failed")
                return False
            if not self._await_dead_letters(partition, first_offset, bad.deliveries):
                return False
            return self._write(partition, token, bad, first_offset)
        if batch.holds:  # only the holds of a dead letter were refused: keep the dead letter
            log.error(
                "ALERT the holds of %s[%s]@%s were refused (%s); recording its dead letter "
                "without them",
                self.topic,
                partition,
                offset,
                failure.reason,
            )
            kept = _Batch(messages=list(batch.messages), letters=list(batch.letters))
            return self._write(partition, token, kept, first_offset)
        log.error(
            "ALERT recording the dead letter of %s[%s]@%s failed for good: %s; retrying",
            self.topic,
            partition,
            offset,
            failure.reason,
        )
        self._flush_failed(partition, first_offset, failure.reason)
        return False

    def _write_without_conflicts(
        self,
        partition: int,
        token: fencing.FencingToken,
        batch: _Batch,
        first_offset: int,
        found: _RecordConflicts,
    ) -> bool:
        """Dead-letter the conflicting metered / subscription events of ``found`` (each
        once, as it was read, with its customer held: the period of a metered event,
        every period for a subscription event), then write ``batch`` without them."""
        originals = {m.offset: m for m in batch.messages}
        conflicted: set[int] = set()
        for conflict in found.conflicts:
            offset = conflict.record.source.offset
            if offset in conflicted:
                continue
            if not self._dead_letter_record_conflict(batch, conflict, originals.get(offset)):
                self._flush_failed(partition, first_offset, "dead-letter publish failed")
                return False
            conflicted.add(offset)
        if not self._await_dead_letters(partition, first_offset, batch.deliveries):
            return False
        batch.metered = [r for r in batch.metered if r.source.offset not in conflicted]
        batch.subscriptions = [r for r in batch.subscriptions if r.source.offset not in conflicted]
        return self._write(partition, token, batch, first_offset)

    def _dead_letter_record_conflict(
        self, batch: _Batch, conflict: rows.RecordConflict, original: Record | None
    ) -> bool:
        """Submit the dead letter of a conflicting metered or subscription event (see
        :meth:`_dead_letter_conflict`); queue its ``dead_letters`` row and hold. False
        when the producer refused it."""
        record = conflict.record
        stored = conflict.stored_source
        reason = (
            f"event id {record.event_id} already recorded with a different payload "
            f"(stored from {stored.topic}[{stored.partition}]@{stored.offset}); "
            f"the stored {record.data.event_type} is kept"
        )
        if original is not None:
            key, value, headers = original.key, original.value, list(original.headers)
        else:  # pragma: no cover - a record's effects come with its message
            from streams.domain.codec import encode

            encoded = encode(
                Envelope.wrap(record.data, id=record.event_id, source="/invoicing/worker/conflict")
            )
            key, value, headers = encoded.key, encoded.value, list(encoded.headers)
        letter = Letter(
            key,
            value,
            headers,
            record.source.topic,
            record.source.partition,
            record.source.offset,
            "conflict",
            reason,
        )
        return self._submit_conflict(
            batch,
            letter,
            event_type=record.data.event_type,
            event_id=record.event_id,
            customer_id=record.data.customer_id,
            billing_period=conflict.billing_period,
            source=record.source,
        )

    def _flush_failed(self, partition: int, rewind_to: int, reason: str) -> None:
        self._back_off(partition)
        self._pause(partition, rewind_to)

    def _back_off(
        self, partition: int, *, rewind_to: int | None = None, seconds: float | None = None
    ) -> None:
        """Keep ``partition`` paused for ``seconds`` (default ``retry_backoff_s``) and
        restart at ``rewind_to``."""
        state = self.partitions.get(partition)
        if state is None:
            return
        state.backoff_until = time.monotonic() + (
            self.retry_backoff_s if seconds is None else seconds
        )
        if rewind_to is not None:
            state.rewind_to = rewind_to

    @staticmethod
    def _orphan_done(future: Future[JobResult]) -> None:
        """A job whose partition was revoked or lost ended (runs on the job's thread).
        Nobody collects its result; a write it tried after the new owner's claim was
        refused by the fence, and that refusal is reported here like any other."""
        if future.cancelled() or future.exception() is not None:
            return  # never started, or a bug run_invoice_job already logged
        result = future.result()
        if result.outcome is Outcome.FENCED:
            FENCING_REFUSALS.labels("invoice").inc()
            log.error(
                "write refused by fencing on partition %s (invoice, after the partition "
                "was revoked or lost): %s; dropping its work",
                result.token.partition,
                result.detail,
            )

    def _fenced(self, partition: int, stage: str, exc: fencing.Fenced) -> None:
        FENCING_REFUSALS.labels(stage).inc()
        self.stats["fencing_refusals"] += 1
        log.error(
            "write refused by fencing on partition %s (%s): %s; dropping its work",
            partition,
            stage,
            exc,
        )
        state = self.partitions.get(partition)
        if state is not None:
            state.token = None
        self._pause(partition, None)

    # ------------------------------------------------------------------ invoice jobs

    def _start_job(
        self, partition: int, token: fencing.FencingToken, marker: rows.CloseMarker
    ) -> None:
        self._pause(partition, None)
        cancel = threading.Event()
        future = self.executor.submit(run_invoice_job, self.jobs_ctx, marker, token, cancel)
        self.partitions[partition].job = InvoiceJob(marker, token, cancel, future)
        self._gauges()

    def _collect_jobs(self) -> None:
        for state in self._jobs():
            job = state.job
            if job is None or not job.future.done():
                continue
            state.job = None
            self._gauges()
            self._job_done(state.partition, _result_of(job))

    def _job_done(self, partition: int, result: JobResult) -> None:
        marker = result.marker
        INVOICES.labels(result.outcome.value).inc()
        self.stats[f"invoice_{result.outcome.value}"] += 1
        owned = self._owned(partition)
        still_ours = owned is not None and owned.token == result.token
        if result.outcome is Outcome.FENCED:
            self._fenced(partition, "invoice", fencing.Fenced(result.token, None))
            return
        if not still_ours:
            return
        if result.outcome is Outcome.CONTENDED:
            self._contended_job(partition, result)
            return
        if result.outcome in (Outcome.RETRY, Outcome.CANCELLED):
            log.warning(
                "invoice of %s %s will be retried: %s",
                marker.customer_id,
                marker.billing_period,
                result.detail,
            )
            self._back_off(partition, rewind_to=marker.source.offset)
            return
        self._contended.pop(marker.event_id, None)
        if result.outcome is Outcome.FAILED and not self._reject_marker(partition, result):
            return
        if result.outcome is Outcome.INVOICED:
            log.info(
                "invoiced %s %s: %s %s (%.2fs)",
                marker.customer_id,
                marker.billing_period,
                result.invoice_number,
                result.detail,
                result.seconds,
            )
            if self.settings.fault.kill_after_db_commit:
                _fault_kill_after_db_commit()
        self._commit(partition, marker.source.offset + 1)
        self.partitions[partition].rewind_to = None
        self._resume(partition, marker.source.offset + 1)

    def _contended_job(self, partition: int, result: JobResult) -> None:
        """Another writer (a replay) committed the tax document of this revision under
        the same idempotency key and has not written its invoice yet: wait for it, with
        a backoff that grows to a minute, and raise an ALERT every tenth time (a replay
        that died there resumes with the next ``invoicing replay PERIOD --apply``)."""
        marker = result.marker
        self._contended[marker.event_id] += 1
        times = self._contended[marker.event_id]
        wait = min(60.0, self.retry_backoff_s * 2 ** min(times - 1, 5))
        line = "invoice of %s %s waits for another writer's revision (%s); try %d, next in %.0fs"
        if times % 10 == 0:
            log.error(
                "ALERT " + line + "; if a replay run of the period died, resume it with "
                "`invoicing replay %s --apply`",
                marker.customer_id,
                marker.billing_period,
                result.detail,
                times,
                wait,
                marker.billing_period,
            )
        else:
            log.warning(line, marker.customer_id, marker.billing_period, result.detail, times, wait)
        self._back_off(partition, rewind_to=marker.source.offset, seconds=wait)

    def _reject_marker(self, partition: int, result: JobResult) -> bool:
        """A permanent failure: dead-letter the marker (once: a marker found in
        ``dead_letters`` is not published again), hold the customer's period."""
        marker = result.marker
        reason = f"invoice refused: {result.detail}"
        if not self._db.open():
            self._back_off(partition, rewind_to=marker.source.offset)
            return False
        try:
            with self.pool.connection(timeout=self.db_timeout_s) as conn:
                known = self.stores.dead_letters.recorded(
                    conn, marker.source.topic, marker.source.partition, [marker.source.offset]
                )
                conn.rollback()
            if not known:
                self.dead_letters.publish(
                    key=marker.customer_id.encode(),
                    value=json.dumps(
                        {
                            "customer_id": marker.customer_id,
                            "billing_period": marker.billing_period,
                            "close_event_id": marker.event_id,
                        }
                    ).encode(),
                    headers=[
                        ("ce_id", marker.event_id.encode()),
                        ("ce_type", b"billing_period.closed"),
                    ],
                    source_topic=marker.source.topic,
                    source_partition=marker.source.partition,
                    source_offset=marker.source.offset,
                    kind="rejected",
                    reason=reason,
                )

            def work(conn: Any) -> None:
                self.stores.holds.record_hold(
                    conn,
                    customer_id=marker.customer_id,
                    billing_period=marker.billing_period,
                    reason=reason,
                    event_id=marker.event_id,
                    source=marker.source,
                )
                self.stores.closes.record_close(conn, marker, "held", None)
                self.stores.dead_letters.record(
                    conn,
                    [
                        rows.DeadLetterRecord(
                            marker.source.topic,
                            marker.source.partition,
                            marker.source.offset,
                            self.dead_letters.topic,
                            "rejected",
                            reason,
                            marker.event_id,
                            [marker.customer_id],
                        )
                    ],
                )

            write_fenced(
                self.pool, result.token, work, stores=self.stores, timeout_s=self.db_timeout_s
            )
        except fencing.Fenced as exc:
            self._fenced(partition, "invoice", exc)
            return False
        except Exception as exc:
            failure = self._failed("invoice", exc)
            log.warning(
                "recording the refused invoice of %s failed (%s); retrying",
                marker.customer_id,
                failure.reason,
            )
            self._back_off(partition, rewind_to=marker.source.offset)
            return False
        self._db.succeeded()
        HOLDS.inc()
        log.error(
            "invoice of %s %s refused and held: %s",
            marker.customer_id,
            marker.billing_period,
            reason,
        )
        return True

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self) -> None:
        """Finish: cancel the invoice jobs that have not started (their markers are not
        committed, so the next owner gets them), give the running ones
        ``shutdown_grace_s`` to finish (then cancel them: they stop before the tax call
        or before the write), commit what is done, close the consumer (LeaveGroup) and
        flush the producer. Never raises for a job's outcome."""
        for state in self._jobs():
            if state.job is not None:
                state.job.future.cancel()  # only a queued job can be cancelled
        deadline = time.monotonic() + self.shutdown_grace_s
        while self._jobs() and time.monotonic() < deadline:
            self._collect_jobs()
            time.sleep(0.05)
        for state in self._jobs():
            if state.job is not None:
                state.job.cancel.set()
        self.executor.shutdown(wait=True, cancel_futures=True)
        self._collect_jobs()
        self._retry_commits()
        try:
            self.consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer: %s", exc)
        self.producer.flush(10)
        log.info("invoicing worker stopped: %s", dict(self.stats))


def _is_marker(item: _Decoded) -> bool:
    return item.envelope is not None and isinstance(item.envelope.data, BillingPeriodClosed)


def _result_of(job: InvoiceJob) -> JobResult:
    """A finished job's result; a job cancelled before it started, or one that raised
    (run_invoice_job never does), is a result too (not committed, retried)."""
    if job.future.cancelled():
        return JobResult(job.marker, job.token, Outcome.CANCELLED, "cancelled before it started")
    error = job.future.exception()
    if error is not None:
        return JobResult(job.marker, job.token, Outcome.RETRY, f"{type(error).__name__}: {error}")
    return job.future.result()


def _write_batch(batch: _Batch, stores: Stores[Any]) -> Callable[[Any], None]:
    """The batch's statements, after the fence check: customers, usage (no conflict may
    appear: they were found before), metered and subscription events (a conflict
    rolls the transaction back: :class:`_RecordConflicts`), holds, and the dead
    letters' rows."""

    def work(conn: Any) -> None:
        for event_id, data, source in batch.customers:
            stores.usage.upsert_customer(conn, event_id, data, source)
        conflicts = stores.usage.insert_usage(conn, batch.usage)
        if conflicts:
            raise _Raced(
                f"{len(conflicts)} usage event id(s) stored meanwhile with another payload, "
                f"e.g. {conflicts[0].record.event_id}"
            )
        others = stores.metering.insert_metered(
            conn, batch.metered
        ) + stores.metering.insert_subscriptions(conn, batch.subscriptions)
        if others:
            raise _RecordConflicts(others)
        for hold in batch.holds:
            stores.holds.record_hold(conn, **hold)
        stores.dead_letters.record(conn, batch.letters)

    return work


def _fault_kill_after_db_commit() -> None:
    """FAULT-INJECTION HOOK for the chaos tests, never for production: SIGKILL this
    process now, after the invoice job's database commit and before the marker's
    offset commit (``INVOICING_FAULT__KILL_AFTER_DB_COMMIT=1``, see
    :class:`streams.settings.FaultSettings`). The next owner of the partition gets
    the marker again and must find the invoice already written."""
    log.error(
        "fault injection: SIGKILL after the invoice's database commit, before the offset commit"
    )
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
