"""A replay run: ``invoicing replay YYYY-MM --dry-run | --apply`` re-reads a billing period
and corrects its invoices (the orchestration; a customer's comparison and correction
is :mod:`streams.apps.replay.apply`, the report :mod:`streams.apps.replay.report`).

docs/design.md "Replay"; the decisions are written down in
docs/replay.md. Steps, in this order:

1. **Lease** ``<topic prefix>replay:<period>`` (Redis, :class:`~streams.adapters.lease.Lease`,
   TTL ``lease_ttl_s``, renewed every third; fencing counter first raised above
   what ``lease_fences`` recorded). One replay per period at a time, dry run or
   apply: a second one gets :class:`~streams.adapters.lease.LeaseBusy` before
   reading anything.
2. **Run state** (``replay_runs``). An apply first looks for the period's
   unfinished apply run and **resumes** it (same run id, same window, same
   consumer group; customers it already finished are skipped). Otherwise a new
   run id, its consumer group ``<prefix>replay-<period>-<run id>`` and its
   window: ``offsets_for_times(period start - margin)`` to the end offsets
   captured now (:mod:`streams.apps.replay.reader`).
3. **Re-read** the window with a progress bar (events/s), rebuilding the
   period's usage, customers and close markers (:mod:`streams.apps.replay.rebuild`).
4. **Compare**, per customer with usage or metered usage in the period, a
   subscription in effect for a day of it, or an issued invoice for it, in
   customer id order: the issued revision (``invoices`` + ``invoice_lines`` +
   ``invoice_charges``) against the invoice **rated** from the rebuilt period
   with the one rating function (:func:`streams.core.billing.rating.rate_period`)
   under the run's price book — the published one (PostgreSQL), or for a dry
   run a candidate book given by the caller (**shadow re-rating**: "what would
   this price change have billed?") — (:mod:`streams.apps.replay.diff`).
   Tax: a **quote** (``commit=False``; nothing is recorded at the tax service,
   the Redis rate cache may answer it) for the dry run and for customers whose
   lines are unchanged; the real document (``commit=True``, idempotency key
   ``<new invoice id>:r<revision>``) for a customer an apply corrects.
   Skipped, never written: customers with an open hold, customers whose period
   was not closed (no close marker in the window, none handled by a worker), a
   period whose revisions were all voided, and customers with invoice lines
   outside the window (the window cannot judge them).
5. **Apply**, per customer with a difference, ONE transaction: the lease's fence
   check; ``SELECT … FOR UPDATE`` of the issued revision (it must still be the
   one compared); a credit note (gapless ``CN-<period>`` number) for the issued
   revision's amounts; that revision ``issued`` → ``superseded`` (its amounts
   are never updated); the new revision (deterministic id, ``INV-<period>``
   number, ``supersedes_invoice_id``) with its lines and their source
   coordinates; the outbox rows ``credit_note.issued`` and ``invoice.issued``
   (deterministic ids, so the email sender emails each once); the usage lines
   the worker never stored (a lost write) restored into ``usage_lines``; and
   the customer's ``replay_results`` row. A missing invoice becomes revision 1
   the same way (no credit note). Every write uses ``ON CONFLICT DO NOTHING``
   on the same unique keys as the worker, and a conflict rolls the customer
   back and compares again (at most :data:`~streams.apps.replay.apply.MAX_CONFLICT_RETRIES` times).
6. **Finish**: the run ``completed``, or — an apply with customers that failed
   transiently (tax service or database unavailable) — left ``running`` for the
   next ``--apply`` to resume.

A dry run writes only its ``replay_runs`` row: nothing to the invoice tables,
no event, no email.

Exceptions: :class:`~streams.core.domain.errors.InvalidPeriod`;
:class:`~streams.adapters.lease.LeaseUnavailable` / ``LeaseBusy`` (nothing
done); :class:`~streams.apps.replay.errors.ReplayAborted` (lease lost or fenced
part-way; an apply resumes); :class:`~streams.apps.replay.errors.ReplayUnavailable`
(Kafka); ``psycopg`` errors (the database). Per-customer failures are results.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import psycopg
import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg_pool import ConnectionPool
from rich.progress import Progress

from streams.adapters.lease import (
    DEFAULT_KEY_PREFIX,
    Lease,
    LeaseFenced,
    LeaseLost,
)
from streams.apps.replay import store as rstore
from streams.apps.replay.apply import (
    ReplayContext,
    StepHook,
    replay_customer,
    subscribed_in_period,
)
from streams.apps.replay.errors import ReplayAborted, ReplayStateError, ReplayUnavailable
from streams.apps.replay.progress import progress_bars
from streams.apps.replay.reader import ReadStats, Window, plan_window, read_window
from streams.apps.replay.rebuild import Coordinates, PeriodRebuild
from streams.apps.replay.report import CustomerOutcome, Mode, ReplayReport, outcome_from_stored
from streams.core.billing import fencing, store
from streams.core.billing.failures import classify
from streams.core.billing.ports import TaxService
from streams.core.billing.rows import Record
from streams.core.domain.codec import decode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.fastcodec import decode_usage
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import PriceBook
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS as ACCOUNT_EVENTS_TOPIC
from streams.topics import INVOICES as INVOICES_TOPIC

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MARGIN",
    "CandidateBook",
    "consumer_group_for",
    "lease_name_for",
    "replay_period",
    "worker_positions",
]

#: How far before the period's start the re-read begins (late events produced early, clock skew).
DEFAULT_MARGIN = timedelta(days=7)

ACCOUNT_EVENTS = (
    CustomerUpserted,
    UsageRecorded,
    BillingPeriodClosed,
    UsageMetered,
    SubscriptionStarted,
    SubscriptionChanged,
    SubscriptionEnded,
)


@dataclass(frozen=True)
class CandidateBook:
    """An unpublished price book to rate a dry run under (shadow re-rating), and how the
    report names it (e.g. ``candidate examples/pricing/price-book-v2.yaml``)."""

    book: PriceBook
    label: str


def lease_name_for(period: str, settings: Settings) -> str:
    """``<topic_prefix>replay:<period>``: one replay per period and environment."""
    return f"{settings.kafka.topic_prefix}replay:{period}"


def consumer_group_for(period: str, run_id: str, settings: Settings) -> str:
    """The replay's own consumer group: ``<topic_prefix>replay-<period>-<run id>``."""
    return f"{settings.kafka.topic_prefix}replay-{period}-{run_id}"


def _default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:replay"


class ConsumerFactory(Protocol):
    """Builds a new Kafka consumer of ``group_id`` (the caller closes it); ``overrides``
    are librdkafka settings (e.g. ``{"enable.partition.eof": True}``)."""

    def __call__(self, group_id: str, **overrides: Any) -> Consumer: ...


@dataclass(frozen=True)
class ReplayClients:
    """The clients a replay run uses. Whoever built them closes them
    (:func:`streams.bootstrap.replay_clients` builds them from settings); the run
    closes only the consumers it makes with ``new_consumer``."""

    pool: ConnectionPool[Any]
    redis: redis.Redis
    tax: TaxService
    new_consumer: ConsumerFactory


def replay_period(
    period: str,
    settings: Settings,
    clients: ReplayClients,
    *,
    mode: Mode,
    margin: timedelta = DEFAULT_MARGIN,
    progress: bool = True,
    holder: str | None = None,
    lease_ttl_s: float = 30.0,
    lease_key_prefix: str = DEFAULT_KEY_PREFIX,
    on_step: StepHook | None = None,
    candidate: CandidateBook | None = None,
) -> ReplayReport:
    """Replay ``period`` (see the module doc for the steps) and return its report.

    Args:
        period: ``YYYY-MM``.
        settings: the topic prefix and the invoicing group's name.
        clients: the pool, Redis, the tax service and a consumer factory.
        mode: :attr:`Mode.DRY_RUN` (report only) or :attr:`Mode.APPLY`.
        margin: the re-read starts at ``period start - margin`` (record time);
            ignored when an apply resumes (the stored window is used).
        progress: rich progress bars on stderr.
        holder: the lease holder's name (default ``<host>:<pid>:replay``).
        lease_ttl_s: the lease's TTL in seconds (renewed every third of it).
        lease_key_prefix: Redis key prefix of the lease (tests use their own).
        on_step: test hook, see :data:`StepHook`.
        candidate: rate under this unpublished price book instead of the published
            one (dry run only: an apply issues under published versions).

    Raises:
        InvalidPeriod: ``period`` is not ``YYYY-MM``.
        LeaseUnavailable / LeaseBusy: Redis down or another replay of the period
            runs; nothing was read or written.
        ReplayAborted: the lease was lost or fenced part-way.
        ReplayUnavailable: Kafka did not answer or the re-read stalled.
        ReplayStateError: the stored unfinished run is for another topic, or a
            candidate book was given to an apply.
        psycopg.Error, LeaseStoreError: the database failed.
        PriceBookError: the published entries do not make a valid book.
    """
    started = time.monotonic()
    period = str(BillingPeriod.parse(period))
    if candidate is not None and mode is Mode.APPLY:
        raise ReplayStateError(
            "an apply issues invoices under the published price book only: publish the "
            "candidate first (invoicing plans publish FILE), then run --apply without --price-book"
        )
    topic = ACCOUNT_EVENTS_TOPIC.with_prefix(settings.kafka.topic_prefix).name
    name = lease_name_for(period, settings)
    holder = holder or _default_holder()
    with clients.pool.connection() as conn:
        floor = fencing.lease_fence_floor(conn, name)
    lease = Lease.acquire(
        clients.redis, name, ttl_s=lease_ttl_s, holder=holder, floor=floor,
        key_prefix=lease_key_prefix,
    )  # fmt: skip
    try:
        report = _run(
            settings, period, mode, margin, topic, clients, lease, progress,
            on_step or (lambda stage, customer: None), started, candidate,
        )  # fmt: skip
    except BaseException:
        with contextlib.suppress(LeaseLost):  # reported by release(); keep the cause
            lease.release()
        raise
    try:
        lease.release()
    except LeaseLost as exc:
        # Every write was fenced and done before the lease ended: the run stands.
        logger.error(
            "replay %s run %s finished, but its lease ended before release (%s); every "
            "write was fenced, so no stale write was accepted",
            period,
            report.run_id,
            exc.reason,
        )
    return report


def _start(
    settings: Settings,
    period: str,
    mode: Mode,
    margin: timedelta,
    topic: str,
    pool: ConnectionPool[Any],
    new_consumer: ConsumerFactory,
    lease: Lease,
) -> tuple[rstore.RunRow, bool, Consumer, str | None]:
    """Resume the period's unfinished apply run, or plan and record a new run.

    Returns (run row, resumed?, the consumer of the run's group, an unfinished apply run
    id a dry run saw).
    """
    with pool.connection() as conn, conn.transaction():
        fencing.LeaseFence.of(lease).check(conn)
        open_run = rstore.open_apply_run(conn, period)
        if open_run is not None and mode is Mode.APPLY:
            if open_run.topic != topic:
                raise ReplayStateError(
                    f"the unfinished apply run {open_run.run_id} of {period} re-reads "
                    f"{open_run.topic}, not {topic}"
                )
            rstore.resume_run(
                conn, open_run.run_id, holder=lease.holder, lease_fencing_token=lease.fencing_token
            )
    if open_run is not None and mode is Mode.APPLY:
        with pool.connection() as conn:
            row = rstore.get_run(conn, open_run.run_id)
        assert row is not None  # locked and updated just now
        logger.info(
            "replay %s: resuming apply run %s (attempt %d) over its stored window",
            period,
            row.run_id,
            row.attempts,
        )
        consumer = new_consumer(row.consumer_group, **{"enable.partition.eof": True})
        return row, True, consumer, None
    run_id = uuid.uuid4().hex[:12]
    group = consumer_group_for(period, run_id, settings)
    consumer = new_consumer(group, **{"enable.partition.eof": True})
    try:
        since = BillingPeriod.parse(period).start - margin
        window = plan_window(consumer, topic, since)
        with pool.connection() as conn, conn.transaction():
            fencing.LeaseFence.of(lease).check(conn)
            try:
                rstore.insert_run(
                    conn,
                    run_id=run_id,
                    billing_period=period,
                    mode=str(mode),
                    topic=topic,
                    consumer_group=group,
                    window_start=since,
                    start_offsets=Window.offsets_json(window.start),
                    end_offsets=Window.offsets_json(window.end),
                    holder=lease.holder,
                    lease_fencing_token=lease.fencing_token,
                )
            except psycopg.errors.UniqueViolation as exc:
                raise ReplayStateError(
                    f"an apply run of {period} is already running (the lease should prevent this)"
                ) from exc
            row = rstore.get_run(conn, run_id)
    except BaseException:
        consumer.close()
        raise
    assert row is not None
    return row, False, consumer, open_run.run_id if open_run is not None else None


def _run(
    settings: Settings,
    period: str,
    mode: Mode,
    margin: timedelta,
    topic: str,
    clients: ReplayClients,
    lease: Lease,
    progress: bool,
    on_step: StepHook,
    started: float,
    candidate: CandidateBook | None,
) -> ReplayReport:
    pool = clients.pool
    try:
        row, resumed, consumer, open_apply = _start(
            settings, period, mode, margin, topic, pool, clients.new_consumer, lease
        )
    except (LeaseLost, LeaseFenced) as exc:
        raise ReplayAborted(f"replay {period} aborted before it began: {exc}", run_id="") from exc
    window = Window(
        topic=topic,
        since=row.window_start,
        start=Window.offsets_from_json(row.start_offsets),
        end=Window.offsets_from_json(row.end_offsets),
    )
    report = ReplayReport(
        run_id=row.run_id,
        period=period,
        mode=mode,
        resumed=resumed,
        attempt=row.attempts,
        topic=topic,
        consumer_group=row.consumer_group,
        window=window,
        lease_name=lease.name,
        holder=lease.holder,
        fencing_token=lease.fencing_token,
        open_apply_run=open_apply,
    )
    rebuild = PeriodRebuild(period)
    ctx = ReplayContext(
        settings=settings,
        period=period,
        mode=mode,
        topic=topic,
        invoices_topic=INVOICES_TOPIC.with_prefix(settings.kafka.topic_prefix).name,
        pool=pool,
        tax=clients.tax,
        lease=lease,
        run_id=row.run_id,
        window=window,
        rebuild=rebuild,
        on_step=on_step,
    )
    try:
        with progress_bars(progress) as bar:
            stats = _reread(consumer, window, rebuild, lease, bar, period)
            report.events_read, report.read_s = stats.records, stats.seconds
            report.usage_events = rebuild.usage_events
            report.metered_events = rebuild.metered_events
            report.duplicates = rebuild.duplicates
            report.conflicts = list(rebuild.conflicts)
            report.invalid = list(rebuild.invalid)
            logger.info(
                "replay %s run %s: re-read %d records in %.2fs (%.0f events/s): %d usage events "
                "of the period, %d duplicates, %d conflicts, %d invalid",
                period,
                row.run_id,
                stats.records,
                stats.seconds,
                stats.per_second,
                rebuild.usage_events,
                rebuild.duplicates,
                len(rebuild.conflicts),
                len(rebuild.invalid),
            )
            on_step("read", "")
            _load_state(ctx, clients.new_consumer, candidate)
            report.price_book = ctx_book_label(ctx, candidate)
            previous: dict[str, rstore.ResultRow] = {}
            if resumed:
                with pool.connection() as conn:
                    previous = rstore.results(conn, row.run_id)
            subscribed = {
                customer
                for customer in set(ctx.stored_subscriptions) | rebuild.subscribed_customers
                if subscribed_in_period(ctx, customer)
            }
            todo = sorted(
                set(ctx.usage) | set(ctx.metered) | subscribed | set(ctx.issued) | set(previous)
            )
            task = (
                bar.add_task(f"{mode} {period}", total=len(todo), unit="customers") if bar else None
            )

            def advance() -> None:
                if bar is not None and task is not None:
                    bar.advance(task)

            report.outcomes.extend(
                compare_customers(
                    ctx, todo, previous, workers=settings.tax.max_concurrency, advance=advance
                )
            )
    except (LeaseLost, LeaseFenced) as exc:
        _leave(ctx, report, f"{type(exc).__name__}: {exc}", started)
        raise ReplayAborted(
            f"replay {period} run {row.run_id} aborted after {len(report.outcomes)} customers: "
            f"{exc}" + ("; the next --apply resumes it" if mode is Mode.APPLY else ""),
            run_id=row.run_id,
        ) from exc
    except BaseException as exc:
        _leave(ctx, report, f"{type(exc).__name__}: {exc}", started)
        raise
    finally:
        consumer.close()
    report.elapsed_s = time.monotonic() - started
    report.status = "completed" if report.complete or mode is Mode.DRY_RUN else "running"
    left = [o.customer_id for o in report.failed if o.transient]
    with pool.connection() as conn, conn.transaction():
        fencing.LeaseFence.of(lease).check(conn)
        rstore.finish_run(
            conn,
            row.run_id,
            status=report.status,
            events_read=report.events_read,
            summary=report.summary(),
            error=f"{len(left)} customer(s) failed transiently: {', '.join(left[:10])}"
            if left
            else None,
        )
    return report


def _leave(ctx: ReplayContext, report: ReplayReport, error: str, started: float) -> None:
    """Best effort, on the way out of a failed run: record the error. An apply stays
    ``running`` (the next --apply resumes it); a dry run is ``failed``."""
    report.elapsed_s = time.monotonic() - started
    report.status = "running" if ctx.apply else "failed"
    try:
        with ctx.pool.connection() as conn, conn.transaction():
            fencing.LeaseFence.of(ctx.lease).check(conn)
            rstore.finish_run(
                conn,
                ctx.run_id,
                status=report.status,
                events_read=report.events_read or None,
                summary=report.summary(),
                error=error[:2000],
            )
    except Exception as exc:  # the original failure matters more than this record of it
        logger.warning("replay run %s: recording its failure failed: %s", ctx.run_id, exc)


def _reread(
    consumer: Consumer,
    window: Window,
    rebuild: PeriodRebuild,
    lease: Lease,
    bar: Progress | None,
    period: str,
) -> ReadStats:
    def on_record(record: Record) -> None:
        at = Coordinates(record.topic, record.partition, record.offset)
        fast = decode_usage(record.key, record.value, record.headers)
        if fast is not None and record.value is not None:  # the worker's fast path
            rebuild.add_fast_usage(fast, record.value, at)
            return
        try:
            envelope = decode(record.key, record.value, record.headers, allowed=ACCOUNT_EVENTS)
            rebuild.add(envelope, at)
        except InvalidEvent as exc:
            rebuild.add_invalid(at, record.key, exc.reason)
        except Exception as exc:
            # One bad record never aborts a replay (docs/design.md, invariant 5): a failure that is
            # the record's own (streams/core/billing/failures.py) makes it an invalid record of the
            # report, as the workers dead-lettered it; anything else ends the run.
            failure = classify(exc)
            if not failure.permanent:
                raise
            rebuild.add_invalid(at, record.key, failure.reason)

    return read_window(
        consumer,
        window,
        on_record,
        check=lease.ensure_held,
        progress=bar,
        description=f"re-read {window.topic} for {period}",
    )


def compare_customers(
    ctx: ReplayContext,
    customers: list[str],
    previous: dict[str, rstore.ResultRow],
    *,
    workers: int,
    advance: Callable[[], None],
) -> list[CustomerOutcome]:
    """The outcome of every customer of ``customers``, in their order.

    A dry run compares up to ``workers`` customers at once (``tax.max_concurrency``,
    as the worker's jobs quote tax): it writes nothing, and every customer's
    comparison reads its own rows and asks its own quote. An apply corrects one
    customer at a time: each correction is a transaction that serialises on the lease
    fence row and the numbering counters anyway, and a resumed run depends on the
    order in which customers were finished. The lease is checked before each customer.

    Raises:
        LeaseLost / LeaseFenced: the lease ended; outcomes finished so far are lost to
            the caller's report (a dry run has nothing to resume).
    """

    def one(customer: str) -> CustomerOutcome:
        ctx.lease.ensure_held()
        if customer in previous:
            outcome = outcome_from_stored(previous[customer])
        else:
            outcome = replay_customer(ctx, customer)
        advance()
        return outcome

    if ctx.apply or workers <= 1 or len(customers) <= 1:
        return [one(customer) for customer in customers]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replay-compare") as pool:
        return list(pool.map(one, customers))


def ctx_book_label(ctx: ReplayContext, candidate: CandidateBook | None) -> str:
    """How the report names the run's price book."""
    versions = sum(len(plan.versions) for plan in ctx.book.plans)
    what = f"{len(ctx.book.metrics)} metric(s), {versions} plan version(s)"
    return f"{candidate.label} ({what})" if candidate is not None else f"published ({what})"


def _load_state(
    ctx: ReplayContext, new_consumer: ConsumerFactory, candidate: CandidateBook | None
) -> None:
    """The issued state of the period, what the database knows about its customers, and
    the price book to rate under (the published one unless a candidate is given)."""
    ctx.usage = ctx.rebuild.usage_by_customer()
    ctx.metered = ctx.rebuild.metered_by_customer()
    with ctx.pool.connection() as conn, conn.transaction():
        ctx.issued = rstore.issued_invoices(conn, ctx.period, ctx.topic)
        ctx.revisions = store.invoices.revisions(conn, ctx.period, ctx.topic)
        ctx.held = store.holds.held_customers(conn, ctx.period)
        ctx.closed = store.closes.closed_customers(conn, ctx.period, ctx.topic)
        ctx.held_closes = store.closes.last_close_held(conn, ctx.period, ctx.topic)
        ctx.drafted = store.drafts.drafted_customers(conn, ctx.period, ctx.topic)
        ctx.stored_ids = store.usage.stored_usage_ids(conn, ctx.period, ctx.topic)
        ctx.stored_metered = store.metering.stored_metered_ids(conn, ctx.period, ctx.topic)
        ctx.metered_below = store.metering.metered_below(
            conn, ctx.period, ctx.topic, ctx.window.start
        )
        ctx.stored_subscriptions = store.metering.subscription_history(conn, ctx.topic)
        ctx.book = candidate.book if candidate is not None else store.pricing.published_book(conn)
        known = set(ctx.usage) | set(ctx.metered) | set(ctx.issued)
        known |= set(ctx.stored_subscriptions) | ctx.rebuild.subscribed_customers
        ctx.db_customers = store.usage.customers(conn, sorted(known))
    ctx.worker_next = worker_positions(
        new_consumer, ctx.settings.worker.invoicing_group, ctx.topic, sorted(ctx.window.end)
    )


def worker_positions(
    new_consumer: ConsumerFactory, group_id: str, topic: str, partitions: list[int]
) -> dict[int, int]:
    """partition → the offset the invoicing group ``group_id`` will handle next (its
    committed offset; partitions it never committed are absent). Reads the group's
    offsets without joining it.

    Raises:
        ReplayUnavailable: Kafka did not answer.
    """
    consumer = new_consumer(group_id)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    except KafkaException as exc:
        raise ReplayUnavailable(f"reading the invoicing group's offsets failed: {exc}") from exc
    finally:
        consumer.close()
    return {tp.partition: int(tp.offset) for tp in found if tp.error is None and tp.offset >= 0}
