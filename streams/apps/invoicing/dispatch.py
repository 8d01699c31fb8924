"""Invoice-job dispatch of the invoicing worker: a close marker → a job off the poll thread.

A close marker pauses its partition and hands :func:`streams.apps.invoicing.jobs.run_invoice_job`
to a thread pool (``worker.max_jobs``); the poll loop keeps polling (which keeps the
membership alive) and collects finished jobs: it commits the marker's offset, seeks
past it and resumes the partition, or backs off and retries, waits for a contending
writer, or dead-letters the marker and holds the customer (a permanent refusal).
Results of jobs whose partition was revoked or lost are reported and dropped.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from concurrent.futures import Future
from typing import Any

from streams.apps.invoicing.base import WorkerBase
from streams.apps.invoicing.jobs import JobResult, Outcome, run_invoice_job
from streams.apps.invoicing.letters import build
from streams.apps.invoicing.metrics import HOLDS, INVOICES, RECORDS
from streams.apps.invoicing.partitions import Ahead, InvoiceJob
from streams.core.billing import fencing, rows
from streams.core.billing.commit import write_fenced
from streams.core.billing.metrics import FENCING_REFUSALS
from streams.core.domain.drafts import FINALIZE_REASON, RERATE_REASON

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = ["DispatchMixin"]


class DispatchMixin(WorkerBase):
    """The invoice jobs of :class:`~streams.apps.invoicing.worker.InvoicingWorker`."""

    def _start_job(
        self,
        partition: int,
        token: fencing.FencingToken,
        markers: list[rows.CloseMarker],
    ) -> None:
        """Pause ``partition`` and hand each of ``markers`` (a run: consecutive on the
        partition, distinct customers, offset order) to a job of its own on the pool."""
        self._pause(partition, None)
        cancel = threading.Event()
        futures = tuple(
            self.executor.submit(run_invoice_job, self.jobs_ctx, marker, token, cancel)
            for marker in markers
        )
        self.partitions[partition].job = InvoiceJob(tuple(markers), token, cancel, futures)
        self._gauges()

    def _collect_jobs(self) -> None:
        for state in self._jobs():
            job = state.job
            if job is None or not job.done():
                continue
            state.job = None
            self._gauges()
            self._job_done(state.partition, _results_of(job))

    def _job_done(self, partition: int, results: list[JobResult]) -> None:
        """Every job of a run of markers reported (``results`` in offset order): act on
        each in turn. The partition moves past every marker whose outcome is final
        (invoiced, already invoiced, drafted, held, refused and dead-lettered); the
        first that is not (retry, cancelled, contended, a refusal not yet recorded)
        stops there: its offset is the partition's restart, and the later markers of
        the run are handled again (their jobs find what they wrote: idempotent)."""
        state = self.partitions.get(partition)
        ahead = state.ahead if state is not None else None
        if state is not None:
            state.ahead = None  # used below on success only; every other path seeks back
        for result in results:
            INVOICES.labels(result.outcome.value).inc()
            self.stats[f"invoice_{result.outcome.value}"] += 1
        fenced = next((r for r in results if r.outcome is Outcome.FENCED), None)
        if fenced is not None:
            self._fenced(partition, "invoice", fencing.Fenced(fenced.token, None))
            return
        owned = self._owned(partition)
        if owned is None or owned.token != results[0].token:
            return
        if results[0].marker.reason == RERATE_REASON:  # never a run: not a record
            self._rerate_done(partition, results[0])
            return
        done_to: int | None = None  # the next offset after the last final marker
        for result in results:
            if not self._marker_done(partition, result):
                if done_to is not None and self._owned(partition) is not None:
                    self._commit(partition, done_to)
                return
            done_to = result.marker.source.offset + 1
        last = results[-1].marker
        self._commit(partition, last.source.offset + 1)
        self.partitions[partition].rewind_to = None
        self._go_on(partition, last, ahead)

    def _marker_done(self, partition: int, result: JobResult) -> bool:
        """One marker's outcome within its run: True when it is final (the partition may
        move past it), False when the partition was set to restart at the marker
        (backed off), or was fenced meanwhile."""
        marker = result.marker
        if result.outcome is Outcome.CONTENDED:
            self._contended_job(partition, result)
            return False
        if result.outcome in (Outcome.RETRY, Outcome.CANCELLED):
            log.warning(
                "invoice of %s %s will be retried: %s",
                marker.customer_id,
                marker.billing_period,
                result.detail,
            )
            self._back_off(partition, rewind_to=marker.source.offset)
            return False
        self._contended.pop(marker.event_id, None)
        if result.outcome is Outcome.FAILED and not self._reject_marker(partition, result):
            return False
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
        self._track_draft(partition, result)
        return True

    def _go_on(self, partition: int, marker: rows.CloseMarker, ahead: Ahead | None) -> None:
        """Resume the partition after ``marker``'s successful job.

        The records its poll delivered after the marker (``ahead``, kept under the same
        token) are its next records: seek past them, resume, and hand them to the next
        batch, before anything fetched (fetching them again took a fetch round trip per
        marker, docs/architecture.md "Long jobs"). Without them, or if the seek fails,
        the partition restarts right after the marker, as always."""
        state = self.partitions[partition]
        after = marker.source.offset + 1
        if (
            ahead is None
            or ahead.token != state.token
            or ahead.marker_offset != marker.source.offset
        ):
            self._resume(partition, after)
            return
        self._resume(partition, ahead.records[-1].offset + 1)
        if state.resume_pending:  # kept paused: read them again from after the marker
            state.rewind_at_most(after)
            return
        self._ready[partition] = (state, ahead.token, ahead.records)
        self.stats["records_read_ahead"] += len(ahead.records)

    def _track_draft(self, partition: int, result: JobResult) -> None:
        """Keep the partition's open drafts in step with a job's outcome: a close that
        made a draft starts its grace timer; a finalisation (or a marker that found
        nothing to finalise) ends it."""
        state = self.partitions.get(partition)
        if state is None:
            return
        key = (result.marker.customer_id, result.marker.billing_period)
        if result.outcome is Outcome.DRAFTED and result.draft_due is not None:
            state.drafts[key] = result.draft_due
        elif result.marker.reason == FINALIZE_REASON and result.outcome in (
            Outcome.INVOICED,
            Outcome.ALREADY_INVOICED,
            # held or refused: the hold's release re-closes the period, which re-rates the
            # draft and starts its (ended) grace timer again
            Outcome.HELD,
            Outcome.FAILED,
        ):
            state.drafts.pop(key, None)
            state.finalize_requested.pop(key, None)

    def _rerate_done(self, partition: int, result: JobResult) -> None:
        """A re-rating after late usage ended: it was no record of the topic, so nothing
        is committed; the partition resumes where the batch had reached. A re-rating that
        failed leaves the draft as it was (the finalisation rates everything again, and
        holds or retries as any close would)."""
        marker = result.marker
        if result.outcome is not Outcome.DRAFTED:
            log.warning(
                "re-rating the draft of %s %s: %s (%s); the draft is kept as it was",
                marker.customer_id,
                marker.billing_period,
                result.outcome.value,
                result.detail,
            )
        self._track_draft(partition, result)
        self.partitions[partition].rewind_to = None
        self._resume(partition, marker.source.offset)

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
            # The marker as a record of its own (its value names the close), through
            # the one builder of dead letters.
            letter = build(
                rows.Record(
                    marker.source.topic,
                    marker.source.partition,
                    marker.source.offset,
                    marker.customer_id.encode(),
                    json.dumps(
                        {
                            "customer_id": marker.customer_id,
                            "billing_period": marker.billing_period,
                            "close_event_id": marker.event_id,
                        }
                    ).encode(),
                    [("ce_id", marker.event_id.encode()), ("ce_type", b"billing_period.closed")],
                ),
                "rejected",
                reason,
                self.dead_letters.topic,
                customer=(marker.customer_id, marker.billing_period),
                event_id=marker.event_id,
                hold_reason=reason,
            )
            if not known:
                self.dead_letters.wait([self.dead_letters.submit(letter.letter)])

            def work(conn: Any) -> None:
                for hold in letter.holds:
                    self.stores.holds.record_hold(conn, **hold)
                self.stores.closes.record_close(conn, marker, "held", None)
                self.stores.dead_letters.record(conn, [letter.record])

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

    def _start_marker(
        self,
        partition: int,
        token: fencing.FencingToken,
        closes: list[rows.CloseMarker],
        known: set[int],
    ) -> None:
        """A run of close markers whose records before them are committed: start their
        jobs, or, when the first was dead-lettered (rejected) on an earlier delivery
        (its offset in ``known``), move past it. A later marker dead-lettered before
        ends the run there (it is the first of a run of its own next time)."""
        if closes[0].source.offset in known:
            self._commit(partition, closes[0].source.offset + 1)
            self._resume(partition, closes[0].source.offset + 1)
            return
        end = next(
            (i for i, close in enumerate(closes) if close.source.offset in known), len(closes)
        )
        self._start_job(partition, token, closes[:end])
        RECORDS.labels("billing_period.closed", "job_started").inc(end)
        # later records are handed on, or fetched again, after the jobs (dispatch `_go_on`)


def _results_of(job: InvoiceJob) -> list[JobResult]:
    """A finished run's results in offset order; a job cancelled before it started, or
    one that raised (run_invoice_job never does), is a result too (not committed,
    retried)."""
    found: list[JobResult] = []
    for marker, future in zip(job.markers, job.futures, strict=True):
        if future.cancelled():
            found.append(
                JobResult(marker, job.token, Outcome.CANCELLED, "cancelled before it started")
            )
            continue
        error = future.exception()
        if error is not None:
            found.append(
                JobResult(marker, job.token, Outcome.RETRY, f"{type(error).__name__}: {error}")
            )
            continue
        found.append(future.result())
    return found


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
