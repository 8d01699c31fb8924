"""The batch write of the invoicing worker: one poll's records of every partition, one transaction.

Per poll (:meth:`IngestMixin._handle_batch`):

1. **decode**, per partition in offset order up to its first close marker:
   ``usage.recorded`` through the fast decoder
   (:func:`streams.core.domain.fastcodec.decode_usage`), everything it declines through
   the reference decoder (:func:`streams.core.domain.codec.decode`), whose verdict and
   reason are final;
2. **dead letters** of the records that do not decode: only then are the
   ``dead_letters`` rows of the batch's suspects read (a record dead-lettered on an
   earlier delivery is skipped, never dead-lettered twice); the letters are produced
   and acknowledged before the transaction;
3. **one transaction** for every partition of the batch: the fence rows ``FOR SHARE``
   first (a partition whose fence moved on is dropped, the others written), then
   the stores (:func:`streams.apps.invoicing.batch.write_batch`): usage rows through
   ``COPY`` (:func:`streams.core.billing.store.usage.insert_usage_rows`), whose payload
   check costs nothing unless an id was already stored. A usage, metered or
   subscription event whose id is stored with another payload rolls the
   transaction back; it is dead-lettered as it was read, its customer held, and the
   batch written without it. A batch PostgreSQL refuses for good is **bisected**
   until the one record is found (dead-lettered ``unwritable``);
4. **one offset commit** for the partitions written (after the database commit:
   :mod:`streams.core.billing.commit`), then the close markers start their jobs
   (:mod:`streams.apps.invoicing.dispatch`).

Why batch-first, and the figures: docs/decisions/0010-batch-first-ingest.md,
docs/benchmarks.md.
"""

from __future__ import annotations

import hashlib
import logging

from streams.apps.invoicing.batch import (
    Batch,
    FencesRefused,
    RecordConflicts,
    UsageConflicts,
    usage_row,
    write_batch,
)
from streams.apps.invoicing.decoding import (
    ACCOUNT_EVENT_TYPES,
    Run,
    decode_run,
    fast_usage_row,
    key_id_of,
)
from streams.apps.invoicing.drafts import DraftsMixin
from streams.apps.invoicing.letters import DeadLetter, build
from streams.apps.invoicing.metrics import BISECTIONS, FAILURES, HOLDS, RECORDS
from streams.apps.invoicing.partitions import Ahead
from streams.core.billing import fencing, rows
from streams.core.billing.dead_letters import DeadLetterError, Delivery
from streams.core.billing.failures import Disposition, Failure
from streams.core.billing.rows import Record
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.fastcodec import FastUsage

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = ["ACCOUNT_EVENT_TYPES", "IngestMixin"]


class IngestMixin(DraftsMixin):
    """The batch write of :class:`~streams.apps.invoicing.worker.InvoicingWorker`."""

    def _handle_partition(self, partition: int, msgs: list[Record]) -> None:
        """One partition's records (the batch of a poll that read only it)."""
        self._handle_batch({partition: msgs})

    def _handle_batch(self, by_partition: dict[int, list[Record]]) -> None:
        runs: dict[int, Run] = {}
        for partition, msgs in by_partition.items():
            state = self.partitions.get(partition)
            token = state.token if state is not None else None
            if state is None or token is None or state.job is not None or state.backoff_until:
                # Not ours to process now. A claim pending: pause and restart here once
                # claimed. A job or a backoff: its end seeks explicitly. Fenced or
                # revoked: not ours at all.
                if state is not None and state.claiming:
                    self._pause(partition, msgs[0].offset)
                continue
            if not self._db.open():  # the database is away: keep these for later
                self._flush_failed(partition, msgs[0].offset, "the database is backing off")
                continue
            runs[partition] = decode_run(
                partition, token, msgs, self.settings.worker.markers_in_flight
            )
        if not runs:
            return
        try:
            known = self._known({p: run.suspects() for p, run in runs.items()})
        except Exception as exc:
            failure = self._failed("read", exc)
            log.warning("reading dead letters failed (%s); retrying", failure.reason)
            for partition, run in runs.items():
                self._flush_failed(partition, run.first_offset, failure.reason)
            return
        batch = Batch()
        for partition, run in list(runs.items()):
            part = self._add_run(run, known.get(partition, {}))
            if part is None:
                self._flush_failed(partition, run.first_offset, "dead-letter publish failed")
                del runs[partition]
            else:
                batch.merge(part)
        tokens = {p: run.token for p, run in runs.items()}
        written = self._flush(batch, tokens) if batch.messages else set()
        self._commit_many({p: runs[p].next_offset for p in written if runs[p].items})
        self._note_late_usage(batch, written)
        for partition, run in runs.items():
            if run.marker is None and partition in written and run.items:
                # late usage of an open draft: re-rate it here (docs/invoices.md)
                self._start_rerate(partition, run.next_offset)
            if run.marker is None or (run.items and partition not in written):
                continue
            if self._owned(partition) is None:  # fenced meanwhile: not ours to close
                continue
            closes = []
            for msg, envelope in run.markers:
                data = envelope.data
                assert isinstance(data, BillingPeriodClosed)  # decode_run checked it
                closes.append(
                    rows.CloseMarker(
                        envelope.id,
                        data.customer_id,
                        data.billing_period,
                        data.reason,
                        rows.SourceCoordinates(msg.topic, msg.partition, msg.offset),
                        data.lease_fencing_token,
                    )
                )
            self._start_marker(partition, run.token, closes, set(known.get(partition, {})))
            state = self.partitions.get(partition)
            if state is not None and state.job is not None:
                # what this poll delivered after the run's last marker: the jobs' success
                # hands them to the next batch (dispatch.py `_go_on`), else they are read
                # again
                last = state.job.markers[-1].source.offset
                msgs = by_partition[partition]
                at = next((i for i, m in enumerate(msgs) if m.offset == last), None)
                rest = msgs[at + 1 :] if at is not None else []
                state.ahead = Ahead(run.token, last, rest) if rest else None

    def _known(self, suspects: dict[int, list[int]]) -> dict[int, dict[int, rows.DeadLetterRecord]]:
        """The ``dead_letters`` rows of ``suspects`` (partition → offsets), one short read
        (none when there are no suspects)."""
        wanted = {p: offsets for p, offsets in suspects.items() if offsets}
        if not wanted:
            return {}
        with self.pool.connection(timeout=self.db_timeout_s) as conn:
            found = {
                p: self.stores.dead_letters.recorded(conn, self.topic, p, offsets)
                for p, offsets in wanted.items()
            }
            conn.rollback()
        self._db.succeeded()
        return found

    def _add_run(self, run: Run, known: dict[int, rows.DeadLetterRecord]) -> Batch | None:
        """The run's effects as a batch of its own; None when a dead letter could not be
        handed to the producer (the partition is retried)."""
        part = Batch()
        for msg, item in run.items:
            part.messages.append(msg)
            if msg.offset in known:  # dead-lettered on an earlier delivery: done with it
                self.stats["dead_letters_skipped_on_redelivery"] += 1
                continue
            if isinstance(item, FastUsage):  # the common case: its row holds its source
                part.usage.append(fast_usage_row(msg, item))
                continue
            source = rows.SourceCoordinates(msg.topic, msg.partition, msg.offset)
            if isinstance(item, str):
                if not self._dead_letter_invalid(part, msg, source, item):
                    return None
            else:
                data = item.data
                if isinstance(data, CustomerUpserted):
                    part.customers.append((item.id, data, source, item.time))
                elif isinstance(data, UsageRecorded):
                    digest = hashlib.sha256(msg.value or b"").hexdigest()
                    part.usage.append(usage_row(item.id, data, digest, source, key_id_of(msg)))
                elif isinstance(data, UsageMetered):
                    part.metered.append(rows.MeteredRecord(item.id, data, source, key_id_of(msg)))
                elif isinstance(
                    data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded
                ):
                    part.subscriptions.append(rows.SubscriptionRecord(item.id, data, source))
        return part

    # ------------------------------------------------------------------ dead letters

    def _submit(self, batch: Batch, dead: DeadLetter) -> bool:
        """Hand ``dead``'s letter to the producer and queue its row and holds in ``batch``.
        False when the producer refused it."""
        try:
            batch.deliveries.append(self.dead_letters.submit(dead.letter))
        except DeadLetterError as exc:
            log.warning("%s", exc)
            return False
        batch.letters.append(dead.record)
        batch.holds.extend(dead.holds)
        return True

    def _dead_letter_invalid(
        self, batch: Batch, msg: Record, source: rows.SourceCoordinates, reason: str
    ) -> bool:
        """Dead-letter an undecodable or invalid record and queue a hold for every customer
        it could belong to (:func:`streams.apps.invoicing.letters.build`). False when the
        producer refused the letter (the caller rewinds and retries); never raises."""
        dead = build(msg, "invalid", reason, self.dead_letters.topic)
        if not self._submit(batch, dead):
            return False
        RECORDS.labels("invalid", "dead_lettered").inc()
        self.stats["dead_lettered"] += 1
        where = f"{source.topic}[{source.partition}]@{source.offset}"
        if not dead.attributed:
            self.stats["dead_lettered_unattributed"] += 1
            log.error("dead-lettered %s without a hold: %s", where, dead.record.reason)
        else:
            holding = ", ".join(dead.record.customers)
            log.warning("dead-lettered %s (holding %s): %s", where, holding, reason)
        return True

    def _dead_letter_conflict(
        self, batch: Batch, conflict: rows.UsageRowConflict | rows.RecordConflict, msg: Record
    ) -> bool:
        """Dead-letter a conflicting duplicate as it was read (the original key, value and
        headers) and hold its customer's period (every period for a subscription
        event); the stored one is kept. False when the producer refused."""
        if isinstance(conflict, rows.UsageRowConflict):
            event_type, event_id = "usage.recorded", conflict.row.event_id
            customer = (str(conflict.row.values[0]), conflict.row.values[1])
            kept, what = conflict.stored_source, "line"
        else:
            record = conflict.record
            event_type, event_id = record.data.event_type, record.event_id
            customer = (record.data.customer_id, conflict.billing_period)
            kept, what = conflict.stored_source, record.data.event_type
        reason = (
            f"event id {event_id} already recorded with a different payload "
            f"(stored from {kept.topic}[{kept.partition}]@{kept.offset}); "
            f"the stored {what} is kept"
        )
        dead = build(
            msg,
            "conflict",
            reason,
            self.dead_letters.topic,
            customer=customer,
            event_id=event_id,
            hold_reason=reason,
        )
        if not self._submit(batch, dead):
            return False
        RECORDS.labels(event_type, "conflict").inc()
        self.stats["conflicts"] += 1
        log.warning("%s conflict dead-lettered: %s", event_type, reason)
        return True

    # ------------------------------------------------------------------ the write

    def _flush(self, batch: Batch, tokens: dict[int, fencing.FencingToken]) -> set[int]:
        """Wait for the batch's dead letters and write it (fenced; bisected when a
        record makes it fail for good). Returns the partitions written; the others
        were rewound, paused or dropped accordingly."""
        if not self._await_dead_letters(batch, batch.deliveries):
            return set()
        return self._write(batch, tokens)

    def _await_dead_letters(self, batch: Batch, deliveries: list[Delivery]) -> bool:
        """Wait (bounded) for ``deliveries``; False (the batch's partitions backed off) if
        they did not all arrive. Pending ones stay tracked and are not produced again."""
        if not deliveries:
            return True
        reason = "the dead-letter topic is backing off"
        if self._dlq.open():
            try:
                self.dead_letters.wait(deliveries)
            except DeadLetterError as exc:
                FAILURES.labels("dead_letter", Disposition.TRANSIENT.value).inc()
                self._dlq.failed(str(exc))
                reason = str(exc)
            else:
                self._dlq.succeeded()
                return True
        for partition in batch.partitions():
            self._flush_failed(partition, batch.first_offset(partition), reason)
        return False

    def _write(self, batch: Batch, tokens: dict[int, fencing.FencingToken]) -> set[int]:
        """One transaction for ``batch``; returns the partitions written."""
        parts = batch.partitions()
        if not parts:
            return set()
        try:
            with self.pool.connection(timeout=self.db_timeout_s) as conn, conn.transaction():
                write_batch(batch, self.stores, [tokens[p] for p in sorted(parts)])(conn)
        except FencesRefused as exc:
            fenced = set()
            for refusal in exc.refused:
                self._fenced(refusal.token.partition, "records", refusal)
                fenced.add(refusal.token.partition)
            return self._write(batch.without(fenced), tokens)
        except UsageConflicts as exc:
            return self._without_conflicts(batch, tokens, list(exc.conflicts))
        except RecordConflicts as exc:
            return self._without_conflicts(batch, tokens, list(exc.conflicts))
        except Exception as exc:
            failure = self._failed("write", exc)
            if failure.permanent:
                return self._bisect(batch, tokens, failure)
            log.warning(
                "writing %s records of partitions %s failed (%s); retrying",
                len(batch.messages),
                sorted(parts),
                failure.reason,
            )
            for partition in parts:
                self._flush_failed(partition, batch.first_offset(partition), failure.reason)
            return set()
        self._db.succeeded()
        if batch.holds:
            HOLDS.inc(len(batch.holds))
        RECORDS.labels("usage.recorded", "stored").inc(len(batch.usage))
        RECORDS.labels("customer.upserted", "stored").inc(len(batch.customers))
        RECORDS.labels("usage.metered", "stored").inc(len(batch.metered))
        RECORDS.labels("subscription", "stored").inc(len(batch.subscriptions))
        self.stats["usage_stored"] += len(batch.usage)
        self.stats["metered_stored"] += len(batch.metered)
        return parts

    def _without_conflicts(
        self,
        batch: Batch,
        tokens: dict[int, fencing.FencingToken],
        conflicts: list[rows.UsageRowConflict] | list[rows.RecordConflict],
    ) -> set[int]:
        """Dead-letter each conflicting event once, as it was read (skipped when it was
        dead-lettered on an earlier delivery), then write ``batch`` without them."""
        by_key: dict[tuple[int, int], rows.UsageRowConflict | rows.RecordConflict] = {}
        for conflict in conflicts:
            source = (
                conflict.row.source
                if isinstance(conflict, rows.UsageRowConflict)
                else conflict.record.source
            )
            by_key.setdefault((source.partition, source.offset), conflict)
        try:
            suspects: dict[int, list[int]] = {}
            for partition, offset in by_key:
                suspects.setdefault(partition, []).append(offset)
            known = self._known(suspects)
        except Exception as exc:
            failure = self._failed("read", exc)
            for partition in batch.partitions():
                self._flush_failed(partition, batch.first_offset(partition), failure.reason)
            return set()
        messages = {(m.partition, m.offset): m for m in batch.messages}
        fresh = Batch()
        failed: set[int] = set()
        for key, conflict in sorted(by_key.items()):
            if key[1] in known.get(key[0], {}) or key[0] in failed:
                continue
            if not self._dead_letter_conflict(fresh, conflict, messages[key]):
                failed.add(key[0])
        for partition in failed:
            self._flush_failed(
                partition, batch.first_offset(partition), "dead-letter publish failed"
            )
        rest = batch.without_effects_at(by_key).without(failed)
        if not self._await_dead_letters(fresh, fresh.deliveries):
            return set()
        rest.letters += fresh.without(failed).letters
        rest.holds += fresh.without(failed).holds
        return self._write(rest, tokens)

    def _bisect(
        self, batch: Batch, tokens: dict[int, fencing.FencingToken], failure: Failure
    ) -> set[int]:
        """A batch that fails for good: write each half on its own (each its own
        transaction, in order) until the record that fails is alone; dead-letter it as
        ``unwritable`` and hold its customers. Its neighbours are written."""
        keys = batch.offsets()
        parts = batch.partitions()
        if len(keys) > 1:
            BISECTIONS.inc()
            left, right = batch.split(keys[len(keys) // 2])
            failed = left.partitions() - self._write(left, tokens)
            right = right.without(failed)
            failed |= right.partitions() - self._write(right, tokens)
            return parts - failed
        key = keys[0] if keys else None
        if key is not None and batch.has_record_at(key):
            msg = next((m for m in batch.messages if (m.partition, m.offset) == key), None)
            if msg is None:  # pragma: no cover - a record's effects come with its message
                return set()
            bad = batch.without_effects_at([key])
            try:
                known = self._known({key[0]: [key[1]]}).get(key[0], {})
            except Exception as exc:
                self._flush_failed(
                    key[0], batch.first_offset(key[0]), self._failed("read", exc).reason
                )
                return set()
            if key[1] in known:  # dead-lettered on an earlier delivery: move past it
                return self._write(bad, tokens)
            dead = build(
                msg,
                "unwritable",
                f"the database refused this record ({failure.reason}); the contract "
                "should have refused it (streams/core/domain/events/)",
                self.dead_letters.topic,
            )
            fresh = Batch()
            if not self._submit(fresh, dead) or not self._await_dead_letters(
                fresh, fresh.deliveries
            ):
                self._flush_failed(key[0], batch.first_offset(key[0]), "dead-letter publish failed")
                return set()
            self.stats["dead_lettered_unwritable"] += 1
            log.error("ALERT dead-lettered %s as unwritable: %s", msg, dead.record.reason)
            bad.letters += fresh.letters
            bad.holds += fresh.holds
            return self._write(bad, tokens)
        if batch.holds:  # only the holds of a dead letter were refused: keep the dead letter
            log.error(
                "ALERT the holds of %s[%s] were refused (%s); recording its dead letter "
                "without them",
                self.topic,
                key,
                failure.reason,
            )
            kept = Batch(messages=list(batch.messages), letters=list(batch.letters))
            return self._write(kept, tokens)
        log.error(
            "ALERT recording the dead letter of %s %s failed for good: %s; retrying",
            self.topic,
            key,
            failure.reason,
        )
        for partition in parts:
            self._flush_failed(partition, batch.first_offset(partition), failure.reason)
        return set()
