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

Ownership: on assignment the worker parses its fencing token from
``consumer_group_metadata()`` and claims each partition's fence row upward
(the partition fence of :mod:`streams.billing.fencing`); on revoke or loss it
cancels that partition's in-flight job (and counts "partition lost while a job
was in flight"). Every write transaction checks the fence; a refused write drops
the partition's work without committing offsets. What the worker knows of each
assigned partition is one :class:`~streams.invoicing.partitions.PartitionState`.

The SQL, the fences, the issuance transaction, the commit point and the
dead-letter sink are the billing kernel's (:mod:`streams.billing`); the worker
is the loop around them, built by :func:`streams.bootstrap.invoicing_worker`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaException, TopicPartition

from streams import topics
from streams.adapters.kafka import Record, group_metadata, record_of
from streams.billing import fencing, rows
from streams.billing.commit import CommitPoint, write_fenced
from streams.billing.dead_letters import (
    DeadLetterError,
    DeadLetters,
    customers_of,
    header_text,
    period_of,
)
from streams.billing.metrics import CLAIMS_REFUSED, FENCING_REFUSALS
from streams.billing.ports import Database, KafkaSink, KafkaSource, TaxService
from streams.billing.stores import POSTGRES, Stores
from streams.domain.codec import decode
from streams.domain.errors import InvalidEvent
from streams.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.invoicing.jobs import JobContext, JobResult, Outcome, run_invoice_job
from streams.invoicing.metrics import (
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
    """Effects of a run of records of one partition, written in one transaction."""

    customers: list[tuple[str, CustomerUpserted, rows.SourceCoordinates]] = field(
        default_factory=list
    )
    usage: list[rows.UsageRecord] = field(default_factory=list)
    metered: list[rows.MeteredRecord] = field(default_factory=list)
    subscriptions: list[rows.SubscriptionRecord] = field(default_factory=list)
    holds: list[rows.HoldRequest] = field(default_factory=list)
    messages: list[Record] = field(default_factory=list)


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
            self.producer, topics.ACCOUNT_EVENTS_DLQ.with_prefix(prefix).name, self.group_id
        )
        self.jobs_ctx = JobContext(
            pool=pool, tax=tax, invoices_topic=self.invoices_topic, stores=stores
        )
        self.executor = ThreadPoolExecutor(
            max_workers=settings.worker.max_jobs, thread_name_prefix="invoice-job"
        )
        self.stop = stop or threading.Event()
        self.retry_backoff_s = retry_backoff_s
        #: partition → what we track for it, from its assignment to its revoke or loss
        self.partitions: dict[int, PartitionState] = {}
        self.stats: dict[str, int] = defaultdict(int)

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
        state = self.partitions.setdefault(token.partition, PartitionState(token.partition))
        try:
            with self.pool.connection() as conn:
                self.stores.fences.claim(conn, token)
        except fencing.ClaimRefused as exc:
            CLAIMS_REFUSED.inc()
            self.stats["claims_refused"] += 1
            log.error(
                "ALERT fence claim refused: %s; partition left unprocessed "
                "(if the group was reset, run `invoicing fences reset %s`)",
                exc,
                token.group_id,
            )
            state.unclaimed = True
            return
        except psycopg.Error as exc:
            log.warning("fence claim of partition %s failed (%s); will retry", token.partition, exc)
            state.unclaimed = True
            state.pending_claim = token
            return
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
        for state in list(self.partitions.values()):
            if state.pending_claim is not None:
                self._claim(state.pending_claim)
                if state.owned:
                    self._resume(state.partition)

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
        batch = _Batch()
        for msg in msgs:
            source = rows.SourceCoordinates(msg.topic, msg.partition, msg.offset)
            try:
                envelope = decode(msg.key, msg.value, msg.headers, allowed=ACCOUNT_EVENT_TYPES)
            except InvalidEvent as exc:
                if not self._dead_letter_invalid(batch, msg, source, exc.reason):
                    self._flush_failed(partition, msgs[0].offset, "dead-letter publish failed")
                    return
                batch.messages.append(msg)
                continue
            data = envelope.data
            if isinstance(data, CustomerUpserted):
                batch.customers.append((envelope.id, data, source))
            elif isinstance(data, UsageRecorded):
                batch.usage.append(rows.UsageRecord(envelope.id, data, source))
            elif isinstance(data, UsageMetered):
                batch.metered.append(rows.MeteredRecord(envelope.id, data, source))
            elif isinstance(data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded):
                batch.subscriptions.append(rows.SubscriptionRecord(envelope.id, data, source))
            elif isinstance(data, BillingPeriodClosed):
                if not self._flush(partition, token, batch, next_offset=msg.offset):
                    return
                marker = rows.CloseMarker(
                    envelope.id,
                    data.customer_id,
                    data.billing_period,
                    data.reason,
                    source,
                    data.lease_fencing_token,
                )
                self._start_job(partition, token, marker)
                RECORDS.labels("billing_period.closed", "job_started").inc()
                return  # later records are fetched again after the job (it seeks past the marker)
            batch.messages.append(msg)
        if batch.messages:
            self._flush(partition, token, batch, next_offset=msgs[-1].offset + 1)

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

        Returns False when the dead-letter record was not delivered (the caller
        rewinds and retries after a backoff, without committing); never raises.
        """
        customers = customers_of(msg)
        if not customers:
            reason = (
                f"{reason}; could not be attributed to a customer (no usable UTF-8 key, "
                "ce_subject header or customer_id in the value): no invoice is held"
            )
        try:
            self.dead_letters.publish(
                key=msg.key,
                value=msg.value,
                headers=msg.headers,
                source_topic=source.topic,
                source_partition=source.partition,
                source_offset=source.offset,
                kind="invalid",
                reason=reason,
                attributed=bool(customers),
            )
        except DeadLetterError as exc:
            log.warning("%s", exc)
            return False
        RECORDS.labels("invalid", "dead_lettered").inc()
        self.stats["dead_lettered"] += 1
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
                    "event_id": header_text(msg, "ce_id"),
                    "source": source,
                }
            )
        return True

    def _flush(
        self, partition: int, token: fencing.FencingToken, batch: _Batch, *, next_offset: int
    ) -> bool:
        """Write the batch (fenced) and commit ``next_offset``. False when it failed
        (the partition is rewound, paused or dropped accordingly)."""
        if not batch.messages:
            return True
        first_offset = batch.messages[0].offset

        def work(conn: Any) -> list[rows.UsageConflict | rows.RecordConflict]:
            for event_id, data, source in batch.customers:
                self.stores.usage.upsert_customer(conn, event_id, data, source)
            conflicts: list[rows.UsageConflict | rows.RecordConflict] = list(
                self.stores.usage.insert_usage(conn, batch.usage)
            )
            originals = {m.offset: m for m in batch.messages}
            for conflict in list(conflicts):
                if not isinstance(conflict, rows.UsageConflict):
                    continue
                record = conflict.record
                reason = (
                    f"event id {record.event_id} already recorded with a different payload "
                    f"(stored from {conflict.stored_source.topic}[{conflict.stored_source.partition}]"
                    f"@{conflict.stored_source.offset}); the stored line is kept"
                )
                self._publish_conflict(record, reason, originals.get(record.source.offset))
                batch.holds.append(
                    {
                        "customer_id": record.data.customer_id,
                        "billing_period": record.data.billing_period,
                        "reason": reason,
                        "event_id": record.event_id,
                        "source": record.source,
                    }
                )
            for other in self.stores.metering.insert_metered(
                conn, batch.metered
            ) + self.stores.metering.insert_subscriptions(conn, batch.subscriptions):
                reason = (
                    f"event id {other.record.event_id} already recorded with a different payload "
                    f"(stored from {other.stored_source.topic}[{other.stored_source.partition}]"
                    f"@{other.stored_source.offset}); the stored {other.record.data.event_type} "
                    "is kept"
                )
                self._publish_record_conflict(
                    other, reason, originals.get(other.record.source.offset)
                )
                batch.holds.append(
                    {
                        "customer_id": other.record.data.customer_id,
                        "billing_period": other.billing_period,
                        "reason": reason,
                        "event_id": other.record.event_id,
                        "source": other.record.source,
                    }
                )
                conflicts.append(other)
            for hold in batch.holds:
                self.stores.holds.record_hold(conn, **hold)
            return conflicts

        try:
            conflicts = write_fenced(self.pool, token, work, stores=self.stores)
        except fencing.Fenced as exc:
            self._fenced(partition, "records", exc)
            return False
        except (psycopg.Error, DeadLetterError) as exc:
            log.warning(
                "writing %s records of partition %s failed (%s); retrying",
                len(batch.messages),
                partition,
                exc,
            )
            self._flush_failed(partition, first_offset, str(exc))
            return False
        if batch.holds:
            HOLDS.inc(len(batch.holds))
        usage_conflicts = sum(1 for c in conflicts if isinstance(c, rows.UsageConflict))
        metered_conflicts = sum(
            1
            for c in conflicts
            if isinstance(c, rows.RecordConflict) and isinstance(c.record, rows.MeteredRecord)
        )
        RECORDS.labels("usage.recorded", "stored").inc(len(batch.usage) - usage_conflicts)
        RECORDS.labels("customer.upserted", "stored").inc(len(batch.customers))
        RECORDS.labels("usage.metered", "stored").inc(len(batch.metered) - metered_conflicts)
        RECORDS.labels("subscription", "stored").inc(
            len(batch.subscriptions) - (len(conflicts) - usage_conflicts - metered_conflicts)
        )
        self.stats["usage_stored"] += len(batch.usage) - usage_conflicts
        self.stats["metered_stored"] += len(batch.metered) - metered_conflicts
        self._commit(partition, next_offset)
        return True

    def _publish_conflict(
        self, record: rows.UsageRecord, reason: str, original: Record | None
    ) -> None:
        """Dead-letter a conflicting duplicate as it was read: the original key, value
        and headers (DESIGN §3 invariant 5: "the original record + reason"), with the
        ``dlq.*`` reason and source coordinates. Re-encoded from the parsed event only
        if the original is not in the batch (never expected).

        Raises:
            DeadLetterError: not delivered (the caller's transaction rolls back and
                the batch is retried after a backoff).
        """
        if original is not None:
            key, value, headers = original.key, original.value, list(original.headers)
        else:
            from streams.domain.codec import encode
            from streams.domain.events import Envelope

            encoded = encode(
                Envelope.wrap(record.data, id=record.event_id, source="/invoicing/worker/conflict")
            )
            key, value, headers = encoded.key, encoded.value, list(encoded.headers)
        self.dead_letters.publish(
            key=key,
            value=value,
            headers=headers,
            source_topic=record.source.topic,
            source_partition=record.source.partition,
            source_offset=record.source.offset,
            kind="conflict",
            reason=reason,
        )
        RECORDS.labels("usage.recorded", "conflict").inc()
        self.stats["conflicts"] += 1
        log.warning("usage conflict dead-lettered: %s", reason)

    def _publish_record_conflict(
        self, conflict: rows.RecordConflict, reason: str, original: Record | None
    ) -> None:
        """Dead-letter a conflicting metered or subscription event as it was read (see
        :meth:`_publish_conflict`).

        Raises:
            DeadLetterError: not delivered (the batch is retried after a backoff).
        """
        record = conflict.record
        if original is not None:
            key, value, headers = original.key, original.value, list(original.headers)
        else:
            from streams.domain.codec import encode
            from streams.domain.events import Envelope

            encoded = encode(
                Envelope.wrap(record.data, id=record.event_id, source="/invoicing/worker/conflict")
            )
            key, value, headers = encoded.key, encoded.value, list(encoded.headers)
        self.dead_letters.publish(
            key=key,
            value=value,
            headers=headers,
            source_topic=record.source.topic,
            source_partition=record.source.partition,
            source_offset=record.source.offset,
            kind="conflict",
            reason=reason,
        )
        RECORDS.labels(record.data.event_type, "conflict").inc()
        self.stats["conflicts"] += 1
        log.warning("%s conflict dead-lettered: %s", record.data.event_type, reason)

    def _flush_failed(self, partition: int, rewind_to: int, reason: str) -> None:
        self._back_off(partition)
        self._pause(partition, rewind_to)

    def _back_off(self, partition: int, *, rewind_to: int | None = None) -> None:
        """Keep ``partition`` paused for ``retry_backoff_s`` (and restart at ``rewind_to``)."""
        state = self.partitions.get(partition)
        if state is None:
            return
        state.backoff_until = time.monotonic() + self.retry_backoff_s
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
            self._job_done(state.partition, job.future.result())

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
        if result.outcome in (Outcome.RETRY, Outcome.CANCELLED):
            log.warning(
                "invoice of %s %s will be retried: %s",
                marker.customer_id,
                marker.billing_period,
                result.detail,
            )
            self._back_off(partition, rewind_to=marker.source.offset)
            return
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

    def _reject_marker(self, partition: int, result: JobResult) -> bool:
        """A permanent failure: dead-letter the marker, hold the customer's period."""
        marker = result.marker
        reason = f"invoice refused: {result.detail}"
        try:
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

            write_fenced(self.pool, result.token, work, stores=self.stores)
        except fencing.Fenced as exc:
            self._fenced(partition, "invoice", exc)
            return False
        except (psycopg.Error, DeadLetterError) as exc:
            log.warning(
                "recording the refused invoice of %s failed (%s); retrying", marker.customer_id, exc
            )
            self._back_off(partition, rewind_to=marker.source.offset)
            return False
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
        deadline = time.monotonic() + 30
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
