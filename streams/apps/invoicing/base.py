"""The state every job of the invoicing worker shares, and the moves on a partition.

:class:`WorkerBase` holds what the worker knows (settings, clients, the
per-partition :class:`~streams.apps.invoicing.partitions.PartitionState`, the
backoff gates, the counters) and the moves the other jobs make on a partition:
pause and resume (with the offset it restarts at), commit its offsets after the
database commit (:class:`~streams.core.billing.commit.CommitPoint`), back it off
after a transient failure, drop it when its fence refuses a write. The jobs are
mixins over it: the batch write (:mod:`streams.apps.invoicing.ingest`), the
invoice-job dispatch (:mod:`streams.apps.invoicing.dispatch`), and the poll loop
with the rebalance callbacks (:mod:`streams.apps.invoicing.worker`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from confluent_kafka import KafkaException, TopicPartition
from psycopg_pool import PoolTimeout

from streams import topics
from streams.apps.invoicing.gate import Gate
from streams.apps.invoicing.jobs import JobContext
from streams.apps.invoicing.metrics import FAILURES, JOBS_IN_FLIGHT, OWNED_PARTITIONS
from streams.apps.invoicing.partitions import PartitionState
from streams.core.billing import fencing, rows
from streams.core.billing.commit import CommitPoint
from streams.core.billing.dead_letters import DeadLetters
from streams.core.billing.failures import Disposition, Failure, classify
from streams.core.billing.metrics import FENCING_REFUSALS
from streams.core.billing.ports import Database, KafkaSink, KafkaSource, TaxService
from streams.core.billing.stores import POSTGRES, Stores
from streams.settings import Settings

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = ["WorkerBase"]


class WorkerBase:
    """The shared state and partition moves (module docstring); the constructor's
    arguments are :class:`~streams.apps.invoicing.worker.InvoicingWorker`'s."""

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
        # a synchronous commit waits at most a quarter of max.poll.interval.ms, so a
        # coordinator that never answers never stops the poll loop (commit.py)
        self.commit_point = CommitPoint(
            self.consumer, wait_s=settings.kafka.max_poll_interval_ms / 1000 / 4
        )
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
        self._db = Gate("database", retry_backoff_s, 30.0)
        self._dlq = Gate("the dead-letter topic", retry_backoff_s, 30.0)
        #: partition → what we track for it, from its assignment to its revoke or loss
        self.partitions: dict[int, PartitionState] = {}
        self.stats: dict[str, int] = defaultdict(int)
        #: close marker event id → invoice jobs that met another writer's tax document
        self._contended: dict[str, int] = defaultdict(int)
        #: partition → (its state, token, records) to handle at the next poll before
        #: anything fetched: what was read ahead of a marker whose job succeeded
        self._ready: dict[int, tuple[PartitionState, fencing.FencingToken, list[rows.Record]]] = {}
        #: the poll loop: when its current iteration began (monotonic; None between
        #: iterations), and the clock at the ends of the last one's parts (worker.py
        #: `poll_once`)
        self._iteration_started: float | None = None
        self._marks: list[float] = []

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
        JOBS_IN_FLIGHT.set(
            sum(len(state.job.markers) for state in self._jobs() if state.job is not None)
        )

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
        """Resume ``partition`` at ``at_offset`` (else at its rewind offset, if any).

        A seek or resume the client refuses (``_STATE`` while a rebalance is in
        progress) for a partition we still hold leaves it paused, remembers the offset
        as its rewind and marks it :attr:`PartitionState.resume_pending`, tried again
        each poll (:meth:`_retry_resumes`): a partition is never left paused for good,
        and the records fetched while it was paused are read again, never skipped."""
        state = self.partitions.get(partition)
        rewind = state.take_rewind() if state is not None else None
        offset = at_offset if at_offset is not None else rewind
        try:
            if offset is not None:
                self.consumer.seek(TopicPartition(self.topic, partition, offset))
            self.consumer.resume([TopicPartition(self.topic, partition)])
        except KafkaException as exc:
            if state is None or self.partitions.get(partition) is not state:
                log.debug("seek/resume of partition %s failed: %s", partition, exc)
                return  # not ours any more: the next owner reads from the committed offset
            if offset is not None:
                state.rewind_at_most(offset)
            state.resume_pending = True
            log.warning(
                "seek/resume of partition %s failed (%s); kept paused, retried next poll",
                partition,
                exc,
            )
            return
        if state is not None:
            state.resume_pending = False

    def _retry_resumes(self) -> None:
        """Resume the partitions whose resume failed (:meth:`_resume`), once nothing
        keeps them paused (no job in flight, no backoff, claimed)."""
        for state in list(self.partitions.values()):
            if (
                state.resume_pending
                and state.owned
                and state.job is None
                and state.backoff_until is None
            ):
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

    def _commit_many(self, next_offsets: dict[int, int]) -> None:
        """:meth:`_commit` of several partitions in one offset commit (a poll batch's)."""
        if not next_offsets:
            return
        committed = self.commit_point.commit(
            [TopicPartition(self.topic, p, offset) for p, offset in sorted(next_offsets.items())]
        )
        for partition, offset in next_offsets.items():
            state = self.partitions.get(partition)
            if state is None:
                continue
            if committed:
                state.commit_done(offset)
            else:
                state.commit_refused(offset)

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

    def _start_marker(
        self,
        partition: int,
        token: fencing.FencingToken,
        closes: list[rows.CloseMarker],
        known: set[int],
    ) -> None:
        """Hand a run of close markers to their invoice jobs (the dispatch's; see
        :meth:`streams.apps.invoicing.dispatch.DispatchMixin._start_marker`)."""
        raise NotImplementedError
