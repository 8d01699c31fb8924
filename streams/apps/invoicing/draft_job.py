"""The invoice job's draft path (docs/invoices.md "Drafts and finalisation"): the grace
period of an invoice, the draft written or re-rated in place, and the lock a
finalisation takes on it. Called by :func:`streams.apps.invoicing.jobs.run_invoice_job`.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime
from typing import Any

from streams.apps.invoicing.job_types import JobContext, JobResult, Outcome
from streams.core.billing import fencing, rows
from streams.core.billing.commit import write_fenced
from streams.core.billing.issuance import tax_idempotency_key
from streams.core.billing.rating import Rated
from streams.core.domain.drafts import RERATE_REASON, Grace, grace_ends_at, grace_of
from streams.core.domain.invoice import PricedInvoice, apply_tax
from streams.core.domain.rating import PriceBook

log = logging.getLogger("streams.apps.invoicing.jobs")


def draft_grace(customer: rows.Customer, book: PriceBook, rating: Rated) -> Grace:
    """The grace period of this invoice (:func:`streams.core.domain.drafts.grace_of`): the
    customer's, else that of the plan version of the period's last segment, else 0."""
    plan_hours = None
    segments = rating.rated.segments
    if segments:
        last = segments[-1]
        version = book.plan_version(last.plan_code, last.plan_version)
        plan_hours = version.invoice_grace_hours if version is not None else None
    return grace_of(customer.invoice_grace_hours, plan_hours)


def lock_draft(ctx: JobContext, conn: Any, customer_id: str, period: str) -> None:
    """Lock the open draft ``FOR UPDATE`` for the finalisation's transaction (a
    concurrent re-rating waits, then finds it finalised and changes nothing)."""
    ctx.stores.drafts.open_draft(conn, customer_id, period, lock=True)


def save_draft(
    ctx: JobContext,
    marker: rows.CloseMarker,
    token: fencing.FencingToken,
    priced: PricedInvoice,
    customer: rows.Customer,
    invoice_id: str,
    revision: int,
    grace: Grace,
    draft: rows.Draft | None,
    cancel: threading.Event,
) -> JobResult:
    """Make the draft of ``marker``'s close, or re-rate the open ``draft`` in place: taxed
    as a quote (``commit=False``: the tax service stores nothing, so the finalisation's
    committed document under the same key may have other lines), then one fenced
    transaction: the draft row (no number, no outbox row) and, for a close marker, its
    close recorded ``drafted``. The draft's figures are those of the usage before
    ``marker`` on its partition (its watermark)."""
    taxed = ctx.tax.calculate(
        idempotency_key=tax_idempotency_key(invoice_id, revision),
        customer_id=customer.customer_id,
        currency=customer.currency,
        lines=priced.tax_lines(),
        commit=False,
    )
    totals = apply_tax(priced, taxed)
    if cancel.is_set():
        return JobResult(marker, token, Outcome.CANCELLED, "cancelled after the tax call")
    ends = (
        draft.grace_ends_at if draft is not None else grace_ends_at(datetime.now(UTC), grace.hours)
    )

    def work(conn: Any) -> None:
        ctx.stores.drafts.save_draft(
            conn,
            invoice_id=invoice_id,
            revision=revision,
            marker=marker,
            watermark_offset=marker.source.offset,
            totals=totals,
            grace_hours=grace.hours,
            grace_source=grace.source,
            grace_ends_at=ends,
            fence=(token.generation, token.member_id),
        )
        if marker.reason != RERATE_REASON:
            ctx.stores.closes.record_close(conn, marker, "drafted", invoice_id)

    write_fenced(ctx.pool, token, work, stores=ctx.stores)
    what = "re-rated" if draft is not None else "drafted"
    log.info(
        "%s %s %s: %d lines, total %s, grace %s h (%s) until %s",
        what,
        marker.customer_id,
        marker.billing_period,
        totals.line_count,
        totals.total,
        grace.hours,
        grace.source,
        ends.isoformat(),
    )
    return JobResult(
        marker,
        token,
        Outcome.DRAFTED,
        f"{what}: {totals.line_count} lines, total {totals.total}",
        invoice_id,
        None,
        draft_due=ends,
    )
