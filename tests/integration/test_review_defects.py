"""Seven defects found in a review of the pipeline, each pinned by a test.

Each test was run against the code before its fix and failed there (see the
commit that fixes it). They run in-process against a fresh, migrated PostgreSQL
database of the real stack (and, where a producer is needed, its Kafka); the
invoicing worker is built with an unsubscribed consumer, so its loop's pieces
can be driven one by one.

1. A fence claim refused after a database error was retried, logged as an
   ALERT and counted on every poll, for ever.
2. SIGTERM with more invoice jobs queued than the pool runs raised
   ``CancelledError`` out of the shutdown, before the consumer was closed.
3. A PostgreSQL outage held the poll thread (each claim waited the pool's
   30 s), and a dead-letter produce was flushed inside the transaction holding
   the partition's fence row.
4. Usage of a customer on another partition than its close marker was left out
   of the invoice without a word.
5. The replay and the worker racing on revision 1 under one tax idempotency key:
   the loser's 409 held the customer for good (worker) or failed it (replay).
6. A replay priced through the Redis rate cache, so a rate change did not show.
7. ``"1.0"`` and ``"1.00"`` hashed as different payloads (a conflict, the
   customer held), though they are one amount.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from psycopg import sql
from psycopg_pool import ConnectionPool

from streams.adapters.kafka import ensure_topics, make_producer
from streams.adapters.memory.tax import InMemoryTaxService
from streams.adapters.postgres import migrate
from streams.apps.invoicing import dispatch as dispatch_module
from streams.apps.invoicing.jobs import JobContext, JobResult, Outcome, run_invoice_job
from streams.apps.invoicing.partitions import PartitionState
from streams.apps.invoicing.worker import InvoicingWorker
from streams.core.billing import fencing, rows, store
from streams.core.billing.rows import Record, payload_hash
from streams.core.domain.codec import encode
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded, invoice_id_for
from streams.core.domain.invoice import TaxLine
from streams.devtools.sandbox.pipeline import _drop_database
from streams.settings import Settings

TOPIC = "events"
PERIOD = "2025-01"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def db(settings: Settings, unique: str) -> Iterator[Settings]:
    """Settings whose database is a fresh one of this test, migrated to head."""
    database = f"inv_{unique}"
    with psycopg.connect(settings.postgres.dsn("provisioner"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(settings.postgres.owner.user)
            )
        )
    pg = settings.postgres.model_copy(update={"database": database})
    try:
        migrate.upgrade(pg)
        yield settings.model_copy(update={"postgres": pg})
    finally:
        _drop_database(settings.postgres, database)


@pytest.fixture
def pool(db: Settings) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(
        db.postgres.dsn("owner"), min_size=1, max_size=6, kwargs={"autocommit": False}
    ) as p:
        yield p


def customer(customer_id: str) -> CustomerUpserted:
    return CustomerUpserted(
        customer_id=customer_id,
        name="Customer",
        email=f"{customer_id}@example.test",
        currency="USD",
    )


def usage(customer_id: str, amount: str) -> UsageRecorded:
    return UsageRecorded(
        customer_id=customer_id,
        billing_period=PERIOD,
        amount=Decimal(amount),
        currency="USD",
        region_id="us-east-1",
        event_time=datetime(2025, 1, 15, tzinfo=UTC),
    )


def at(offset: int, partition: int = 0) -> rows.SourceCoordinates:
    return rows.SourceCoordinates(TOPIC, partition, offset)


class RecordingConsumer(Consumer):
    """A consumer that never joins a group and remembers whether it was closed."""

    closed = False

    def close(self, *args: Any, **kwargs: Any) -> None:
        RecordingConsumer.closed = True
        type(self).closed = True
        super().close(*args, **kwargs)


def make_worker(
    settings: Settings,
    pool: Any,
    unique: str,
    *,
    producer: Producer | None = None,
    max_jobs: int = 4,
    tax: InMemoryTaxService | None = None,
) -> InvoicingWorker:
    worker_settings = settings.worker.model_copy(
        update={"invoicing_group": f"g-{unique}", "max_jobs": max_jobs}
    )
    kafka = settings.kafka.model_copy(update={"topic_prefix": f"t{unique}."})
    the_settings = settings.model_copy(update={"worker": worker_settings, "kafka": kafka})
    consumer = RecordingConsumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"g-{unique}",
            "enable.auto.commit": False,
        }
    )
    return InvoicingWorker(
        the_settings,
        pool=cast(ConnectionPool[Any], pool),
        tax=tax or InMemoryTaxService(),
        consumer=consumer,
        producer=producer or make_producer(settings.kafka),
    )


def token_of(worker: InvoicingWorker, partition: int, generation: int = 5) -> fencing.FencingToken:
    return fencing.FencingToken(worker.group_id, worker.topic, partition, generation, "member-a")


class FlakyPool:
    """A pool whose first ``failures`` ``connection()`` calls fail like a database outage."""

    def __init__(self, pool: ConnectionPool[Any], failures: int) -> None:
        self.pool = pool
        self.failures = failures

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        if self.failures > 0:
            self.failures -= 1
            raise psycopg.OperationalError("connection refused (simulated outage)")
        with self.pool.connection(timeout=timeout) as conn:
            yield conn


# --------------------------------------------------------------------------- 1


def test_1_a_claim_refused_after_a_database_error_is_reported_once(
    db: Settings, pool: ConnectionPool[Any], unique: str
) -> None:
    worker = make_worker(db, FlakyPool(pool, failures=1), unique)
    token = token_of(worker, 3, generation=5)
    with pool.connection() as conn:  # a newer owner already holds the partition
        fencing.claim(conn, fencing.FencingToken(token.group_id, token.topic, 3, 9, "member-b"))
    worker._claim(token)  # the database error: pending
    deadline = time.monotonic() + 15
    while worker.stats["claims_refused"] == 0 and time.monotonic() < deadline:
        worker._retry_claims()  # the polls after the database is back: refused once ...
        time.sleep(0.05)
    for _ in range(20):  # ... and never again
        worker._retry_claims()
        time.sleep(0.05)
    assert worker.stats["claims_refused"] == 1, (
        f"a refused claim was retried and alerted {worker.stats['claims_refused']} times"
    )
    state = worker.partitions[3]
    assert state.pending_claim is None and not state.owned


# --------------------------------------------------------------------------- 2


def test_2_shutdown_with_queued_jobs_closes_the_consumer(
    db: Settings, pool: ConnectionPool[Any], unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []

    def slow_job(
        ctx: JobContext,
        marker: rows.CloseMarker,
        token: fencing.FencingToken,
        cancel: threading.Event,
    ) -> JobResult:
        started.append(marker.customer_id)
        cancel.wait(60)  # a slow tax call that only a cancel ends
        return JobResult(marker, token, Outcome.CANCELLED, "cancelled")

    monkeypatch.setattr(dispatch_module, "run_invoice_job", slow_job)
    worker = make_worker(db, pool, unique, max_jobs=1)
    worker.shutdown_grace_s = 1.0
    RecordingConsumer.closed = False
    for partition in range(3):  # one job runs, two wait in the pool's queue
        token = token_of(worker, partition)
        worker.partitions[partition] = PartitionState(partition, token=token)
        marker = rows.CloseMarker(
            f"m-{partition}", f"c-{partition}", PERIOD, "period_closed", at(7, partition)
        )
        worker._start_job(partition, token, [marker])
    worker.stop.set()
    failure: list[BaseException] = []

    def shut_down() -> None:
        try:
            worker._shutdown()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=shut_down)
    thread.start()
    thread.join(90)
    assert not thread.is_alive(), "shutdown did not finish"
    assert not failure, f"shutdown raised {failure[0]!r} before closing the consumer"
    assert RecordingConsumer.closed, "the consumer was not closed (no LeaveGroup)"


# --------------------------------------------------------------------------- 3


def test_3a_a_database_outage_does_not_hold_the_poll_thread(db: Settings, unique: str) -> None:
    from streams.devtools.sandbox.smtp import free_port

    down = db.postgres.model_copy(update={"port": free_port()})  # nothing listens there
    dead_pool: ConnectionPool[Any] = ConnectionPool(
        down.dsn("owner"), min_size=1, max_size=2, open=False, kwargs={"autocommit": False}
    )
    dead_pool.open(wait=False)
    try:
        worker = make_worker(db, dead_pool, unique)
        done = threading.Event()
        took: list[float] = []

        def assign_twelve() -> None:  # what on_assign does for a whole assignment
            started = time.monotonic()
            for partition in range(12):
                worker._claim(token_of(worker, partition))
            took.append(time.monotonic() - started)
            done.set()

        threading.Thread(target=assign_twelve, daemon=True).start()
        assert done.wait(15), (
            "claiming 12 partitions with the database down held the poll thread for more "
            "than 15 s (max.poll.interval.ms is 60 s by default)"
        )
        assert all(worker.partitions[p].claiming for p in range(12))
        print(f"12 claims with the database down took {took[0]:.2f}s")
    finally:
        dead_pool.close(timeout=1)


class FenceProbeProducer(Producer):
    """Records, at every produce, whether a transaction holds a partition fence row."""

    def __init__(self, config: dict[str, Any], dsn: str) -> None:
        super().__init__(config)
        self.dsn = dsn
        self.fence_held_while_producing: list[int] = []

    def produce(self, *args: Any, **kwargs: Any) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute(
                """SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                    WHERE c.relname = 'partition_fences' AND l.pid <> pg_backend_pid()
                      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
            ).fetchone()
        self.fence_held_while_producing.append(int(row[0]) if row else 0)
        super().produce(*args, **kwargs)


def test_3b_no_dead_letter_is_produced_inside_a_fenced_transaction(
    db: Settings, pool: ConnectionPool[Any], unique: str
) -> None:
    from streams.adapters.kafka import producer_config, topic_specs

    prefix = f"t{unique}."
    kafka = db.kafka.model_copy(update={"topic_prefix": prefix})
    ensure_topics(kafka, topic_specs(kafka))
    producer = FenceProbeProducer(producer_config(db.kafka), db.postgres.dsn("owner"))
    worker = make_worker(db, pool, unique, producer=producer)
    token = token_of(worker, 0)
    with pool.connection() as conn:
        fencing.claim(conn, token)
    worker.partitions[0] = PartitionState(0, token=token)

    def record(offset: int, amount: str) -> Record:
        data = usage(f"c-{unique}", amount)
        enc = encode(Envelope.wrap(data, id="same-event-id", source="/t"))
        return Record(worker.topic, 0, offset, enc.key, enc.value, enc.headers)

    worker._handle_partition(0, [record(0, "1.50")])
    worker._handle_partition(0, [record(1, "2.50")])  # same id, another amount: a conflict
    worker._end_backoffs()
    assert producer.fence_held_while_producing, "the conflict was not dead-lettered"
    assert producer.fence_held_while_producing == [0] * len(producer.fence_held_while_producing), (
        "a dead letter was produced while a transaction held the partition's fence row"
    )


# --------------------------------------------------------------------------- 4


def test_4_usage_on_another_partition_than_the_close_marker_is_never_left_out(
    pool: ConnectionPool[Any], unique: str
) -> None:
    cust = f"c-{unique}"
    token = fencing.FencingToken(f"g-{unique}", TOPIC, 5, 1, "member-1")
    tax = InMemoryTaxService()
    with pool.connection() as conn:
        fencing.claim(conn, token)
        with conn.transaction():
            store.usage.upsert_customer(conn, "cu-1", customer(cust), at(0, 5))
            store.usage.insert_usage(
                conn,
                [
                    # read from partition 2 before the topic gained partitions ...
                    rows.UsageRecord("u-old", usage(cust, "10.00"), at(40, 2)),
                    # ... and from partition 5 since
                    rows.UsageRecord("u-new", usage(cust, "2.50"), at(1, 5)),
                ],
            )
    ctx = JobContext(pool=pool, tax=tax, invoices_topic="test.billing.invoices.v1")
    marker = rows.CloseMarker(f"close-{unique}", cust, PERIOD, "period_closed", at(2, 5))
    result = run_invoice_job(ctx, marker, token, threading.Event())
    with pool.connection() as conn:
        invoice = store.invoices.current_invoice(conn, cust, PERIOD)
    # Refused (the marker dead-lettered, the customer held), never built from part of the
    # usage: the oracle is the 10.00 + 2.50 of the two lines written above.
    assert invoice is None, (
        f"invoiced {invoice.subtotal if invoice else None} from part of the usage "
        f"({result.outcome.value}: {result.detail})"
    )
    assert result.outcome is Outcome.FAILED, f"{result.outcome.value}: {result.detail}"
    assert "partition(s) [2]" in result.detail, result.detail
    # The operator released the hold (docs/operations.md "Adding partitions"): the released
    # close invoices the usage of every partition, so the invoice exists and has both lines.
    released = rows.CloseMarker(f"release-{unique}", cust, PERIOD, "hold_released", at(3, 5))
    again = run_invoice_job(ctx, released, token, threading.Event())
    assert again.outcome is Outcome.INVOICED, f"{again.outcome.value}: {again.detail}"
    with pool.connection() as conn:
        invoice = store.invoices.current_invoice(conn, cust, PERIOD)
    assert invoice is not None, "the released close wrote no invoice"
    assert invoice.subtotal == Decimal("12.50"), (
        f"the released close invoiced {invoice.subtotal}, not 10.00 + 2.50 (both partitions)"
    )


# --------------------------------------------------------------------------- 5


def test_5_a_worker_that_meets_the_replays_tax_document_does_not_hold_the_customer(
    pool: ConnectionPool[Any], unique: str
) -> None:
    cust = f"c-{unique}"
    token = fencing.FencingToken(f"g-{unique}", TOPIC, 0, 1, "member-1")
    tax = InMemoryTaxService()
    with pool.connection() as conn:
        fencing.claim(conn, token)
        with conn.transaction():
            store.usage.upsert_customer(conn, "cu-1", customer(cust), at(0))
            store.usage.insert_usage(conn, [rows.UsageRecord("u-1", usage(cust, "10.00"), at(1))])
    # The replay, racing the worker for revision 1, committed its tax document first, with
    # a line the worker has not read yet (it is after the worker's marker).
    invoice_id = invoice_id_for(cust, PERIOD, 1)
    tax.calculate(
        idempotency_key=f"{invoice_id}:r1",
        customer_id=cust,
        currency="USD",
        lines=[
            TaxLine("u-1", Decimal("10.00"), "us-east-1", None),
            TaxLine("u-late", Decimal("1.00"), "us-east-1", None),
        ],
    )
    marker = rows.CloseMarker(f"close-{unique}", cust, PERIOD, "hold_released", at(2))
    result = run_invoice_job(
        JobContext(pool=pool, tax=tax, invoices_topic="test.billing.invoices.v1"),
        marker,
        token,
        threading.Event(),
    )
    assert result.outcome is not Outcome.FAILED, (
        f"the worker's 409 is a permanent refusal: the customer would be held for good "
        f"({result.detail})"
    )


# --------------------------------------------------------------------------- 7


def test_7_one_amount_written_two_ways_is_one_payload(
    pool: ConnectionPool[Any], unique: str
) -> None:
    cust = f"c-{unique}"
    assert payload_hash(usage(cust, "1.0")) == payload_hash(usage(cust, "1.00"))
    with pool.connection() as conn, conn.transaction():
        first = store.usage.insert_usage(conn, [rows.UsageRecord("u-1", usage(cust, "1.0"), at(1))])
        again = store.usage.insert_usage(
            conn, [rows.UsageRecord("u-1", usage(cust, "1.00"), at(2))]
        )
    assert first == [] and again == [], f"a resend with 1.00 for 1.0 was a conflict: {again}"


# --------------------------------------------------------------------------- 5 (replay side)


def _replay_context(
    db: Settings,
    pool: ConnectionPool[Any],
    unique: str,
    tax: InMemoryTaxService,
    rebuild: Any,
    lease: Any,
) -> Any:
    from streams.apps.replay import store as rstore
    from streams.apps.replay.apply import ReplayContext
    from streams.apps.replay.reader import Window
    from streams.apps.replay.report import Mode

    run_id = f"r{unique}"
    window = Window(TOPIC, datetime(2024, 12, 25, tzinfo=UTC), {0: 0}, {0: 10})
    with pool.connection() as conn, conn.transaction():
        fencing.LeaseFence.of(lease).check(conn)
        rstore.insert_run(
            conn,
            run_id=run_id,
            billing_period=PERIOD,
            mode="apply",
            topic=TOPIC,
            consumer_group=f"replay-{unique}",
            window_start=window.since,
            start_offsets=Window.offsets_json(window.start),
            end_offsets=Window.offsets_json(window.end),
            holder=lease.holder,
            lease_fencing_token=lease.fencing_token,
        )
    return ReplayContext(
        settings=db,
        period=PERIOD,
        mode=Mode.APPLY,
        topic=TOPIC,
        invoices_topic="test.billing.invoices.v1",
        pool=pool,
        tax=tax,
        lease=lease,
        run_id=run_id,
        window=window,
        rebuild=rebuild,
        on_step=lambda stage, customer: None,
    )


def test_5_the_replay_neither_races_the_worker_nor_fails_on_its_tax_document(
    db: Settings, pool: ConnectionPool[Any], unique: str
) -> None:
    import redis as redis_lib

    from streams.adapters.lease import Lease
    from streams.apps.replay.apply import replay_customer
    from streams.apps.replay.rebuild import Coordinates, PeriodRebuild

    released, racing = f"rel-{unique}", f"race-{unique}"
    tax = InMemoryTaxService()
    rebuild = PeriodRebuild(PERIOD)
    for n, cust in enumerate((released, racing)):
        partition_offset = n * 4
        rebuild.add(
            Envelope.wrap(customer(cust), id=f"cu-{cust}", source="/t"),
            Coordinates(TOPIC, 0, partition_offset),
        )
        rebuild.add(
            Envelope.wrap(usage(cust, "10.00"), id=f"u-{cust}", source="/t"),
            Coordinates(TOPIC, 0, partition_offset + 1),
        )
    marker = rows.CloseMarker(f"close-{released}", released, PERIOD, "period_closed", at(2))
    with pool.connection() as conn, conn.transaction():
        for n, cust in enumerate((released, racing)):
            store.usage.upsert_customer(conn, f"cu-{cust}", customer(cust), at(n * 4))
            store.usage.insert_usage(
                conn, [rows.UsageRecord(f"u-{cust}", usage(cust, "10.00"), at(n * 4 + 1))]
            )
        # `released`: its close was held, then the hold released; the worker has not yet
        # read the marker the release re-sent (it is past the replay's window).
        store.closes.record_close(conn, marker, "held", None)
        store.holds.record_hold(
            conn,
            customer_id=released,
            billing_period=PERIOD,
            reason="dead-lettered: bad record",
            event_id="e-bad",
            source=at(9),
        )
        conn.execute(
            "UPDATE invoice_holds SET released_at = now() WHERE customer_id = %s", (released,)
        )
    # `racing`: its worker committed revision 1's tax document (other lines: it read a
    # line the replay's window ends before) and is about to write the invoice.
    tax.calculate(
        idempotency_key=f"{invoice_id_for(racing, PERIOD, 1)}:r1",
        customer_id=racing,
        currency="USD",
        lines=[
            TaxLine(f"u-{racing}", Decimal("10.00"), "us-east-1", None),
            TaxLine("u-late", Decimal("5.00"), "us-east-1", None),
        ],
    )
    client = redis_lib.Redis.from_url(db.redis.url.get_secret_value(), socket_timeout=5)
    lease = Lease.acquire(
        client, f"replay-{unique}", ttl_s=30, holder="test", key_prefix=f"t{unique}:"
    )
    try:
        ctx = _replay_context(db, pool, unique, tax, rebuild, lease)
        with pool.connection() as conn:
            ctx.closed = store.closes.closed_customers(conn, PERIOD, TOPIC) | {racing}
            ctx.held_closes = store.closes.last_close_held(conn, PERIOD, TOPIC)
            ctx.db_customers = store.usage.customers(conn, [released, racing])
        ctx.usage = rebuild.usage_by_customer()
        ctx.worker_next = {0: 10}
        released_outcome = replay_customer(ctx, released)
        racing_outcome = replay_customer(ctx, racing)
    finally:
        lease.release()
        client.close()
    with pool.connection() as conn:
        written = store.invoices.current_invoice(conn, released, PERIOD)
        recorded = conn.execute(
            "SELECT customer_id, outcome FROM replay_results WHERE run_id = %s", (ctx.run_id,)
        ).fetchall()
    assert written is None and released_outcome.outcome == "skipped", (
        f"the replay wrote revision 1 of a released hold, racing the worker: "
        f"{released_outcome.outcome} {released_outcome.reason}"
    )
    assert racing_outcome.transient, (
        f"the replay's 409 on the worker's tax document is a permanent failure: "
        f"{racing_outcome.outcome} {racing_outcome.reason}"
    )
    assert (racing, "failed") not in {(r[0], r[1]) for r in recorded}


# --------------------------------------------------------------------------- 6


def test_6_a_replay_prices_with_the_rates_of_now_not_the_rate_cache(
    settings: Settings, unique: str, tmp_path: Any
) -> None:
    import redis as redis_lib

    from streams.adapters.tax.cache import RedisTaxCache
    from streams.adapters.tax.client import HttpTaxService
    from streams.apps.replay.report import Mode
    from streams.bootstrap import replay_period
    from tests.support.pipeline import isolated_pipeline

    with isolated_pipeline(settings, unique, tmp_path) as p:
        cust = f"c-{unique}"
        region = f"zz-{unique}"  # its own rate cache entry: other tests never see it
        data = usage(cust, "100.00").model_copy(update={"region_id": region})
        envelopes = [
            Envelope.wrap(customer(cust), id=f"cu-{unique}", source="/t"),
            Envelope.wrap(data, id=f"u-{unique}", source="/t"),
        ]
        producer = make_producer(p.settings.kafka)
        coords: list[tuple[int, int]] = []
        for envelope in envelopes:
            enc = encode(envelope)
            producer.produce(
                p.topic,
                key=enc.key,
                value=enc.value,
                headers=list(enc.headers),
                on_delivery=lambda err, msg: coords.append(
                    (msg.partition() or 0, msg.offset() or 0)
                ),
            )
        producer.flush(30)
        partition = coords[0][0]
        src = [rows.SourceCoordinates(p.topic, part, off) for part, off in coords]
        token = fencing.FencingToken(p.settings.worker.invoicing_group, p.topic, partition, 1, "m")
        client = redis_lib.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=5)
        http = HttpTaxService(p.settings.tax, cache=RedisTaxCache(client, ttl_s=3600))
        with ConnectionPool(
            p.settings.postgres.dsn("owner"), min_size=1, max_size=3, kwargs={"autocommit": False}
        ) as pool:
            with pool.connection() as conn:  # what the worker stored, as it would have
                fencing.claim(conn, token)
                with conn.transaction():
                    store.usage.upsert_customer(conn, f"cu-{unique}", customer(cust), src[0])
                    store.usage.insert_usage(conn, [rows.UsageRecord(f"u-{unique}", data, src[1])])
            marker = rows.CloseMarker(
                f"close-{unique}",
                cust,
                PERIOD,
                "period_closed",
                rows.SourceCoordinates(p.topic, partition, src[1].offset + 1),
            )
            result = run_invoice_job(
                JobContext(pool=pool, tax=http, invoices_topic=p.invoices_topic),
                marker,
                token,
                threading.Event(),
            )
            assert result.outcome is Outcome.INVOICED, result.detail
            # the worker's answer put the region's rate in the cache; then the rate changes
            p.tax.admin.configure(rate_overrides={"GLOBAL": "0.3"})
            report = replay_period(PERIOD, p.settings, mode=Mode.DRY_RUN, progress=False)
        http.close()
        client.close()
    outcome = next(o for o in report.outcomes if o.customer_id == cust)
    assert outcome.outcome == "difference", (
        f"the replay priced through the cached rate: {outcome.outcome} {outcome.reason}"
    )
