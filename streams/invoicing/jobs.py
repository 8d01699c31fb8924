"""The invoice job: one close marker → at most one invoice revision, its lines and
its outbox event, written in one fenced transaction.

Runs off the poll thread (the worker pauses the marker's partition meanwhile).
Four phases, and no database transaction stays open across the tax call
(DESIGN "Ownership and fencing"):

1. **read** (short read-only transaction): is there already a current invoice
   for (customer, period)? is the customer held? the customer, the published
   price book and what precedes the marker on its partition: the period's usage
   lines and metered events, and the customer's subscription events
   (:func:`streams.billing.rating.gather`);
2. **rate and price** (pure: :func:`streams.billing.rating.rate_period`, the one
   rating function :func:`~streams.domain.rating.rate` then
   :func:`~streams.domain.rating.priced_invoice`). A gap in the book or the
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
   (:func:`streams.billing.issuance.issue`) under the partition fence: the fence
   check, a gapless invoice number, ``INSERT … ON CONFLICT DO NOTHING`` of the
   invoice, its lines, the outbox row (only when the invoice row was new) and,
   in the same transaction, the close record.

The job never commits Kafka offsets: it returns a :class:`JobResult` and the
poll thread commits (after this database commit) — see :mod:`streams.billing.commit`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import psycopg

from streams.billing import fencing, rows
from streams.billing.commit import write_fenced
from streams.billing.failures import Disposition, classify
from streams.billing.issuance import NotIssued, issue, tax_idempotency_key
from streams.billing.ports import Database, TaxService
from streams.billing.rating import PriceBooks, Rated, gather, hold_codes, hold_reason, rate_period
from streams.billing.stores import POSTGRES, Stores
from streams.domain.errors import InvoiceRuleViolation
from streams.domain.events import invoice_id_for
from streams.domain.invoice import UsageLine, apply_tax
from streams.invoicing.metrics import (
    CROSS_PARTITION_USAGE,
    HOLDS,
    JOB_SECONDS,
    RATED_EVENTS,
    RATING_HOLDS,
    RATING_SECONDS,
)

log = logging.getLogger("streams.invoicing.jobs")

#: CloudEvents ``source`` of events the invoicing workers publish.
EVENT_SOURCE = "/invoicing/worker"


class Outcome(Enum):
    INVOICED = "invoiced"
    ALREADY_INVOICED = "already_invoiced"
    HELD = "held"
    RETRY = "retry"
    #: another writer (a replay) committed this revision's tax document and has not
    #: written its invoice yet: retry later, then find its invoice
    CONTENDED = "contended"
    FAILED = "failed"
    CANCELLED = "cancelled"
    FENCED = "fenced"


@dataclass(frozen=True)
class JobResult:
    """What a job did, for the poll thread: commit the marker's offset unless RETRY,
    CONTENDED, FENCED or CANCELLED; FAILED means dead-letter the marker and hold the
    customer."""

    marker: rows.CloseMarker
    token: fencing.FencingToken
    outcome: Outcome
    detail: str = ""
    invoice_id: str | None = None
    invoice_number: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class JobContext:
    """What a job needs: the pool, the tax service, the invoice topic name, and the
    store implementations the pool's connections take (default: PostgreSQL), and the
    published price book's cache (shared by the worker's jobs)."""

    pool: Database[Any]
    tax: TaxService
    invoices_topic: str
    stores: Stores[Any] = POSTGRES
    price_books: PriceBooks = field(default_factory=PriceBooks)


def run_invoice_job(
    ctx: JobContext, marker: rows.CloseMarker, token: fencing.FencingToken, cancel: threading.Event
) -> JobResult:
    """Build, tax and write the invoice of ``marker`` under ``token``. Never raises:
    every outcome is a :class:`JobResult`. Failures are classified by
    :func:`streams.billing.failures.classify`: fenced → FENCED; permanent (a rule, an
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
    return JobResult(
        result.marker,
        result.token,
        result.outcome,
        result.detail,
        result.invoice_id,
        result.invoice_number,
        seconds,
    )


def _contended(
    ctx: JobContext, marker: rows.CloseMarker, token: fencing.FencingToken, detail: str
) -> JobResult:
    """The tax service holds another writer's document for this revision (HTTP 409 on
    ``<invoice id>:r<revision>``): a replay racing the worker on revision 1 (issue 10).
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
    the topic gained partitions and moved the customer (DESIGN §5). Nothing orders
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
    with ctx.pool.connection() as conn, conn.transaction():
        existing = ctx.stores.invoices.current_invoice(conn, customer_id, period)
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
    if existing is not None:
        _record_close(ctx, marker, token, "already_invoiced", existing.invoice_id)
        return JobResult(
            marker,
            token,
            Outcome.ALREADY_INVOICED,
            f"{existing.invoice_number} exists",
            existing.invoice_id,
            existing.invoice_number,
        )
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

    # 2. rate and price: refuse bad data now, while no tax document is committed for this key
    rating = rate_period(inputs)
    RATING_SECONDS.observe(rating.seconds)
    RATED_EVENTS.inc(rating.metered_events)
    if rating.priced is None:
        return _hold(ctx, marker, token, rating)
    priced = rating.priced
    revision = 1
    invoice_id = invoice_id_for(customer_id, period, revision)
    if cancel.is_set():
        return JobResult(marker, token, Outcome.CANCELLED, "cancelled before the tax call")
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
    draft = rows.InvoiceDraft(
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
    result = issue(
        ctx.pool,
        token,
        draft,
        invoices_topic=ctx.invoices_topic,
        source=EVENT_SOURCE,
        lease_fencing_token=marker.lease_fencing_token,
        after=lambda conn, issued: ctx.stores.closes.record_close(
            conn, marker, "invoiced", issued.invoice_id
        ),
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
