"""``invoicing replay YYYY-MM --dry-run | --apply``: re-read a billing period and correct its invoices.

DESIGN §2 "Replay of a billing period"; the decisions are written down in
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
   captured now (:mod:`streams.replay.reader`).
3. **Re-read** the window with a progress bar (events/s), rebuilding the
   period's usage, customers and close markers (:mod:`streams.replay.rebuild`).
4. **Compare**, per customer with usage in the period or an issued invoice for
   it, in customer id order: the issued revision (``invoices`` +
   ``invoice_lines``) against the invoice recomputed from the rebuilt usage with
   :func:`~streams.domain.invoice.compute_invoice` (:mod:`streams.replay.diff`).
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
   back and compares again (at most :data:`MAX_CONFLICT_RETRIES` times).
6. **Finish**: the run ``completed``, or — an apply with customers that failed
   transiently (tax service or database unavailable) — left ``running`` for the
   next ``--apply`` to resume.

A dry run writes only its ``replay_runs`` row: nothing to the invoice tables,
no event, no email.

Exceptions: :class:`~streams.domain.errors.InvalidPeriod`;
:class:`~streams.adapters.lease.LeaseUnavailable` / ``LeaseBusy`` (nothing
done); :class:`~streams.replay.errors.ReplayAborted` (lease lost or fenced
part-way; an apply resumes); :class:`~streams.replay.errors.ReplayUnavailable`
(Kafka); ``psycopg`` errors (the database). Per-customer failures are results.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

import psycopg
import redis
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg_pool import ConnectionPool
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from streams import bootstrap
from streams.adapters.kafka import Record
from streams.adapters.lease import (
    DEFAULT_KEY_PREFIX,
    Lease,
    LeaseFenced,
    LeaseLost,
    LeaseStoreError,
)
from streams.adapters.tax import TaxRejected, TaxService, TaxUnavailable
from streams.billing import fencing, rows, store
from streams.billing.issuance import Issued, NotIssued, issue, tax_idempotency_key
from streams.domain.codec import decode
from streams.domain.errors import DomainError, InvalidEvent
from streams.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    UsageRecorded,
    deterministic_id,
    invoice_id_for,
)
from streams.domain.invoice import (
    InvoiceTotals,
    TaxedLine,
    UsageLine,
    apply_tax,
    price_invoice,
)
from streams.domain.periods import BillingPeriod
from streams.replay import store as rstore
from streams.replay.diff import CustomerDiff, IssuedInvoice, compare, lines_differ
from streams.replay.errors import ReplayAborted, ReplayStateError, ReplayUnavailable
from streams.replay.reader import EventsPerSecond, ReadStats, Window, plan_window, read_window
from streams.replay.rebuild import Conflict, Coordinates, InvalidRecord, PeriodRebuild
from streams.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MARGIN",
    "SOURCE",
    "CustomerOutcome",
    "Mode",
    "ReplayReport",
    "StepHook",
    "lease_name_for",
    "replay_period",
]

#: CloudEvents ``source`` of the events the replay publishes (through the outbox).
SOURCE = "/jobs/replay"
#: How far before the period's start the re-read begins (late events produced early, clock skew).
DEFAULT_MARGIN = timedelta(days=7)
#: Times a customer is compared again after a concurrent writer changed its invoice.
MAX_CONFLICT_RETRIES = 3

#: ``on_step(stage, customer_id)`` — a test hook called after the re-read
#: (``"read"``, customer ``""``), after a customer's tax document was committed
#: (``"taxed"``) and after its transaction committed (``"written"``). Whatever it
#: raises propagates (simulated crashes); it may block (simulated slow runs).
StepHook = Callable[[str, str], None]

ACCOUNT_EVENTS = (CustomerUpserted, UsageRecorded, BillingPeriodClosed)


class Mode(StrEnum):
    DRY_RUN = "dry_run"
    APPLY = "apply"


def lease_name_for(period: str, settings: Settings) -> str:
    """``<topic_prefix>replay:<period>``: one replay per period and environment."""
    return f"{settings.kafka.topic_prefix}replay:{period}"


def consumer_group_for(period: str, run_id: str, settings: Settings) -> str:
    """The replay's own consumer group: ``<topic_prefix>replay-<period>-<run id>``."""
    return f"{settings.kafka.topic_prefix}replay-{period}-{run_id}"


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CustomerOutcome:
    """What the run found (and, for an apply, did) for one customer.

    ``outcome``: ``unchanged``; ``difference`` (dry run); ``corrected`` (credit
    note + new revision) or ``invoiced`` (missing invoice issued as revision 1)
    (apply); ``skipped`` (``reason`` says why: held, not_closed, voided,
    incomplete_window); ``failed`` (``transient`` True: a resume retries it).
    ``difference`` is :meth:`CustomerDiff.to_json` (money as strings).
    ``previous_attempt``: recorded by an earlier attempt of a resumed run.
    """

    customer_id: str
    outcome: str
    reason: str = ""
    diff: CustomerDiff | None = None
    difference: dict[str, Any] | None = None
    transient: bool = False
    old_invoice_id: str | None = None
    new_invoice_id: str | None = None
    new_invoice_number: str | None = None
    revision: int | None = None
    credit_note_id: str | None = None
    credit_note_number: str | None = None
    previous_attempt: bool = False

    @property
    def is_difference(self) -> bool:
        return self.outcome in ("difference", "corrected", "invoiced")

    def to_json(self) -> dict[str, Any]:
        return {
            "customer_id": self.customer_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "transient": self.transient,
            "old_invoice_id": self.old_invoice_id,
            "new_invoice_id": self.new_invoice_id,
            "new_invoice_number": self.new_invoice_number,
            "revision": self.revision,
            "credit_note_id": self.credit_note_id,
            "credit_note_number": self.credit_note_number,
            "previous_attempt": self.previous_attempt,
            "difference": self.difference,
        }


def _from_stored(row: rstore.ResultRow) -> CustomerOutcome:
    detail = row.detail
    return CustomerOutcome(
        customer_id=row.customer_id,
        outcome=row.outcome,
        reason=str(detail.get("reason") or ""),
        difference=detail.get("difference"),
        old_invoice_id=row.old_invoice_id,
        new_invoice_id=row.new_invoice_id,
        new_invoice_number=detail.get("new_invoice_number"),
        revision=detail.get("revision"),
        credit_note_id=row.credit_note_id,
        credit_note_number=detail.get("credit_note_number"),
        previous_attempt=True,
    )


@dataclass
class ReplayReport:
    """The outcome of a run; :meth:`to_dict` is the JSON report.

    Times: ``read_s`` (the re-read), ``elapsed_s`` (the whole run), wall-clock seconds.
    """

    run_id: str
    period: str
    mode: Mode
    resumed: bool
    attempt: int
    topic: str
    consumer_group: str
    window: Window
    lease_name: str
    holder: str
    fencing_token: int
    status: str = "running"
    events_read: int = 0
    read_s: float = 0.0
    usage_events: int = 0
    duplicates: int = 0
    conflicts: list[Conflict] = field(default_factory=list)
    invalid: list[InvalidRecord] = field(default_factory=list)
    outcomes: list[CustomerOutcome] = field(default_factory=list)
    open_apply_run: str | None = None
    elapsed_s: float = 0.0

    @property
    def events_per_s(self) -> float:
        return self.events_read / self.read_s if self.read_s > 0 else 0.0

    @property
    def differences(self) -> list[CustomerOutcome]:
        return [o for o in self.outcomes if o.is_difference]

    @property
    def skipped(self) -> list[CustomerOutcome]:
        return [o for o in self.outcomes if o.outcome == "skipped"]

    @property
    def failed(self) -> list[CustomerOutcome]:
        return [o for o in self.outcomes if o.outcome == "failed"]

    @property
    def unchanged(self) -> int:
        return sum(1 for o in self.outcomes if o.outcome == "unchanged")

    @property
    def complete(self) -> bool:
        """True when nothing is left for a resume (no transient failure)."""
        return not any(o.transient for o in self.failed)

    def summary(self) -> dict[str, Any]:
        return {
            "customers": len(self.outcomes),
            "differences": len(self.differences),
            "unchanged": self.unchanged,
            "skipped": len(self.skipped),
            "failed": len(self.failed),
            "corrected": sum(1 for o in self.outcomes if o.outcome == "corrected"),
            "invoiced": sum(1 for o in self.outcomes if o.outcome == "invoiced"),
            "events_read": self.events_read,
            "read_s": round(self.read_s, 3),
            "events_per_s": round(self.events_per_s, 1),
            "elapsed_s": round(self.elapsed_s, 3),
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "period": self.period,
            "mode": str(self.mode),
            "status": self.status,
            "resumed": self.resumed,
            "attempt": self.attempt,
            "topic": self.topic,
            "consumer_group": self.consumer_group,
            "window": {
                "since": self.window.since.isoformat(),
                "partitions": {
                    str(p): {"start": s, "end": e} for p, (s, e) in self.window.bounds().items()
                },
                "records": self.window.total,
            },
            "lease": {
                "name": self.lease_name,
                "holder": self.holder,
                "fencing_token": self.fencing_token,
            },
            "open_apply_run": self.open_apply_run,
            "summary": self.summary(),
            "usage_events": self.usage_events,
            "duplicates": self.duplicates,
            "conflicts": [
                {
                    "event_id": c.event_id,
                    "customer_id": c.customer_id,
                    "billing_period": c.billing_period,
                    "kept": {"partition": c.kept.partition, "offset": c.kept.offset},
                    "dropped": {"partition": c.dropped.partition, "offset": c.dropped.offset},
                }
                for c in self.conflicts
            ],
            "invalid_records": [
                {
                    "partition": r.at.partition,
                    "offset": r.at.offset,
                    "customer_id": r.customer_id,
                    "reason": r.reason,
                }
                for r in self.invalid
            ],
            "differences": [o.to_json() for o in self.differences],
            "skipped": [o.to_json() for o in self.skipped],
            "failed": [o.to_json() for o in self.failed],
        }


# --------------------------------------------------------------------------- the run


class _Changed(Exception):
    """The customer's invoice changed between the comparison and the write: compare again."""


@dataclass
class _Context:
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
    stored_ids: set[str] = field(default_factory=set)
    db_customers: dict[str, rows.Customer] = field(default_factory=dict)
    #: partition → the invoicing group's committed offset (the next record it will handle)
    worker_next: dict[int, int] = field(default_factory=dict)

    @property
    def apply(self) -> bool:
        return self.mode is Mode.APPLY


def _default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:replay"


@contextmanager
def _progress(enabled: bool) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    bar = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        EventsPerSecond(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
    )
    with bar:
        yield bar


def replay_period(
    period: str,
    settings: Settings,
    *,
    mode: Mode,
    margin: timedelta = DEFAULT_MARGIN,
    pool: ConnectionPool[Any] | None = None,
    redis_conn: redis.Redis | None = None,
    tax: TaxService | None = None,
    progress: bool = True,
    holder: str | None = None,
    lease_ttl_s: float = 30.0,
    lease_key_prefix: str = DEFAULT_KEY_PREFIX,
    on_step: StepHook | None = None,
) -> ReplayReport:
    """Replay ``period`` (see the module doc for the steps) and return its report.

    Args:
        period: ``YYYY-MM``.
        settings: topic prefix and the settings of whatever is not passed in.
        mode: :attr:`Mode.DRY_RUN` (report only) or :attr:`Mode.APPLY`.
        margin: the re-read starts at ``period start - margin`` (record time);
            ignored when an apply resumes (the stored window is used).
        pool / redis_conn / tax: clients to use (the caller keeps them); default:
            built by :mod:`streams.bootstrap` and closed at the end.
        progress: rich progress bars on stderr.
        holder: the lease holder's name (default ``<host>:<pid>:replay``).
        lease_ttl_s: the lease's TTL in seconds (renewed every third of it).
        lease_key_prefix: Redis key prefix of the lease (tests use their own).
        on_step: test hook, see :data:`StepHook`.

    Raises:
        InvalidPeriod: ``period`` is not ``YYYY-MM``.
        LeaseUnavailable / LeaseBusy: Redis down or another replay of the period
            runs; nothing was read or written.
        ReplayAborted: the lease was lost or fenced part-way.
        ReplayUnavailable: Kafka did not answer or the re-read stalled.
        ReplayStateError: the stored unfinished run is for another topic.
        psycopg.Error, LeaseStoreError: the database failed.
    """
    started = time.monotonic()
    period = str(BillingPeriod.parse(period))
    prefix = settings.kafka.topic_prefix
    topic = prefix + "billing.account-events.v1"
    name = lease_name_for(period, settings)
    holder = holder or _default_holder()
    with ExitStack() as owned:
        if pool is None:
            pool = bootstrap.postgres_pool(settings, name="replay", min_size=1, max_size=2)
            owned.callback(pool.close)
        if redis_conn is None:
            redis_conn = bootstrap.redis_client(settings)
            owned.callback(redis_conn.close)
        if tax is None:
            http_tax = bootstrap.tax_service(settings, redis_conn)
            owned.callback(http_tax.close)
            tax = http_tax
        with pool.connection() as conn:
            floor = fencing.lease_fence_floor(conn, name)
        lease = Lease.acquire(
            redis_conn, name, ttl_s=lease_ttl_s, holder=holder, floor=floor,
            key_prefix=lease_key_prefix,
        )  # fmt: skip
        try:
            report = _run(
                settings, period, mode, margin, topic, pool, tax, lease, progress,
                on_step or (lambda stage, customer: None), started,
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
        consumer = bootstrap.consumer(
            settings, row.consumer_group, **{"enable.partition.eof": True}
        )
        return row, True, consumer, None
    run_id = uuid.uuid4().hex[:12]
    group = consumer_group_for(period, run_id, settings)
    consumer = bootstrap.consumer(settings, group, **{"enable.partition.eof": True})
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
    pool: ConnectionPool[Any],
    tax: TaxService,
    lease: Lease,
    progress: bool,
    on_step: StepHook,
    started: float,
) -> ReplayReport:
    try:
        row, resumed, consumer, open_apply = _start(
            settings, period, mode, margin, topic, pool, lease
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
    ctx = _Context(
        settings=settings,
        period=period,
        mode=mode,
        topic=topic,
        invoices_topic=settings.kafka.topic_prefix + "billing.invoices.v1",
        pool=pool,
        tax=tax,
        lease=lease,
        run_id=row.run_id,
        window=window,
        rebuild=rebuild,
        on_step=on_step,
    )
    try:
        with _progress(progress) as bar:
            stats = _reread(consumer, window, rebuild, lease, bar, period)
            report.events_read, report.read_s = stats.records, stats.seconds
            report.usage_events = rebuild.usage_events
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
            _load_state(ctx)
            previous: dict[str, rstore.ResultRow] = {}
            if resumed:
                with pool.connection() as conn:
                    previous = rstore.results(conn, row.run_id)
            todo = sorted(set(ctx.usage) | set(ctx.issued) | set(previous))
            task = (
                bar.add_task(f"{mode} {period}", total=len(todo), unit="customers") if bar else None
            )
            for customer in todo:
                lease.ensure_held()
                if customer in previous:
                    report.outcomes.append(_from_stored(previous[customer]))
                else:
                    report.outcomes.append(_customer(ctx, customer))
                if bar is not None and task is not None:
                    bar.advance(task)
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


def _leave(ctx: _Context, report: ReplayReport, error: str, started: float) -> None:
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
        try:
            envelope = decode(record.key, record.value, record.headers, allowed=ACCOUNT_EVENTS)
        except InvalidEvent as exc:
            rebuild.add_invalid(at, record.key, exc.reason)
            return
        rebuild.add(envelope, at)

    return read_window(
        consumer,
        window,
        on_record,
        check=lease.ensure_held,
        progress=bar,
        description=f"re-read {window.topic} for {period}",
    )


def _load_state(ctx: _Context) -> None:
    """The issued state of the period and what the database knows about its customers."""
    ctx.usage = ctx.rebuild.usage_by_customer()
    with ctx.pool.connection() as conn, conn.transaction():
        ctx.issued = rstore.issued_invoices(conn, ctx.period, ctx.topic)
        ctx.revisions = store.invoices.revisions(conn, ctx.period, ctx.topic)
        ctx.held = store.holds.held_customers(conn, ctx.period)
        ctx.closed = store.closes.closed_customers(conn, ctx.period, ctx.topic)
        ctx.stored_ids = store.usage.stored_usage_ids(conn, ctx.period, ctx.topic)
        ctx.db_customers = store.usage.customers(conn, sorted(set(ctx.usage) | set(ctx.issued)))
    ctx.worker_next = worker_positions(ctx.settings, ctx.topic, sorted(ctx.window.end))


def worker_positions(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    """partition → the offset the invoicing group will handle next (its committed offset;
    partitions it never committed are absent). Reads the group's offsets without joining it.

    Raises:
        ReplayUnavailable: Kafka did not answer.
    """
    consumer = bootstrap.consumer(settings, settings.worker.invoicing_group)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
    except KafkaException as exc:
        raise ReplayUnavailable(f"reading the invoicing group's offsets failed: {exc}") from exc
    finally:
        consumer.close()
    return {tp.partition: int(tp.offset) for tp in found if tp.error is None and tp.offset >= 0}


def _identity(ctx: _Context, customer_id: str) -> rows.Customer | None:
    """Who the invoice is for: the latest ``customer.upserted`` in the window (so a resumed
    run sees the same), else the stored customer row."""
    upserted = ctx.rebuild.customer(customer_id)
    if upserted is not None:
        return rows.Customer(upserted.customer_id, upserted.name, upserted.email, upserted.currency)
    return ctx.db_customers.get(customer_id)


def _customer(ctx: _Context, customer_id: str) -> CustomerOutcome:
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
        except (TaxRejected, DomainError) as exc:
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
    ctx: _Context,
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


def _record(ctx: _Context, outcome: CustomerOutcome) -> None:
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
    ctx: _Context,
    customer_id: str,
    currency: str,
    lines: list[UsageLine],
    invoice_id: str,
    revision: int,
    *,
    commit: bool,
) -> tuple[list[TaxedLine], InvoiceTotals]:
    """Price ``lines``, then tax them under ``<invoice id>:r<revision>``.

    The pricing rules (currency, duplicates, subtotal) run before the tax call, as in
    the invoicing worker (:mod:`streams.invoicing.jobs`): a committed tax document
    keeps its idempotency key, so data refused after the call could never be taxed
    again under that key once corrected.

    Raises:
        DomainError: the lines break an invoice rule (nothing was sent to the tax
            service), or the tax answers are malformed.
        TaxError: the tax service failed or refused (see :mod:`streams.adapters.tax`).
    """
    priced = price_invoice(lines, currency=currency)
    taxed = ctx.tax.calculate(
        idempotency_key=tax_idempotency_key(invoice_id, revision),
        customer_id=customer_id,
        currency=currency,
        lines=[line.tax_line() for line in priced.lines],
        commit=commit,
    )
    return taxed, apply_tax(priced, taxed)


def _compare_and_apply(ctx: _Context, customer_id: str) -> CustomerOutcome:
    lines = ctx.usage.get(customer_id, [])
    issued = ctx.issued.get(customer_id)
    if customer_id in ctx.held:
        return _skip(ctx, customer_id, "held: the customer has an unreleased invoice hold")
    if issued is None:
        if not lines:  # nothing issued, nothing used (e.g. a revision issued concurrently vanished)
            return CustomerOutcome(customer_id, "unchanged")
        if ctx.revisions.get(customer_id, 0) > 0:
            return _skip(
                ctx, customer_id, "voided: no issued revision; a replay does not reissue a void"
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
    differ = lines_differ(issued, lines)
    commit = ctx.apply and differ
    taxed, totals = _tax(ctx, customer_id, currency, lines, new_id, revision, commit=commit)
    diff = compare(
        customer_id=customer_id,
        billing_period=ctx.period,
        issued=issued,
        lines=lines,
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
        taxed, totals = _tax(ctx, customer_id, currency, lines, new_id, revision, commit=True)
        diff = compare(
            customer_id=customer_id,
            billing_period=ctx.period,
            issued=issued,
            lines=lines,
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
    outcome = _write(ctx, identity, issued, revision, new_id, lines, taxed, totals, diff)
    ctx.on_step("written", customer_id)
    return outcome


class _NoCustomer(DomainError):
    """No ``customer.upserted`` in the window and no stored customer row."""

    def __init__(self, customer_id: str) -> None:
        super().__init__(
            f"customer {customer_id!r} has no customer.upserted in the window and no stored row"
        )


def _write(
    ctx: _Context,
    identity: rows.Customer,
    issued: IssuedInvoice | None,
    revision: int,
    new_id: str,
    lines: list[UsageLine],
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
    partition = (
        lines[0].source_partition
        if lines
        else (issued.source_partition if issued is not None else 0)
    )
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


def _restore_lost_usage(ctx: _Context, conn: psycopg.Connection[Any], diff: CustomerDiff) -> None:
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
