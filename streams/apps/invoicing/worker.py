"""The invoicing worker: a member of consumer group ``invoicing`` on ``billing.account-events.v1``.

Per partition, records are handled in offset order, a poll's records of every
partition together:

- ``customer.upserted``, ``usage.recorded``, ``usage.metered`` and
  ``subscription.*`` are stored in **one fenced transaction per poll batch** for all
  its partitions, then one offset commit (the commit point of
  :mod:`streams.core.billing.commit`): :mod:`streams.apps.invoicing.ingest`, whose
  effects are a :class:`~streams.apps.invoicing.batch.Batch`. Usage, metered usage and
  subscription events are deduplicated by event id; the same id with a different
  payload is dead-lettered as a conflict, never overwritten, and its customer held;
- a ``billing_period.closed`` marker first has what precedes it written, then
  **pauses** its partition and hands an invoice job to a thread pool
  (:mod:`streams.apps.invoicing.dispatch`, :mod:`streams.apps.invoicing.jobs`). The poll
  loop keeps polling — which keeps the membership alive, the Kafka form of lease
  renewal — and when the job reports, commits the marker's offset, seeks past it
  and resumes the partition;
- an undecodable or invalid record goes to the dead-letter topic with its reason and
  source coordinates, and the invoice of every customer it could belong to is
  **held** (:mod:`streams.apps.invoicing.letters`, one builder for every dead letter).

**Bad input never stalls a partition** (docs/architecture.md "Guarantees"). Every
failure is classified by :func:`streams.core.billing.failures.classify`: transient and
unexpected ones back the partition off and retry; a permanent one is dealt with once
(a batch PostgreSQL refuses for good is bisected to the one record). Each dead
letter is acknowledged *before* the transaction that moves past it, which records
it in ``dead_letters``, so a record dead-lettered once is skipped on every redelivery.

**The poll thread is never held** by a dependency that is away: every database call
of the poll thread waits at most ``db_timeout_s`` for a connection, and after a
transient failure it leaves the database (or the dead-letter topic) alone for a
backoff (:class:`~streams.apps.invoicing.gate.Gate`).

Ownership: on assignment the worker parses its fencing token from
``consumer_group_metadata()`` and claims each partition's fence row upward (the
partition fence of :mod:`streams.core.billing.fencing`); on revoke or loss it cancels
that partition's in-flight job (and counts "partition lost while a job was in
flight"). Every write transaction checks the fences first; a refused partition's
work is dropped without committing its offsets. What the worker knows of each
assigned partition is one :class:`~streams.apps.invoicing.partitions.PartitionState`
(:class:`~streams.apps.invoicing.base.WorkerBase` holds the shared state).

The worker is split by job: the poll loop and the rebalance callbacks (this module),
the batch write (:mod:`~streams.apps.invoicing.ingest`, :mod:`~streams.apps.invoicing.batch`),
dead-lettering (:mod:`~streams.apps.invoicing.letters`), the invoice-job dispatch
(:mod:`~streams.apps.invoicing.dispatch`) and the drafts: re-rating after late usage and
the grace timer (:mod:`~streams.apps.invoicing.drafts`, docs/invoices.md "Drafts and
finalisation"). Built by
:func:`streams.bootstrap.invoicing_worker`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections import defaultdict
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from streams.adapters.kafka import group_metadata, record_of
from streams.apps.invoicing.batch import Batch
from streams.apps.invoicing.ingest import ACCOUNT_EVENT_TYPES, IngestMixin
from streams.apps.invoicing.metrics import PARTITIONS_LOST_WITH_JOB
from streams.apps.invoicing.partitions import PartitionState
from streams.core.billing import fencing
from streams.core.billing.metrics import CLAIMS_REFUSED
from streams.core.billing.ports import KafkaSource
from streams.core.billing.rows import Record

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = ["ACCOUNT_EVENT_TYPES", "JOB_POLL_S", "InvoicingWorker"]

#: Seconds the poll waits at most while invoice jobs run: a finished job is collected
#: (and its partition's next marker started) within this (docs/architecture.md "Long
#: jobs"). Each empty poll costs microseconds of the poll thread.
JOB_POLL_S = 0.01

#: The shortest poll iteration logged as slow (seconds): above the idle poll's own wait
#: (0.5 s), whatever a quarter of ``max.poll.interval.ms`` is.
SLOW_ITERATION_MIN_S = 2.0

#: The parts of one poll iteration as :meth:`InvoicingWorker.poll_once` times them.
_PHASES = (
    "jobs, claims and commits",
    "backoffs, resumes, drafts and timers",
    "fetch (the consumer's poll, its rebalance callbacks included)",
    "records",
)

#: The former name of a batch (the tests of the dead-letter paths build one).
_Batch = Batch


class InvoicingWorker(IngestMixin):
    """One member of the invoicing consumer group. ``run()`` polls until ``stop`` is set.

    Built by :func:`streams.bootstrap.invoicing_worker` (the composition root); it
    builds no client itself.

    Args:
        settings: the settings (topics from ``kafka.topic_prefix``; group from
            ``worker.invoicing_group``; ``worker.batch_size``, ``worker.max_jobs``).
        pool: PostgreSQL pool of the application role (``max_jobs + 2`` connections),
            or another :class:`~streams.core.billing.ports.Database` with its ``stores``.
        tax: the tax service.
        consumer: a consumer of group ``worker.invoicing_group`` (manual commits,
            cooperative-sticky); this worker subscribes and closes it.
        producer: for the dead-letter topic; this worker flushes it on shutdown.
        stores: the store implementations ``pool``'s connections take (default: the
            PostgreSQL ones, :data:`streams.core.billing.stores.POSTGRES`).
        stop: when set, :meth:`run` finishes and returns.
        retry_backoff_s: pause of a partition after a transient failure (seconds).
        db_timeout_s: longest wait of the poll thread for a database connection
            (seconds); after a transient failure the poll thread leaves the database
            alone for ``retry_backoff_s``, doubling up to 30 s.
        dead_letter_timeout_s: longest wait for the dead letters of one batch (seconds).
        shutdown_grace_s: on stop, how long running invoice jobs may take to finish
            (queued ones are cancelled at once; their markers are redelivered).
    """

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
                for future in job.futures:
                    future.add_done_callback(self._orphan_done)
                PARTITIONS_LOST_WITH_JOB.labels(how).inc()
                self.stats["partitions_lost_with_job"] += 1
                for marker in job.markers:  # one line per job of the run
                    log.error(
                        "partition lost while a job was in flight: %s[%s] %s (invoice job for %s %s cancelled)",
                        tp.topic,
                        tp.partition,
                        how,
                        marker.customer_id,
                        marker.billing_period,
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
        # an iteration longer than this is logged with where its time went: past
        # max.poll.interval.ms librdkafka leaves the group (MAXPOLL), and the log says
        # which part of the loop held the poll back (docs/operations.md "MAXPOLL")
        slow_s = max(SLOW_ITERATION_MIN_S, self.settings.kafka.max_poll_interval_ms / 1000 / 4)
        watch = threading.Thread(
            target=self._watch_iterations,
            args=(threading.get_ident(), slow_s),
            name="poll-loop-watch",
            daemon=True,
        )
        watch.start()
        try:
            while not self.stop.is_set():
                started = self._iteration_started = time.monotonic()
                self.poll_once()
                self._iteration_started = None
                took = time.monotonic() - started
                if took >= slow_s:
                    self._slow_iteration(took)
        finally:
            self._iteration_started = None
            self._shutdown()

    def _watch_iterations(self, poll_thread: int, slow_s: float) -> None:
        """While the loop runs: once per iteration that has gone on for ``slow_s``
        seconds, log the poll thread's stack (where it waits). A loop that never
        comes back is found this way; one that does is also logged by
        :meth:`_slow_iteration`."""
        reported: float | None = None
        while not self.stop.wait(min(1.0, slow_s / 2)):
            started = self._iteration_started
            if started is None or started == reported or time.monotonic() - started < slow_s:
                continue
            reported = started
            frame = sys._current_frames().get(poll_thread)
            stack = "".join(traceback.format_stack(frame)) if frame is not None else "?"
            log.warning(
                "the poll loop has been in one iteration for %.1f s "
                "(max.poll.interval.ms is %d ms); the poll thread is at:\n%s",
                time.monotonic() - started,
                self.settings.kafka.max_poll_interval_ms,
                stack,
            )

    def _slow_iteration(self, took_s: float) -> None:
        """Log one poll iteration that took ``took_s`` seconds (at least a quarter of
        ``max.poll.interval.ms`` and :data:`SLOW_ITERATION_MIN_S`), split as
        :meth:`poll_once` measured it."""
        marks = self._marks
        parts = ", ".join(
            f"{name} {end - begin:.2f} s"
            for name, begin, end in zip(_PHASES, marks[:-1], marks[1:], strict=True)
        )
        self.stats["slow_poll_iterations"] += 1
        log.warning(
            "a poll iteration took %.2f s (max.poll.interval.ms is %d ms): %s",
            took_s,
            self.settings.kafka.max_poll_interval_ms,
            parts,
        )

    def poll_once(self, timeout_s: float = 0.5) -> None:
        """One iteration: job results, pending claims and backoffs, then one poll.

        While invoice jobs run, the poll waits at most :data:`JOB_POLL_S` so that a
        finished job's partition is resumed promptly (the next marker of that
        partition waits for it); not at all when records read ahead of a finished
        job's marker wait to be handled; otherwise up to ``timeout_s``.
        """
        clock = time.monotonic
        marks = [clock()]
        self._collect_jobs()
        self._retry_claims()
        self._retry_commits()
        marks.append(clock())
        self._end_backoffs()
        self._retry_resumes()
        self._load_drafts()
        self._grace_timers()
        marks.append(clock())
        wait = min(timeout_s, JOB_POLL_S) if self._jobs() else timeout_s
        messages = self._fetch(0.0 if self._ready else wait)  # records in hand: no wait
        marks.append(clock())
        by_partition: dict[int, list[Record]] = defaultdict(list)
        ready, self._ready = self._ready, {}
        for partition, (state, token, records) in ready.items():
            # still ours under the token they were read with (the fetch ran the
            # rebalance callbacks): they come first, what was fetched follows them
            if self.partitions.get(partition) is state and state.token == token:
                by_partition[partition].extend(records)
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
        if by_partition:
            self._handle_batch(by_partition)
        marks.append(clock())
        self._marks = marks  # where the iteration's time went, for _slow_iteration

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

    # ------------------------------------------------------------------ shutdown

    def _shutdown(self) -> None:
        """Finish: cancel the invoice jobs that have not started (their markers are not
        committed, so the next owner gets them), give the running ones
        ``shutdown_grace_s`` to finish (then cancel them: they stop before the tax call
        or before the write), commit what is done, close the consumer (LeaveGroup) and
        flush the producer. Never raises for a job's outcome."""
        for state in self._jobs():
            if state.job is not None:
                for future in state.job.futures:
                    future.cancel()  # only a queued job can be cancelled
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
