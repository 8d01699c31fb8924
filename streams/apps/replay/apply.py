"""Compare one customer and, for an apply, correct it: steps 4 and 5 of a replay run.

Per customer (:func:`replay_customer`), in this order: skip it when it cannot be
judged or must not be touched (an open hold, a period not closed or a close
marker the workers have not handled yet, every revision voided, invoice lines
or metered events outside the window); **rate** the rebuilt period with the one
rating function (:func:`streams.core.billing.rating.rate_period`: the re-read
pre-priced lines and metered events, the customer's subscription events — the
stored history and the re-read ones — under the run's price book: the published
one, or for a dry run a candidate file, shadow re-rating); a rating that holds
(a gap in the book) skips the customer with the hold's reasons; tax it — a **quote**
(``commit=False``) for a dry run and for unchanged lines, the real document
(``commit=True``, idempotency key :func:`streams.core.billing.issuance.tax_idempotency_key`
of the new revision) for a correction; compare (:mod:`streams.apps.replay.diff`);
and for an apply with a difference write the correction in ONE transaction,
the kernel's issuance (:func:`streams.core.billing.issuance.issue`) under the lease
fence: the issued revision still the compared one (``SELECT … FOR UPDATE``),
its credit note and ``issued`` → ``superseded``, the new revision with its
lines and outbox rows, the usage lines the worker never stored (a lost write)
restored, and the customer's ``replay_results`` row. A unique key that says
someone wrote first rolls the customer back and compares it again (at most
:data:`MAX_CONFLICT_RETRIES` times). Per-customer failures are outcomes, not
exceptions; lease errors propagate.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from streams.adapters.lease import (
    Lease,
    LeaseStoreError,
)
from streams.apps.replay import store as rstore
from streams.apps.replay.diff import CustomerDiff, IssuedInvoice, compare, lines_differ
from streams.apps.replay.reader import Window
from streams.apps.replay.rebuild import Coordinates, PeriodRebuild
from streams.apps.replay.report import CustomerOutcome, Mode
from streams.core.billing import fencing, rows, store
from streams.core.billing.failures import Disposition, classify
from streams.core.billing.issuance import Issued, NotIssued, issue, tax_idempotency_key
from streams.core.billing.ports import TaxRejected, TaxService, TaxUnavailable
from streams.core.billing.rating import PeriodInputs, hold_reason, rate_period
from streams.core.billing.store.metering import StoredSubscription
from streams.core.domain.errors import DomainError
from streams.core.domain.events import (
    SourceRange,
    SubscriptionEvent,
    deterministic_id,
    invoice_id_for,
)
from streams.core.domain.invoice import (
    InvoiceTotals,
    PricedInvoice,
    TaxedLine,
    UsageLine,
    apply_tax,
)
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import MeteredEvent, PriceBook, segments_for
from streams.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_CONFLICT_RETRIES",
    "SOURCE",
    "ReplayContext",
    "StepHook",
    "replay_customer",
]

#: CloudEvents ``source`` of the events the replay publishes (through the outbox).
SOURCE = "/jobs/replay"
#: Times a customer is compared again after a concurrent writer changed its invoice.
MAX_CONFLICT_RETRIES = 3

#: ``on_step(stage, customer_id)`` — a test hook called after the re-read
#: (``"read"``, customer ``""``), after a customer's tax document was committed
#: (``"taxed"``) and after its transaction committed (``"written"``). Whatever it
#: raises propagates (simulated crashes); it may block (simulated slow runs).
StepHook = Callable[[str, str], None]


class _Changed(Exception):
    """The customer's invoice changed between the comparison and the write: compare again."""


@dataclass
class ReplayContext:
    """What one run knows while it compares and corrects its customers."""

    settings: Settings
    period: str
    mode: Mode
    topic: str
    invoices_topic: str
    pool: ConnectionPool[Any]
    tax: TaxService
    lease: Lease
    run_id: str
    window: Window
    rebuild: PeriodRebuild
    on_step: StepHook
    usage: dict[str, list[UsageLine]] = field(default_factory=dict)
    issued: dict[str, IssuedInvoice] = field(default_factory=dict)
    revisions: dict[str, int] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    #: customers whose last handled close marker of the period was held (a release of
    #: the hold re-sends a marker, from which the invoicing worker invoices them)
    held_closes: set[str] = field(default_factory=set)
    #: customers with an open draft of the period: its owner finalises it (docs/invoices.md
    #: "Drafts and finalisation"), so the replay writes nothing for them
    drafted: set[str] = field(default_factory=set)
    stored_ids: set[str] = field(default_factory=set)
    db_customers: dict[str, rows.Customer] = field(default_factory=dict)
    #: partition → the invoicing group's committed offset (the next record it will handle)
    worker_next: dict[int, int] = field(default_factory=dict)
    #: the price book the run rates under (the published one, or a candidate: dry run)
    book: PriceBook = field(default_factory=PriceBook)
    #: customer → its distinct metered events of the period and where each was read
    metered: dict[str, list[tuple[MeteredEvent, Coordinates]]] = field(default_factory=dict)
    #: customer → its stored subscription history (``subscription_events``)
    stored_subscriptions: dict[str, list[StoredSubscription]] = field(default_factory=dict)
    #: event ids of the period in ``metered_usage``
    stored_metered: set[str] = field(default_factory=set)
    #: customer → stored metered events of the period read before the window
    metered_below: dict[str, int] = field(default_factory=dict)

    @property
    def apply(self) -> bool:
        return self.mode is Mode.APPLY


def _identity(ctx: ReplayContext, customer_id: str) -> rows.Customer | None:
    """Who the invoice is for: the latest ``customer.upserted`` in the window (so a resumed
    run sees the same), else the stored customer row."""
    upserted = ctx.rebuild.customer(customer_id)
    if upserted is not None:
        return rows.Customer(upserted.customer_id, upserted.name, upserted.email, upserted.currency)
    return ctx.db_customers.get(customer_id)


def replay_customer(ctx: ReplayContext, customer_id: str) -> CustomerOutcome:
    """Compare (and for an apply, correct) one customer. Lease errors propagate."""
    for _attempt in range(MAX_CONFLICT_RETRIES + 1):
        try:
            outcome = _compare_and_apply(ctx, customer_id)
        except _Changed as exc:
            logger.info(
                "replay %s: %s changed concurrently (%s); comparing again", ctx.period,
                customer_id, exc,
            )  # fmt: skip
            with ctx.pool.connection() as conn, conn.transaction():
                fresh = rstore.issued_invoices(conn, ctx.period, ctx.topic, customer_id)
                ctx.revisions[customer_id] = store.invoices.max_revision(
                    conn, customer_id, ctx.period
                )
                if store.holds.has_open_hold(conn, customer_id, ctx.period):
                    ctx.held.add(customer_id)
            ctx.issued.pop(customer_id, None)
            ctx.issued.update(fresh)
            continue
        except (TaxUnavailable, psycopg.OperationalError, LeaseStoreError) as exc:
            return CustomerOutcome(
                customer_id, "failed", f"{type(exc).__name__}: {exc}", transient=True
            )
        except TaxRejected as exc:
            if classify(exc).disposition is Disposition.CONTENDED:
                # HTTP 409: the key's tax document was committed by another writer (the
                # invoicing worker racing this run on the same revision): its invoice is
                # about to exist; a resume compares against it
                # (docs/decisions/0092-replay-and-released-holds.md).
                return CustomerOutcome(
                    customer_id,
                    "failed",
                    f"contended: {type(exc).__name__}: {exc}; left for a resume",
                    transient=True,
                )
            failed = CustomerOutcome(customer_id, "failed", f"{type(exc).__name__}: {exc}")
            _record(ctx, failed)
            return failed
        except DomainError as exc:
            failed = CustomerOutcome(customer_id, "failed", f"{type(exc).__name__}: {exc}")
            _record(ctx, failed)
            return failed
        return outcome
    return CustomerOutcome(
        customer_id,
        "failed",
        f"changed concurrently {MAX_CONFLICT_RETRIES + 1} times; left for a resume",
        transient=True,
    )


def _skip(
    ctx: ReplayContext,
    customer_id: str,
    reason: str,
    diff: CustomerDiff | None = None,
    *,
    record: bool = True,
) -> CustomerOutcome:
    """A skipped customer; recorded for a resume unless ``record`` is False (a condition
    that may clear before the resume, like a pending close marker)."""
    outcome = CustomerOutcome(
        customer_id,
        "skipped",
        reason,
        diff=diff,
        difference=diff.to_json() if diff is not None else None,
        old_invoice_id=diff.issued.invoice_id if diff is not None and diff.issued else None,
    )
    if record:
        _record(ctx, outcome)
    return outcome


def _record(ctx: ReplayContext, outcome: CustomerOutcome) -> None:
    """An apply records every finished customer (fenced), so a resume skips it."""
    if not ctx.apply:
        return
    with ctx.pool.connection() as conn, conn.transaction():
        fencing.LeaseFence.of(ctx.lease).check(conn)
        rstore.record_result(
            conn,
            ctx.run_id,
            customer_id=outcome.customer_id,
            outcome=outcome.outcome,
            detail=outcome.to_json(),
            old_invoice_id=outcome.old_invoice_id,
            new_invoice_id=outcome.new_invoice_id,
            credit_note_id=outcome.credit_note_id,
        )


def _tax(
    ctx: ReplayContext,
    customer_id: str,
    currency: str,
    priced: PricedInvoice,
    invoice_id: str,
    revision: int,
    *,
    commit: bool,
) -> tuple[list[TaxedLine], InvoiceTotals]:
    """Tax the priced invoice under ``<invoice id>:r<revision>``.

    The pricing rules (rating, currency, duplicates, subtotal) ran before, as in the
    invoicing worker (:mod:`streams.apps.invoicing.jobs`): a committed tax document keeps
    its idempotency key, so data refused after the call could never be taxed again
    under that key once corrected.

    Raises:
        DomainError: the tax answers are malformed.
        TaxError: the tax service failed or refused (see :mod:`streams.adapters.tax`).
    """
    taxed = ctx.tax.calculate(
        idempotency_key=tax_idempotency_key(invoice_id, revision),
        customer_id=customer_id,
        currency=currency,
        lines=priced.tax_lines(),
        commit=commit,
    )
    return taxed, apply_tax(priced, taxed)


def subscriptions_of(ctx: ReplayContext, customer_id: str) -> list[SubscriptionEvent]:
    """The customer's subscription events: the stored history and those re-read in the
    window, one per event id, in (partition, offset) order (the worker's order)."""
    events: dict[str, tuple[int, int, SubscriptionEvent]] = {
        stored.event_id: (stored.source.partition, stored.source.offset, stored.data)
        for stored in ctx.stored_subscriptions.get(customer_id, [])
    }
    for event_id, data, at in ctx.rebuild.subscriptions(customer_id):
        events.setdefault(event_id, (at.partition, at.offset, data))
    return [data for _, _, data in sorted(events.values(), key=lambda item: item[:2])]


def subscribed_in_period(ctx: ReplayContext, customer_id: str) -> bool:
    """Whether a plan version is in effect for a day of the period."""
    return bool(segments_for(BillingPeriod.parse(ctx.period), subscriptions_of(ctx, customer_id)))


def _metered_source(
    metered: list[tuple[MeteredEvent, Coordinates]],
) -> tuple[SourceRange, ...]:
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for _, at in metered:
        low, high = spans.get((at.topic, at.partition), (at.offset, at.offset))
        spans[(at.topic, at.partition)] = (min(low, at.offset), max(high, at.offset))
    return tuple(
        SourceRange(topic=topic, partition=partition, first_offset=low, last_offset=high)
        for (topic, partition), (low, high) in sorted(spans.items())
    )


def _compare_and_apply(ctx: ReplayContext, customer_id: str) -> CustomerOutcome:
    lines = ctx.usage.get(customer_id, [])
    metered = ctx.metered.get(customer_id, [])
    issued = ctx.issued.get(customer_id)
    if customer_id in ctx.held:
        return _skip(ctx, customer_id, "held: the customer has an unreleased invoice hold")
    if issued is None and customer_id in ctx.drafted:
        return _skip(
            ctx,
            customer_id,
            "pending: the period's invoice is a draft in its grace period; the invoicing "
            "worker that owns it issues it when the grace period ends",
            record=False,
        )
    if issued is None:
        if not lines and not metered and not subscribed_in_period(ctx, customer_id):
            # nothing issued, nothing used (e.g. a revision issued concurrently vanished)
            return CustomerOutcome(customer_id, "unchanged")
        if ctx.revisions.get(customer_id, 0) > 0:
            return _skip(
                ctx, customer_id, "voided: no issued revision; a replay does not reissue a void"
            )
        if customer_id in ctx.held_closes:
            # Its close was held and the hold released: the release re-sent a marker
            # the invoicing worker invoices from. Writing revision 1 here would race it
            # under the same tax idempotency key (docs/decisions/0092-replay-and-released-holds.md).
            return _skip(
                ctx,
                customer_id,
                "pending: the close was held and the hold released; the invoicing workers "
                "invoice it from the re-sent close marker",
                record=False,
            )
        if customer_id not in ctx.closed:
            marker = ctx.rebuild.closed_at(customer_id)
            if marker is None:
                return _skip(ctx, customer_id, "not_closed: no close marker for the period yet")
            if ctx.worker_next.get(marker.partition, -1) <= marker.offset:
                # The worker will invoice it: racing it would only make the same invoice.
                return _skip(
                    ctx,
                    customer_id,
                    f"pending: the invoicing workers have not handled the close marker at "
                    f"[{marker.partition}]@{marker.offset} yet",
                    record=False,
                )
    identity = _identity(ctx, customer_id)
    if identity is None:
        raise _NoCustomer(customer_id)
    currency = issued.currency if issued is not None else identity.currency
    revision = (issued.revision if issued is not None else 0) + 1
    new_id = invoice_id_for(customer_id, ctx.period, revision)
    if ctx.metered_below.get(customer_id):
        return _skip(
            ctx,
            customer_id,
            f"incomplete_window: {ctx.metered_below[customer_id]} stored metered event(s) of "
            "the period lie before the re-read window; widen --margin-days",
        )
    rating = rate_period(
        PeriodInputs(
            period=ctx.period,
            currency=currency,
            book=ctx.book,
            subscriptions=tuple(subscriptions_of(ctx, customer_id)),
            metered=tuple(event for event, _ in metered),
            pass_through=tuple(lines),
            metered_source=_metered_source(metered),
        )
    )
    if rating.priced is None:
        # A gap in the book (or a candidate book that does not price this customer):
        # never billed, never written; a resume rates it again.
        return _skip(ctx, customer_id, f"rating_hold: {hold_reason(rating.rated)}", record=False)
    priced = rating.priced
    differ = lines_differ(issued, priced.lines, priced.charges)
    commit = ctx.apply and differ
    taxed, totals = _tax(ctx, customer_id, currency, priced, new_id, revision, commit=commit)
    diff = compare(
        customer_id=customer_id,
        billing_period=ctx.period,
        issued=issued,
        lines=priced.lines,
        totals=totals,
        window=ctx.window.bounds(),
        stored_event_ids=ctx.stored_ids,
    )
    if not diff.judgeable:
        return _skip(
            ctx,
            customer_id,
            f"incomplete_window: {len(diff.outside_window)} invoiced line(s) lie outside the "
            "re-read window; widen --margin-days",
            diff,
        )
    if not diff.has_difference:
        outcome = CustomerOutcome(
            customer_id, "unchanged", old_invoice_id=issued.invoice_id if issued else None
        )
        _record(ctx, outcome)
        return outcome
    if not ctx.apply:
        return CustomerOutcome(
            customer_id,
            "difference",
            diff.reason(),
            diff=diff,
            difference=diff.to_json(),
            old_invoice_id=issued.invoice_id if issued else None,
            new_invoice_id=new_id,
            revision=revision,
        )
    if not commit:  # same lines, other totals (a rate changed): the real document now
        taxed, totals = _tax(ctx, customer_id, currency, priced, new_id, revision, commit=True)
        diff = compare(
            customer_id=customer_id,
            billing_period=ctx.period,
            issued=issued,
            lines=priced.lines,
            totals=totals,
            window=ctx.window.bounds(),
            stored_event_ids=ctx.stored_ids,
        )
        if not diff.has_difference:
            outcome = CustomerOutcome(
                customer_id, "unchanged", old_invoice_id=issued.invoice_id if issued else None
            )
            _record(ctx, outcome)
            return outcome
    ctx.on_step("taxed", customer_id)
    outcome = _write(
        ctx, identity, issued, revision, new_id, list(priced.lines), metered, taxed, totals, diff
    )
    ctx.on_step("written", customer_id)
    return outcome


class _NoCustomer(DomainError):
    """No ``customer.upserted`` in the window and no stored customer row."""

    def __init__(self, customer_id: str) -> None:
        super().__init__(
            f"customer {customer_id!r} has no customer.upserted in the window and no stored row"
        )


def _write(
    ctx: ReplayContext,
    identity: rows.Customer,
    issued: IssuedInvoice | None,
    revision: int,
    new_id: str,
    lines: list[UsageLine],
    metered: list[tuple[MeteredEvent, Coordinates]],
    taxed: list[TaxedLine],
    totals: InvoiceTotals,
    diff: CustomerDiff,
) -> CustomerOutcome:
    """The customer's ONE fenced transaction (see the module doc, step 5).

    Raises:
        _Changed: the issued revision is no longer the compared one, or a unique key
            says someone else wrote first; everything was rolled back.
    """
    customer_id, period = identity.customer_id, ctx.period
    closed = ctx.rebuild.closed_at(customer_id)
    if lines:
        partition = lines[0].source_partition
    elif metered:
        partition = metered[0][1].partition
    elif issued is not None:
        partition = issued.source_partition
    else:
        partition = closed.partition if closed is not None else 0
    draft = rows.InvoiceDraft(
        invoice_id=new_id,
        revision=revision,
        customer=identity,
        billing_period=period,
        totals=totals,
        lines=tuple(lines),
        taxed=tuple(taxed),
        marker=rows.ClosePoint(
            f"replay:{ctx.run_id}",
            rows.SourceCoordinates(ctx.topic, partition, ctx.window.end.get(partition, 0)),
        ),
        supersedes_invoice_id=issued.invoice_id if issued is not None else None,
    )
    reason = f"replay {ctx.run_id}: {diff.reason()}"
    credit = (
        rows.CreditNoteDraft(
            credit_note_id=deterministic_id("credit_note", issued.invoice_id),
            invoice_id=issued.invoice_id,
            invoice_number=issued.invoice_number,
            revision=issued.revision,
            customer=identity,
            billing_period=period,
            currency=issued.currency,
            subtotal=issued.subtotal,
            tax_total=issued.tax_total,
            total=issued.total,
            reason=reason,
        )
        if issued is not None
        else None
    )

    def still_as_compared(conn: psycopg.Connection[Any]) -> None:
        """Under the lock of the issued revision: it is still the one compared."""
        if store.holds.has_open_hold(conn, customer_id, period):
            raise _Changed("a hold was recorded meanwhile")
        locked = store.invoices.lock_issued(conn, customer_id, period)
        if issued is None:
            if locked is not None or store.invoices.max_revision(conn, customer_id, period) != 0:
                raise _Changed("an invoice was issued meanwhile")
        elif locked is None or locked.invoice_id != issued.invoice_id:
            raise _Changed("the issued revision changed meanwhile")

    def outcome_of(done: Issued) -> CustomerOutcome:
        return CustomerOutcome(
            customer_id,
            "corrected" if issued is not None else "invoiced",
            diff.reason(),
            diff=diff,
            difference=diff.to_json(),
            old_invoice_id=issued.invoice_id if issued is not None else None,
            new_invoice_id=new_id,
            new_invoice_number=done.invoice_number,
            revision=revision,
            credit_note_id=done.credit_note_id,
            credit_note_number=done.credit_note_number,
        )

    def record(conn: psycopg.Connection[Any], done: Issued) -> None:
        _restore_lost_usage(ctx, conn, diff)
        _restore_lost_metered(ctx, conn, metered)
        outcome = outcome_of(done)
        rstore.record_result(
            conn,
            ctx.run_id,
            customer_id=customer_id,
            outcome=outcome.outcome,
            detail=outcome.to_json(),
            old_invoice_id=outcome.old_invoice_id,
            new_invoice_id=new_id,
            credit_note_id=done.credit_note_id,
        )

    done = issue(
        ctx.pool,
        fencing.LeaseFence.of(ctx.lease),
        draft,
        invoices_topic=ctx.invoices_topic,
        source=SOURCE,
        lease_fencing_token=ctx.lease.fencing_token,
        credit=credit,
        before=still_as_compared,
        after=record,
    )
    if isinstance(done, NotIssued):
        raise _Changed(done.reason)
    outcome = outcome_of(done)
    logger.info(
        "replay %s: %s %s revision %d %s (%s)%s",
        period,
        outcome.outcome,
        customer_id,
        revision,
        done.invoice_number,
        diff.reason(),
        f", credit note {done.credit_note_number}" if done.credit_note_number else "",
    )
    return outcome


def _restore_lost_usage(
    ctx: ReplayContext, conn: psycopg.Connection[Any], diff: CustomerDiff
) -> None:
    """Store the invoiced usage lines ``usage_lines`` lacks (a lost write), so that the table
    again holds every invoiced event (``ON CONFLICT DO NOTHING``: a worker's row stays)."""
    records = []
    for ref in diff.usage_not_invoiced:
        if ref.stored:
            continue
        found = ctx.rebuild.usage_record(ref.event_id)
        if found is None:
            continue
        data, at = found
        records.append(
            rows.UsageRecord(
                ref.event_id, data, rows.SourceCoordinates(at.topic, at.partition, at.offset)
            )
        )
    store.usage.insert_usage(conn, records)


def _restore_lost_metered(
    ctx: ReplayContext,
    conn: psycopg.Connection[Any],
    metered: list[tuple[MeteredEvent, Coordinates]],
) -> None:
    """Store the rated metered events ``metered_usage`` lacks (a lost write), as for
    usage lines (``ON CONFLICT DO NOTHING``)."""
    records = []
    for event, _ in metered:
        if event.event_id in ctx.stored_metered:
            continue
        found = ctx.rebuild.metered_record(event.event_id)
        if found is None:
            continue
        data, at = found
        records.append(
            rows.MeteredRecord(
                event.event_id, data, rows.SourceCoordinates(at.topic, at.partition, at.offset)
            )
        )
    store.metering.insert_metered(conn, records)
