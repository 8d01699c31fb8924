"""The invoicing worker's drafts: re-rating after late usage, and the grace timer.

Only the owner of a customer's partition writes its draft (docs/invoices.md "Drafts and
finalisation"); what this mixin adds to the poll loop:

- **load**: once a partition is claimed, its open drafts (``invoice_drafts`` whose close
  marker came from it) are read into :attr:`PartitionState.drafts
  <streams.apps.invoicing.partitions.PartitionState.drafts>` (customer, period → end of
  the grace period, UTC);
- **late usage**: a batch that stored usage or metered events of a customer with an
  open draft on that partition queues a re-rating; at the end of the batch (when the
  partition starts no close job) the partition is paused and the draft re-rated in place
  by the invoice job at the position the batch reached (a marker of reason
  :data:`~streams.core.domain.drafts.RERATE_REASON` that is not on the topic: the job
  reads the usage before that offset, and the partition resumes there, no offset commit);
- **timer**: each poll, a draft whose grace period ended gets its finalisation marker
  (:func:`streams.core.domain.drafts.finalize_marker`) produced to the account-events
  topic with the customer's key, so it comes back on this partition behind everything
  stored so far, and the invoice job finalises it there: the finalisation's position
  is a record on the topic, so a redelivery after a crash finalises the same usage. The
  timer produces a draft's marker again after
  :data:`~streams.apps.invoicing.partitions.FINALIZE_RETRY_S` if it is still open.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from streams.apps.invoicing.batch import Batch
from streams.apps.invoicing.dispatch import DispatchMixin
from streams.apps.invoicing.partitions import FINALIZE_RETRY_S
from streams.core.billing import rows
from streams.core.domain.codec import encode
from streams.core.domain.drafts import RERATE_REASON, finalize_marker
from streams.core.domain.events import deterministic_id, invoice_id_for

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = ["DraftsMixin"]

#: CloudEvents ``source`` of the finalisation markers the grace timer produces.
TIMER_SOURCE = "/invoicing/worker/grace-timer"


class DraftsMixin(DispatchMixin):
    """Drafts of :class:`~streams.apps.invoicing.worker.InvoicingWorker` (module doc)."""

    def _load_drafts(self) -> None:
        """Read the open drafts of every owned partition not read since its claim (one
        short read each; a failure is retried on the next poll)."""
        for state in list(self.partitions.values()):
            if state.drafts_loaded or not state.owned or not self._db.open():
                continue
            try:
                with self.pool.connection(timeout=self.db_timeout_s) as conn:
                    found = self.stores.drafts.open_drafts_on(conn, self.topic, state.partition)
                    conn.rollback()
            except Exception as exc:
                failure = self._failed("read", exc)
                log.warning(
                    "reading the drafts of partition %s failed (%s); will retry",
                    state.partition,
                    failure.reason,
                )
                return
            self._db.succeeded()
            state.drafts = {(d.customer_id, d.billing_period): d.grace_ends_at for d in found}
            state.drafts_loaded = True
            if found:
                log.info("partition %s has %d open draft(s)", state.partition, len(found))

    def _note_late_usage(self, batch: Batch, written: set[int]) -> None:
        """Queue a re-rating for each customer with an open draft whose usage or metered
        events this batch stored on that partition."""
        if not any(self.partitions[p].drafts for p in written if p in self.partitions):
            return  # the usual case: no open draft on these partitions
        for usage in batch.usage:
            state = self.partitions.get(usage.source.partition)
            if state is not None and usage.source.partition in written and state.drafts:
                key = (str(usage.values[0]), str(usage.values[1]))  # (customer, period)
                if key in state.drafts:
                    state.rerate.add(key[0])
        for metered in batch.metered:
            state = self.partitions.get(metered.source.partition)
            if state is not None and metered.source.partition in written and state.drafts:
                customer = metered.data.customer_id
                if any(c == customer for c, _p in state.drafts):
                    state.rerate.add(customer)

    def _start_rerate(self, partition: int, next_offset: int) -> None:
        """Start the re-rating of one queued draft of ``partition`` at ``next_offset``
        (the offset the partition goes on from); the others wait for the next batch."""
        state = self.partitions.get(partition)
        if state is None or state.token is None or state.job is not None or not state.rerate:
            return
        customer = state.rerate.pop()
        periods = sorted(p for c, p in state.drafts if c == customer)
        if not periods:
            return
        period = periods[0]
        if len(periods) > 1:
            state.rerate.add(customer)  # the next period at the next batch
        event_id = deterministic_id(RERATE_REASON, customer, period, str(next_offset))
        marker = rows.CloseMarker(
            event_id,
            customer,
            period,
            RERATE_REASON,
            rows.SourceCoordinates(self.topic, partition, next_offset),
            None,
        )
        self._start_job(partition, state.token, [marker])
        log.info("re-rating the draft of %s %s after late usage", customer, period)

    def _grace_timers(self) -> None:
        """Produce the finalisation marker of each draft whose grace period ended (module
        doc). Never raises: a marker the producer refuses is tried again later."""
        now = datetime.now(UTC)
        clock = time.monotonic()
        for state in list(self.partitions.values()):
            if not state.owned:
                continue
            for (customer, period), due in list(state.drafts.items()):
                if due > now:
                    continue
                asked = state.finalize_requested.get((customer, period))
                if asked is not None and clock - asked < FINALIZE_RETRY_S:
                    continue
                envelope = finalize_marker(
                    customer,
                    period,
                    invoice_id_for(customer, period, 1),
                    at=now,
                    source=TIMER_SOURCE,
                )
                record = encode(envelope)
                try:
                    self.producer.produce(
                        self.topic,
                        key=record.key,
                        value=record.value,
                        headers=[(name, value) for name, value in record.headers],
                        on_delivery=_delivered,
                    )
                except Exception as exc:  # BufferError (queue full), KafkaException
                    log.warning(
                        "finalisation marker of %s %s not produced: %s", customer, period, exc
                    )
                    continue
                state.finalize_requested[(customer, period)] = clock
                log.info(
                    "grace period of %s %s ended at %s: finalisation requested",
                    customer,
                    period,
                    due.isoformat(),
                )
        self.producer.poll(0)


def _delivered(err: object, _msg: object) -> None:
    """Delivery report of a finalisation marker: a failure is logged; the timer produces
    the marker again after ``FINALIZE_RETRY_S`` while the draft is open."""
    if err is not None:
        log.warning("finalisation marker not delivered: %s", err)
