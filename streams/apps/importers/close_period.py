"""``invoicing close-period YYYY-MM``: a ``billing_period.closed`` marker per customer with usage.

The marker tells the invoicing worker that owns the customer's partition to
build the invoice from the usage that precedes the marker on that partition
(docs/design.md "Topics" and invariant 3). Its event id is
:func:`streams.core.domain.events.close_marker_id` (customer, period), so a rerun
sends the same ids and the workers deduplicate.

Steps, in this order:

1. **Lease.** ``close-period:<period>`` (prefixed with ``settings.kafka.topic_prefix``,
   so that a test environment's topics have their own lease), TTL
   ``lease_ttl_s`` (default 30 s), renewed every TTL/3 by
   :class:`streams.adapters.lease.Lease`; the fencing counter is first raised
   above the highest number ``lease_fences`` recorded for it
   (:func:`~streams.core.billing.fencing.lease_fence_floor`). Redis down →
   :class:`~streams.adapters.lease.LeaseUnavailable` before anything is read or
   written (CLI exit 3); another run holds it →
   :class:`~streams.adapters.lease.LeaseBusy` naming that holder (exit 4). The
   lease is taken *before* the scan so that two runs never both scan, and so
   that a refused run costs nothing.
2. **Which customers** ("customers with usage in the period", and since rating
   also customers with metered usage of the period or a subscription in effect
   for a day of it: a subscriber owes its fixed fee without any usage).
   Decision: the union of two sources, because neither is complete alone.

   * *The topic, only what the workers have not stored.* The import's usage
     lives on Kafka and may not have reached the database yet. The run reads
     each partition from the later of ``offsets_for_times(period start -
     scan_margin)`` (default margin 7 days) and the invoicing workers'
     committed offset (``stored_offsets``: below it every record is stored or
     dead-lettered, since a worker commits offsets only after the database
     transaction that wrote them) to the end offsets read when the scan
     starts, with a consumer that joins no group and commits nothing (assign +
     seek; ``enable.auto.commit=false``; a unique group id). When the workers
     have caught up, as at a month-end close after the imports, it reads
     nothing: the command costs a few requests per partition and the database
     queries, whatever the topic holds (docs/decisions/0011-close-by-stored-offsets.md).
     It keeps the customers of every valid
     ``usage.recorded`` whose ``billing_period`` is the period and every
     ``usage.metered`` whose event time is in it, and the subscription events
     it reads. Record
     timestamps are produce times (the importers keep the client default), and
     usage is produced no earlier than it happens, so usage of the period is
     not before ``period start - margin`` in the log unless it was produced
     ahead of time.
   * *The database.* ``usage_lines`` and ``metered_usage`` rows of the period
     that the workers ingested **from the same topic** (``source_topic``), and
     the customers whose subscription history (``subscription_events`` with the
     scanned subscription events) puts a plan version on a day of the period:
     this covers usage and subscriptions produced before the scan window, and
     keeps a test's topic from picking up another environment's customers.
     Customers with an open hold of the period from the topic are added (a
     record of the period that a worker dead-lettered is in neither source).

   Records that do not decode are counted (the workers dead-letter them) and do
   not close anyone's period.
3. **Per chunk of customers** (:data:`CLOSE_BATCH`, 500), in customer id order:
   :meth:`Lease.ensure_held` (a lost lease stops the run), then one database
   transaction that checks the fence once
   (:func:`~streams.core.billing.fencing.request_closes`) and inserts every
   customer's ``close_requests(customer_id, billing_period, event_id,
   lease_fencing_token, requested_at)`` ``ON CONFLICT DO NOTHING`` in one
   statement; commit; then the chunk's markers are produced (a transaction per
   customer cost a commit per customer). A customer whose row already existed
   counts as *already requested*, and its marker is produced again (the first
   run may have crashed between commit and delivery) with the stored
   ``requested_at`` as ``closed_at`` and the stored fencing number, so every
   resend carries the same data under the same id.
4. **Flush** and check every delivery report; a failed delivery is in the
   summary (CLI exit 1), and a rerun resends.

A lease lost or fenced part-way (during the scan or between chunks) raises
:class:`CloseAborted` (CLI exit 5) after the markers of the customers already
committed are flushed; a rerun continues where it stopped (earlier customers
are "already requested"). A lease that ends after the last customer's write
(release finds it gone) is logged and counted by the lease library, and the
run still returns its summary: every write it made was fenced.

CLI exit codes: 0 done; 1 delivery failure, Kafka or database error; 2 invalid
period; 3 Redis unreachable (nothing emitted); 4 lease held by another run
(nothing emitted); 5 aborted part-way (lease lost or fenced).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from psycopg_pool import ConnectionPool
from rich.progress import Progress

from streams.adapters.kafka import offsets_for_times
from streams.adapters.lease import (
    DEFAULT_KEY_PREFIX,
    Lease,
    LeaseFenced,
    LeaseLost,
)
from streams.adapters.progress import progress_bar
from streams.apps.importers import ImporterError, KafkaUnavailable
from streams.apps.importers.focus_import import (
    FLUSH_TIMEOUT_S,
    DeliveryFailure,
    DeliveryTracker,
    account_events_topic,
    require_topic,
)
from streams.core.billing import fencing, store
from streams.core.billing.failures import classify
from streams.core.domain.codec import decode, encode, headers_dict
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import (
    BillingPeriodClosed,
    Envelope,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
    close_marker_id,
)
from streams.core.domain.fastcodec import decode_usage
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import segments_for
from streams.settings import Settings

logger = logging.getLogger(__name__)

__all__ = [
    "SOURCE",
    "CloseAborted",
    "ClosePeriodRun",
    "CloseSummary",
    "StoredOffsets",
    "close_period",
    "lease_name_for",
    "workers_committed",
]

#: CloudEvents ``source`` of the markers.
SOURCE = "/jobs/close-period"

#: Customers whose close requests one transaction records (step 3 of the module doc).
CLOSE_BATCH = 500

#: How far before the period's start the topic scan begins (see the module doc).
DEFAULT_SCAN_MARGIN = timedelta(days=7)

#: A scan that reads nothing for this long while records are still expected fails (seconds).
SCAN_STALL_S = 60.0


@dataclass(frozen=True)
class CloseSummary:
    """What a close-period run did.

    Attributes:
        period: the billing period, ``YYYY-MM``.
        topic: the account-events topic scanned and produced to.
        lease_name / holder / fencing_token: the lease the run held.
        customers: every customer whose period was closed, sorted.
        from_topic / from_db: customers found by the topic scan / in ``usage_lines``.
        scanned_records: records read by the scan; ``undecodable_records`` of them invalid.
        stored_records: records of the scan window below the invoicing workers' committed
            offsets, which the run did not read (their customers come from the database).
        newly_requested / already_requested: ``close_requests`` rows inserted / found.
        markers_produced: markers Kafka confirmed.
        delivery_failures: markers Kafka did not confirm.
        marker_ids: customer id → marker event id.
        elapsed_s: wall time of the run (seconds).
    """

    period: str
    topic: str
    lease_name: str
    holder: str
    fencing_token: int
    customers: tuple[str, ...]
    from_topic: int
    from_db: int
    scanned_records: int
    undecodable_records: int
    stored_records: int
    newly_requested: int
    already_requested: int
    markers_produced: int
    delivery_failures: tuple[DeliveryFailure, ...]
    marker_ids: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every customer's marker was delivered."""
        return not self.delivery_failures and self.markers_produced == len(self.customers)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (the CLI's ``--json``)."""
        return {
            "period": self.period,
            "topic": self.topic,
            "ok": self.ok,
            "lease": {
                "name": self.lease_name,
                "holder": self.holder,
                "fencing_token": self.fencing_token,
            },
            "customers": len(self.customers),
            "from_topic": self.from_topic,
            "from_db": self.from_db,
            "scanned_records": self.scanned_records,
            "undecodable_records": self.undecodable_records,
            "stored_records": self.stored_records,
            "newly_requested": self.newly_requested,
            "already_requested": self.already_requested,
            "markers_produced": self.markers_produced,
            "delivery_failures": [
                {"event_id": f.event_id, "customer_id": f.customer_id, "error": f.error}
                for f in self.delivery_failures
            ],
            "elapsed_s": round(self.elapsed_s, 3),
        }


class CloseAborted(ImporterError):
    """The run stopped part-way: the lease was lost or fenced (see ``__cause__``).

    ``summary`` tells how far it got; the markers of the customers it requested
    were flushed. A rerun continues (those customers are "already requested").
    """

    def __init__(self, message: str, *, summary: CloseSummary) -> None:
        super().__init__(message)
        self.summary = summary


def lease_name_for(period: str, settings: Settings) -> str:
    """``<topic_prefix>close-period:<period>``: one lease per period and environment."""
    return f"{settings.kafka.topic_prefix}close-period:{period}"


def _default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:close-period"


@dataclass
class _Scan:
    customers: set[str] = field(default_factory=set)
    #: customer → (partition, offset, event id, event) of the subscription events scanned
    subscriptions: dict[str, list[tuple[int, int, str, SubscriptionEvent]]] = field(
        default_factory=dict
    )
    records: int = 0
    undecodable: int = 0
    #: records of the window below the workers' committed offsets, not read
    stored: int = 0


#: (topic, partitions) → each partition's committed offset in the invoicing workers' group
#: (absent: none)
StoredOffsets = Callable[[str, list[int]], dict[int, int]]


def workers_committed(reader: Callable[[], Consumer]) -> StoredOffsets:
    """The :data:`StoredOffsets` of the group ``reader()`` names (its ``group.id``, the
    invoicing workers' ``worker.invoicing_group``): the consumer is built when the offsets
    are asked for, makes one OffsetFetch, and is closed. A reader joins no group and commits
    nothing (:func:`streams.adapters.kafka.reader_config`).

    Below a partition's committed offset every record is stored or dead-lettered: the
    worker commits offsets only after the database transaction that wrote (or
    dead-lettered) them (docs/conventions.md "One commit point").

    Raises:
        KafkaException: the group coordinator did not answer within 10 s.
    """

    def offsets(topic: str, partitions: list[int]) -> dict[int, int]:
        consumer = reader()
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}

    return offsets


def _scan_topic(
    consumer: Consumer,
    topic: str,
    period: BillingPeriod,
    margin: timedelta,
    lease: Lease,
    progress: Progress | None,
    stored_offsets: StoredOffsets | None = None,
) -> _Scan:
    """Customers with ``usage.recorded`` of ``period`` from ``period.start - margin``, or from
    the invoicing workers' committed offset where that is later (what precedes it is
    stored: :func:`_customers_in_db` finds it), to the end, read with ``consumer``
    (assigned here, closed at the end). Without ``stored_offsets``, or when the workers'
    offsets cannot be read, the whole window is read."""
    scan = _Scan()
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = sorted(metadata.topics[topic].partitions)
        start_ms = int((period.start - margin).timestamp() * 1000)
        starts = _offsets_for_times(
            consumer, [TopicPartition(topic, p, start_ms) for p in partitions]
        )
        stored = _read_stored(stored_offsets, topic, partitions)
        ends: dict[int, int] = {}
        assignment: list[TopicPartition] = []
        for tp in starts:
            if tp.error is not None:
                raise KafkaUnavailable(f"offsets_for_times on {topic}[{tp.partition}]: {tp.error}")
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10, cached=False
            )
            start = tp.offset if tp.offset >= 0 else high  # -1: nothing at or after the time
            through = min(stored.get(tp.partition, -1), high)
            if through > start:  # stored below ``through``: found in the database
                scan.stored += through - start
                start = through
            if start < high:
                ends[tp.partition] = high
                assignment.append(TopicPartition(topic, tp.partition, start))
        total = sum(ends[tp.partition] - tp.offset for tp in assignment)
        task = progress.add_task(f"scan {topic}", total=total) if progress else None
        logger.info(
            "close-period %s: scanning %d records of %s from %s (%d records below the "
            "workers' committed offsets are found in the database instead)",
            period,
            total,
            topic,
            (period.start - margin).isoformat(),
            scan.stored,
        )
        if not assignment:
            return scan
        consumer.assign(assignment)
        wanted = str(period)
        last_progress = time.monotonic()
        while ends:
            lease.ensure_held()
            messages = consumer.consume(500, timeout=1.0)
            if not messages and time.monotonic() - last_progress > SCAN_STALL_S:
                raise KafkaUnavailable(
                    f"scan of {topic} stalled for {SCAN_STALL_S}s with partitions "
                    f"{sorted(ends)} unfinished"
                )
            read = 0
            for msg in messages:
                err = msg.error()
                partition, offset = msg.partition(), msg.offset()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and partition is not None:
                        ends.pop(partition, None)
                        last_progress = time.monotonic()
                        continue
                    raise KafkaUnavailable(f"scan of {topic}[{partition}] failed: {err}")
                if partition is None or offset is None:
                    continue  # pragma: no cover - a record always has both
                end = ends.get(partition)
                if end is None or offset >= end:
                    continue  # produced after the scan began
                read += 1
                if offset >= end - 1:
                    ends.pop(partition)
                try:
                    customer = _billable_customer(msg, wanted, scan)
                except Exception as exc:
                    # One bad record never aborts a period's close (docs/design.md, invariant 5):
                    # what the codec refuses, or any failure that is the record's own
                    # (streams/core/billing/failures.py), is counted — the workers dead-letter it;
                    # only a failure of the scan itself ends the run.
                    failure = classify(exc)
                    if not (isinstance(exc, InvalidEvent) or failure.permanent):
                        raise
                    scan.undecodable += 1
                    continue
                if customer is not None:
                    scan.customers.add(customer)
            if read:
                scan.records += read
                last_progress = time.monotonic()
                if progress is not None and task is not None:
                    progress.advance(task, read)
        return scan
    finally:
        consumer.close()


def _read_stored(
    stored_offsets: StoredOffsets | None, topic: str, partitions: list[int]
) -> dict[int, int]:
    """The workers' committed offsets, or none (a whole-window scan) when they cannot be read."""
    if stored_offsets is None:
        return {}
    try:
        return stored_offsets(topic, partitions)
    except KafkaException as exc:
        logger.warning(
            "close-period: the invoicing workers' committed offsets on %s could not be read "
            "(%s); scanning the whole window instead",
            topic,
            exc,
        )
        return {}


def _offsets_for_times(consumer: Consumer, wanted: list[TopicPartition]) -> list[TopicPartition]:
    """:func:`streams.adapters.kafka.offsets_for_times`, with its failure as
    :class:`KafkaUnavailable`.

    Raises:
        KafkaUnavailable: the request failed, or leadership still settling after the retries.
    """
    topic = wanted[0].topic if wanted else "?"
    try:
        return offsets_for_times(consumer, wanted)
    except KafkaException as exc:
        raise KafkaUnavailable(f"offsets_for_times on {topic} failed: {exc}") from exc


_SCANNED = (
    UsageRecorded,
    UsageMetered,
    SubscriptionStarted,
    SubscriptionChanged,
    SubscriptionEnded,
)
_SCANNED_TYPES = frozenset(model.event_type for model in _SCANNED)


def _billable_customer(msg: Any, period: str, scan: _Scan) -> str | None:
    """The customer of a ``usage.recorded`` of ``period`` or a ``usage.metered`` whose
    event time is in it; None for any other event. A subscription event is kept in
    ``scan.subscriptions`` (whether it covers the period is decided with the stored
    history, :func:`_customers_in_db`).

    Raises:
        InvalidEvent: the record does not decode.
    """
    headers = msg.headers() or []
    fast = decode_usage(msg.key(), msg.value(), headers)  # the workers' fast path
    if fast is not None:
        return str(fast.values[0]) if fast.values[1] == period else None
    if headers_dict(headers).get("ce_type") not in _SCANNED_TYPES:
        return None
    envelope = decode(msg.key(), msg.value(), headers, allowed=_SCANNED)
    data = envelope.data
    if isinstance(data, UsageRecorded):
        return data.customer_id if data.billing_period == period else None
    if isinstance(data, UsageMetered):
        return data.customer_id if str(BillingPeriod.of(data.event_time)) == period else None
    if isinstance(data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded):
        scan.subscriptions.setdefault(data.customer_id, []).append(
            (int(msg.partition()), int(msg.offset()), envelope.id, data)
        )
    return None


def _customers_in_db(pool: ConnectionPool, period: str, topic: str, scan: _Scan) -> set[str]:
    """Customers of the period the database knows: usage lines, metered events, an open hold
    of the period (a record of it was dead-lettered), and a subscription in effect for a
    day of the period (the stored history and the
    scanned events together, deduplicated by event id, in partition order: a
    subscriber owes its fixed fee without any usage)."""
    with pool.connection() as conn:
        found = store.usage.customers_with_usage(conn, period, topic)
        found |= store.metering.customers_with_metered(conn, period, topic)
        found |= store.holds.customers_held_in_period(conn, period, topic)
        history = store.metering.subscription_history(conn, topic)
    billing_period = BillingPeriod.parse(period)
    for customer in set(history) | set(scan.subscriptions):
        events: dict[str, tuple[int, int, SubscriptionEvent]] = {
            stored.event_id: (stored.source.partition, stored.source.offset, stored.data)
            for stored in history.get(customer, [])
        }
        for partition, offset, event_id, data in scan.subscriptions.get(customer, []):
            events.setdefault(event_id, (partition, offset, data))
        ordered = [data for _, _, data in sorted(events.values(), key=lambda e: (e[0], e[1]))]
        if segments_for(billing_period, ordered):
            found.add(customer)
    return found


def _request_closes(
    pool: ConnectionPool, lease: Lease, period: str, event_ids: dict[str, str]
) -> dict[str, fencing.CloseRequest]:
    """One transaction: the lease fence check, then the close_requests rows of a chunk of
    customers (customer → marker event id). Returns customer → the stored request."""
    with pool.connection() as conn, conn.transaction():
        return fencing.request_closes(
            conn, fencing.LeaseFence.of(lease), period, list(event_ids.items())
        )


def close_period(
    period: str,
    settings: Settings,
    *,
    producer: Producer,
    redis_conn: redis.Redis,
    pool: ConnectionPool,
    scan_consumer: Callable[[], Consumer],
    lease_ttl_s: float = 30.0,
    progress: bool = True,
    holder: str | None = None,
    scan_margin: timedelta = DEFAULT_SCAN_MARGIN,
    lease_key_prefix: str = DEFAULT_KEY_PREFIX,
    stored_offsets: StoredOffsets | None = None,
) -> CloseSummary:
    """Close ``period`` for every customer with usage in it (see the module doc for the steps).

    Args:
        period: ``YYYY-MM``.
        settings: the topic prefix (topic and lease names).
        producer / redis_conn / pool: the clients to use (the caller keeps them;
            the producer is flushed, not closed).
        scan_consumer: builds the topic scan's consumer, one that joins no group
            and commits nothing, with ``enable.partition.eof``
            (:func:`streams.bootstrap.scan_consumer`); called once the lease is
            held, and the consumer is closed after the scan.
        lease_ttl_s: the lease's TTL in seconds (renewed every third of it).
        progress: rich progress bars on stderr.
        holder: the lease holder's name (default ``<host>:<pid>:close-period``).
        scan_margin: how far before the period's start the topic scan begins.
        lease_key_prefix: Redis key prefix of the lease (tests use their own).
        stored_offsets: the invoicing workers' committed offsets
            (:func:`workers_committed`); the scan starts at them where they are later
            than the window's start. None: the whole window is scanned.

    Returns:
        The :class:`CloseSummary`; check :attr:`CloseSummary.ok`.

    Raises:
        InvalidPeriod: ``period`` is not ``YYYY-MM``.
        LeaseUnavailable: Redis is unreachable; nothing was emitted.
        LeaseBusy: another run holds the lease (``.holder``); nothing was emitted.
        CloseAborted: the lease was lost or fenced part-way (``__cause__`` says
            which); the committed customers' markers were flushed.
        KafkaUnavailable / TopicMissing: Kafka or the topic is unavailable.
        LeaseStoreError, psycopg errors: the database failed.
    """
    started = time.monotonic()
    billing_period = BillingPeriod.parse(period)
    period = str(billing_period)
    topic = account_events_topic(settings)
    name = lease_name_for(period, settings)
    holder = holder or _default_holder()
    require_topic(producer, topic)
    with pool.connection() as conn:
        floor = fencing.lease_fence_floor(conn, name)
    lease = Lease.acquire(
        redis_conn,
        name,
        ttl_s=lease_ttl_s,
        holder=holder,
        floor=floor,
        key_prefix=lease_key_prefix,
    )
    try:
        with progress_bar(progress) as bar:
            summary = _run(
                lease, billing_period, topic, scan_consumer, producer, pool, bar, scan_margin,
                started, stored_offsets,
            )  # fmt: skip
    except BaseException:
        with contextlib.suppress(LeaseLost):  # reported by release(); keep the cause
            lease.release()
        raise
    try:
        lease.release()
    except LeaseLost as exc:
        # Every write was fenced and done before the lease ended: the run is complete.
        # The lease library logged and counted the incident; say what it means here.
        logger.error(
            "close-period %s completed, but its lease ended before release (%s); "
            "all %d close requests were fenced writes, so no stale write was accepted",
            period,
            exc.reason,
            len(summary.customers),
        )
    return summary


def _run(
    lease: Lease,
    period: BillingPeriod,
    topic: str,
    scan_consumer: Callable[[], Consumer],
    producer: Producer,
    pool: ConnectionPool,
    bar: Progress | None,
    scan_margin: timedelta,
    started: float,
    stored_offsets: StoredOffsets | None,
) -> CloseSummary:
    text = str(period)
    scan = _Scan()
    from_db: set[str] = set()
    customers: list[str] = []
    tracker = DeliveryTracker()
    marker_ids: dict[str, str] = {}
    new_count = 0

    def summary() -> CloseSummary:
        return CloseSummary(
            period=text,
            topic=topic,
            lease_name=lease.name,
            holder=lease.holder,
            fencing_token=lease.fencing_token,
            customers=tuple(customers),
            from_topic=len(scan.customers),
            from_db=len(from_db),
            scanned_records=scan.records,
            undecodable_records=scan.undecodable,
            stored_records=scan.stored,
            newly_requested=new_count,
            already_requested=len(marker_ids) - new_count,
            markers_produced=tracker.delivered[BillingPeriodClosed.event_type],
            delivery_failures=tuple(tracker.failures),
            marker_ids=dict(marker_ids),
            elapsed_s=time.monotonic() - started,
        )

    try:
        scan = _scan_topic(scan_consumer(), topic, period, scan_margin, lease, bar, stored_offsets)
        from_db = _customers_in_db(pool, text, topic, scan)
        customers = sorted(scan.customers | from_db)
        logger.info(
            "close-period %s: %d customers (%d from the topic, %d from usage_lines), lease %s "
            "fencing token %d",
            text,
            len(customers),
            len(scan.customers),
            len(from_db),
            lease.name,
            lease.fencing_token,
        )
        task = bar.add_task(f"close {text}", total=len(customers)) if bar else None
        for first in range(0, len(customers), CLOSE_BATCH):
            chunk = customers[first : first + CLOSE_BATCH]
            lease.ensure_held()
            event_ids = {customer: close_marker_id(customer, text) for customer in chunk}
            requested = _request_closes(pool, lease, text, event_ids)
            for customer in chunk:  # committed: now their markers
                request = requested[customer]
                new_count += request.new
                marker_ids[customer] = event_ids[customer]
                data = BillingPeriodClosed(
                    customer_id=customer,
                    billing_period=text,
                    closed_at=request.requested_at,
                    lease_fencing_token=request.lease_fencing_token,
                )
                envelope = Envelope.wrap(
                    data, id=event_ids[customer], source=SOURCE, time=request.requested_at
                )
                tracker.produce(producer, topic, encode(envelope), envelope, None)
            if bar is not None and task is not None:
                bar.advance(task, len(chunk))
    except (LeaseLost, LeaseFenced) as exc:
        tracker.flush(producer, FLUSH_TIMEOUT_S)
        raise CloseAborted(
            f"close-period {text} aborted after {len(marker_ids)} of {len(customers)} "
            f"customers: {exc}; rerun to continue (earlier customers are already requested)",
            summary=summary(),
        ) from exc
    finally:
        tracker.flush(producer, FLUSH_TIMEOUT_S)  # a no-op after the flush above
    result = summary()
    logger.info(
        "close-period %s: %d markers delivered (%d new, %d already requested), %d failures",
        text,
        result.markers_produced,
        result.newly_requested,
        result.already_requested,
        len(result.delivery_failures),
    )
    return result


class ClosePeriodRun(Protocol):
    """:func:`close_period` with its clients wired in by the composition root
    (:func:`streams.bootstrap.run_close_period`), for callers that run it on
    settings they make (the demo, the drill's sandbox)."""

    def __call__(
        self, period: str, settings: Settings, *, progress: bool = ...
    ) -> CloseSummary: ...
