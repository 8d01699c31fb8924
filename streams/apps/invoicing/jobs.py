"""The invoice job: one close marker → at most one invoice revision, its lines and
its outbox event, written in one fenced transaction.

Runs off the poll thread (the worker pauses the marker's partition meanwhile).
Four phases, and no database transaction stays open across the tax call
(docs/design.md "Ownership and fencing"):

1. **read** (short read-only transaction): is there already a current invoice
   for (customer, period)? is the customer held? the customer, the published
   price book and what precedes the marker on its partition: the period's usage
   lines and metered events, and the customer's subscription events
   (:func:`streams.core.billing.rating.gather`);
2. **rate and price** (pure: :func:`streams.core.billing.rating.rate_period`, the one
   rating function :func:`~streams.core.domain.rating.rate` then
   :func:`~streams.core.domain.rating.priced_invoice`). A gap in the book or the
   data (usage of a metric the plan does not price, metered usage without a
   subscription, an unknown plan or version, …) **holds** the invoice: an
   ``invoice_holds`` row with the rating's reasons and the close recorded
   ``held``, in one fenced transaction — never billed as zero in silence
   (``invoicing holds release`` re-closes it after the fix). A customer without
   a subscription and without metered usage is priced exactly as before rating
   (its pre-priced lines at cost). Every rule
   that can refuse the data (a line in another currency than the customer's,
   duplicates, the subtotal) runs *before* the tax call. The tax service commits
   the document under its idempotency key, and the key is the same for every
   attempt at this revision: had the data been refused after the tax call, the
   corrected data (after ``invoicing holds release``) would meet the committed
   document with other lines, a 409, and be held again for good. After the tax
   call only transient failures (and a malformed tax answer) remain;
3. **tax**: one document per invoice (the client splits it into requests of at
   most 1,000 lines), idempotency key ``<invoice id>:r<revision>`` — the invoice
   id is deterministic, so a retry or a second owner reuses the same key and the
   service answers the same tax (tax is never applied twice);
4. **write**: the one issuance transaction of the billing kernel
   (:func:`streams.core.billing.issuance.issue`) under the partition fence: the fence
   check, a gapless invoice number, ``INSERT … ON CONFLICT DO NOTHING`` of the
   invoice, its lines, the outbox row (only when the invoice row was new) and,
   in the same transaction, the close record.

The job never commits Kafka offsets: it returns a :class:`JobResult` and the
poll thread commits (after this database commit) — see :mod:`streams.core.billing.commit`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import psycopg

from streams.apps.invoicing.draft_job import draft_grace, lock_draft, save_draft
from streams.apps.invoicing.job_types import EVENT_SOURCE, JobContext, JobResult, Outcome
from streams.apps.invoicing.metrics import (
    CROSS_PARTITION_USAGE,
    HOLDS,
    JOB_SECONDS,
    RATED_EVENTS,
    RATING_HOLDS,
    RATING_SECONDS,
)
from streams.core.billing import fencing, rows
from streams.core.billing.commit import write_fenced
from streams.core.billing.failures import Disposition, classify
from streams.core.billing.issuance import Issued, NotIssued, issue, tax_idempotency_key
from streams.core.billing.rating import (
    Rated,
    gather,
    hold_codes,
    hold_reason,
    rate_period,
)
from streams.core.domain.drafts import (
    FINALIZE_REASON,
    RERATE_REASON,
    Grace,
)
from streams.core.domain.errors import InvoiceRuleViolation
from streams.core.domain.events import invoice_id_for
from streams.core.domain.invoice import UsageLine, apply_tax
from streams.core.domain.rating import MeteredEvent

log = logging.getLogger("streams.apps.invoicing.jobs")

# the job's types and its draft path live beside it; re-exported here, where callers
# have always imported them from
__all__ = [
    "EVENT_SOURCE",
    "CrossPartitionUsage",
    "JobContext",
    "JobResult",
    "Outcome",
    "draft_grace",
    "run_invoice_job",
]


def run_invoice_job(
    ctx: JobContext, marker: rows.CloseMarker, token: fencing.FencingToken, cancel: threading.Event
) -> JobResult:
    """Build, tax and write the invoice of ``marker`` under ``token``. Never raises:
    every outcome is a :class:`JobResult`. Failures are classified by
    :func:`streams.core.billing.failures.classify`: fenced → FENCED; permanent (a rule, an
    arithmetic failure on the data, a refusal by the tax service or by PostgreSQL) →
    FAILED, dealt with once (the marker dead-lettered, the customer held), never
    retried for ever; contended (the tax document of this revision was committed by
    another writer) → the invoice that writer wrote, or CONTENDED (retried);
    transient and unexpected → RETRY (an unexpected one is logged as an ALERT)."""
    started = time.monotonic()
    try:
        result = _run(ctx, marker, token, cancel)
    except Exception as exc:
        failure = classify(exc)
        detail = failure.reason
        if failure.disposition is Disposition.FENCED:
            result = JobResult(marker, token, Outcome.FENCED, str(exc))
        elif failure.disposition is Disposition.PERMANENT:
            result = JobResult(marker, token, Outcome.FAILED, detail)
        elif failure.disposition is Disposition.CONTENDED:
            result = _contended(ctx, marker, token, detail)
        else:
            if failure.disposition is Disposition.UNEXPECTED:
                log.exception(
                    "ALERT invoice job for %s %s failed unexpectedly",
                    marker.customer_id,
                    marker.billing_period,
                )
                detail = f"unexpected {detail}"
            result = JobResult(marker, token, Outcome.RETRY, detail)
    seconds = time.monotonic() - started
    JOB_SECONDS.observe(seconds)
    return replace(result, seconds=seconds)


def _contended(
    ctx: JobContext, marker: rows.CloseMarker, token: fencing.FencingToken, detail: str
) -> JobResult:
    """The tax service holds another writer's document for this revision (HTTP 409 on
    ``<invoice id>:r<revision>``): a replay racing the worker on revision 1
    (docs/decisions/0092-replay-and-released-holds.md).
    If that writer's invoice is written, this marker is done (already invoiced);
    otherwise wait for it (CONTENDED: the poll thread retries with a growing backoff).

    Raises nothing: a database failure here is a RETRY."""
    try:
        with ctx.pool.connection() as conn:
            existing = ctx.stores.invoices.current_invoice(
                conn, marker.customer_id, marker.billing_period
            )
        if existing is not None:
            _record_close(ctx, marker, token, "already_invoiced", existing.invoice_id)
            return JobResult(
                marker,
                token,
                Outcome.ALREADY_INVOICED,
                f"{existing.invoice_number} written by another writer",
                existing.invoice_id,
                existing.invoice_number,
            )
    except fencing.Fenced as exc:
        return JobResult(marker, token, Outcome.FENCED, str(exc))
    except Exception as exc:
        return JobResult(marker, token, Outcome.RETRY, classify(exc).reason)
    return JobResult(marker, token, Outcome.CONTENDED, detail)


class CrossPartitionUsage(InvoiceRuleViolation):
    """A customer has usage of the period on other partitions than its close marker's:
    the topic gained partitions and moved the customer (docs/design.md "Scaling"). Nothing orders
    those lines against the marker, so the invoice is refused (held) rather than
    built from part of the usage; the runbook is in docs/operations.md "Adding
    partitions"."""


def _record_close(
    ctx: JobContext,
    marker: rows.CloseMarker,
    token: fencing.FencingToken,
    outcome: str,
    invoice_id: str | None,
) -> None:
    write_fenced(
        ctx.pool,
        token,
        lambda conn: ctx.stores.closes.record_close(conn, marker, outcome, invoice_id),
        stores=ctx.stores,
    )


def _hold(
    ctx: JobContext, marker: rows.CloseMarker, token: fencing.FencingToken, rating: Rated
) -> JobResult:
    """A gap in the book or the data: hold the invoice with the rating's reasons and
    record the close ``held``, in one fenced transaction (idempotent per marker:
    ``invoice_holds`` is unique per source record and customer)."""
    reason = hold_reason(rating.rated)

    def work(conn: psycopg.Connection[Any]) -> None:
        ctx.stores.holds.record_hold(
            conn,
            customer_id=marker.customer_id,
            billing_period=marker.billing_period,
            reason=reason,
            event_id=marker.event_id,
            source=marker.source,
        )
        ctx.stores.closes.record_close(conn, marker, "held", None)

    write_fenced(ctx.pool, token, work, stores=ctx.stores)
    HOLDS.inc()
    for code in hold_codes(rating.rated):
        RATING_HOLDS.labels(code).inc()
    log.warning(
        "invoice of %s for %s held by rating: %s", marker.customer_id, marker.billing_period, reason
    )
    return JobResult(marker, token, Outcome.HELD, reason)


def _run(
    ctx: JobContext, marker: rows.CloseMarker, token: fencing.FencingToken, cancel: threading.Event
) -> JobResult:
    customer_id, period = marker.customer_id, marker.billing_period
    # 1. read
    inputs = None
    elsewhere: list[UsageLine] = []
    metered_elsewhere: Sequence[MeteredEvent] = ()
    draft: rows.Draft | None = None
    with ctx.pool.connection() as conn, conn.transaction():
        existing = ctx.stores.invoices.current_invoice(conn, customer_id, period)
        if existing is None:
            draft = ctx.stores.drafts.open_draft(conn, customer_id, period)
        holds = [] if existing else ctx.stores.holds.open_holds(conn, customer_id, period)
        customer = ctx.stores.usage.get_customer(conn, customer_id)
        if existing is None and not holds and customer is not None:
            lines = ctx.stores.usage.usage_before(
                conn,
                customer_id,
                period,
                marker.source.topic,
                marker.source.partition,
                marker.source.offset,
            )
            elsewhere = ctx.stores.usage.usage_elsewhere(
                conn, customer_id, period, marker.source.topic, marker.source.partition
            )
            if elsewhere and marker.reason == "hold_released":
                # An operator released the hold after checking every partition was read
                # to its end (docs/operations.md): the usage of every partition is the
                # customer's.
                lines = sorted(
                    [*lines, *elsewhere],
                    key=lambda line: (line.source_partition, line.source_offset),
                )
            inputs = gather(
                conn,
                marker,
                currency=customer.currency,
                book=ctx.price_books.current(conn, ctx.stores.pricing),
                pass_through=lines,
                metering=ctx.stores.metering,
            )
            metered_elsewhere = ctx.stores.metering.metered_elsewhere(
                conn, customer_id, period, marker.source.topic, marker.source.partition
            ).events
            if metered_elsewhere and marker.reason == "hold_released":
                # As for usage lines: a released hold rates every partition's events.
                inputs = replace(inputs, metered=(*inputs.metered, *metered_elsewhere))
    drafting = marker.reason in (FINALIZE_REASON, RERATE_REASON)
    if existing is not None:
        if marker.reason != RERATE_REASON:  # a re-rating is no marker: nothing to record
            _record_close(ctx, marker, token, "already_invoiced", existing.invoice_id)
        return JobResult(
            marker,
            token,
            Outcome.ALREADY_INVOICED,
            f"{existing.invoice_number} exists",
            existing.invoice_id,
            existing.invoice_number,
        )
    if drafting and draft is None:  # finalised meanwhile, or never a draft: nothing to do
        if marker.reason == FINALIZE_REASON:
            _record_close(ctx, marker, token, "already_invoiced", None)
        return JobResult(marker, token, Outcome.ALREADY_INVOICED, "no open draft")
    if holds:
        _record_close(ctx, marker, token, "held", None)
        HOLDS.inc()
        reasons = "; ".join(
            f"#{h.hold_id} {h.reason} ({h.source_topic}[{h.source_partition}]@{h.source_offset})"
            for h in holds
        )
        log.warning("invoice of %s for %s held: %s", customer_id, period, reasons)
        return JobResult(marker, token, Outcome.HELD, reasons)
    if customer is None or inputs is None:
        raise InvoiceRuleViolation(
            f"customer {customer_id!r} has no customer.upserted before its close marker"
        )
    if elsewhere:
        partitions = sorted({line.source_partition for line in elsewhere})
        if marker.reason != "hold_released":
            CROSS_PARTITION_USAGE.inc()
            log.error(
                "ALERT %s %s has %d usage line(s) on partition(s) %s, its close marker is on "
                "%s: the topic gained partitions; invoice held (docs/operations.md)",
                customer_id,
                period,
                len(elsewhere),
                partitions,
                marker.source.partition,
            )
            raise CrossPartitionUsage(
                f"{len(elsewhere)} usage line(s) of {customer_id} {period} were read from "
                f"partition(s) {partitions} of {marker.source.topic}, the close marker from "
                f"partition {marker.source.partition} (the topic gained partitions): not "
                "invoiced from part of the usage. Once every partition is read to its end, "
                "release this hold: the released close includes every partition"
            )
        log.warning(  # the lines were added to the pass-through lines at the read
            "invoice of %s %s includes %d usage line(s) of partition(s) %s (hold released)",
            customer_id,
            period,
            len(elsewhere),
            partitions,
        )

    if metered_elsewhere and marker.reason != "hold_released":
        CROSS_PARTITION_USAGE.inc()
        log.error(
            "ALERT %s %s has %d metered event(s) on other partitions than its close marker's "
            "(%s): the topic gained partitions; invoice held (docs/operations.md)",
            customer_id,
            period,
            len(metered_elsewhere),
            marker.source.partition,
        )
        raise CrossPartitionUsage(
            f"{len(metered_elsewhere)} metered event(s) of {customer_id} {period} were read "
            f"from other partitions of {marker.source.topic} than the close marker's "
            f"({marker.source.partition}; the topic gained partitions): not invoiced from "
            "part of the usage. Once every partition is read to its end, release this hold: "
            "the released close includes every partition"
        )

    # 2. rate and price: refuse bad data now, while no tax document is committed for this key
    rating = rate_period(inputs)
    RATING_SECONDS.observe(rating.seconds)
    RATED_EVENTS.inc(rating.metered_events)
    if rating.priced is None:
        if marker.reason == RERATE_REASON:  # the finalisation holds it, with its marker
            return JobResult(marker, token, Outcome.ALREADY_INVOICED, "re-rating held; kept")
        return _hold(ctx, marker, token, rating)
    priced = rating.priced
    revision = 1
    invoice_id = invoice_id_for(customer_id, period, revision)
    grace = draft_grace(customer, inputs.book, rating)
    if draft is not None and marker.reason != FINALIZE_REASON:
        grace = Grace(draft.grace_hours, draft.grace_source)  # the first close's
    if cancel.is_set():
        return JobResult(marker, token, Outcome.CANCELLED, "cancelled before the tax call")
    if marker.reason != FINALIZE_REASON and (draft is not None or grace.drafts):
        return save_draft(
            ctx, marker, token, priced, customer, invoice_id, revision, grace, draft, cancel
        )
    # 3. tax, with no transaction open
    taxed = ctx.tax.calculate(
        idempotency_key=tax_idempotency_key(invoice_id, revision),
        customer_id=customer_id,
        currency=customer.currency,
        lines=priced.tax_lines(),
    )
    totals = apply_tax(priced, taxed)
    if cancel.is_set():
        return JobResult(marker, token, Outcome.CANCELLED, "cancelled after the tax call")
    invoice = rows.InvoiceDraft(
        invoice_id=invoice_id,
        revision=revision,
        customer=customer,
        billing_period=period,
        totals=totals,
        lines=priced.lines,
        taxed=tuple(taxed),
        marker=marker,
    )
    # 4. write: the one issuance transaction, under the partition fence

    def after(conn: Any, issued: Issued) -> None:
        ctx.stores.closes.record_close(conn, marker, "invoiced", issued.invoice_id)
        if draft is not None:  # finalisation: the draft is issued in this transaction
            ctx.stores.drafts.mark_finalized(
                conn, issued.invoice_id, issued.invoice_number, issued.issued_at
            )

    result = issue(
        ctx.pool,
        token,
        invoice,
        invoices_topic=ctx.invoices_topic,
        source=EVENT_SOURCE,
        # a finalisation keeps the lease token of the close that made the draft
        lease_fencing_token=(
            draft.lease_fencing_token if draft is not None else marker.lease_fencing_token
        ),
        before=(
            (lambda conn: lock_draft(ctx, conn, customer_id, period)) if draft is not None else None
        ),
        after=after,
        stores=ctx.stores,
    )
    if isinstance(result, NotIssued):
        # Someone (a previous owner, a redelivery) wrote it; the number was given back.
        with ctx.pool.connection() as conn:
            existing = ctx.stores.invoices.current_invoice(conn, customer_id, period)
        _record_close(
            ctx, marker, token, "already_invoiced", existing.invoice_id if existing else None
        )
        return JobResult(
            marker,
            token,
            Outcome.ALREADY_INVOICED,
            "written concurrently",
            existing.invoice_id if existing else None,
            existing.invoice_number if existing else None,
        )
    return JobResult(
        marker,
        token,
        Outcome.INVOICED,
        f"{totals.line_count} lines, total {totals.total}",
        invoice_id,
        result.invoice_number,
    )
