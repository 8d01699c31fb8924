"""``invoicing close-period``: markers per customer with usage, under a fenced Redis lease.

Each test has its own topic prefix, hence its own topic and lease
(``<prefix>close-period:<period>``); rows it inserts into ``usage_lines`` carry
its topic as ``source_topic`` and unique customer ids, so runs never collide
and can repeat.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from prometheus_client import REGISTRY
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool
from typer.testing import CliRunner

from streams import bootstrap
from streams.adapters.kafka import ensure_topics
from streams.adapters.lease import DEFAULT_KEY_PREFIX, Lease, LeaseBusy, LeaseUnavailable
from streams.apps.importers import close_period as close_period_module
from streams.apps.importers.close_period import CloseAborted, close_period, lease_name_for
from streams.apps.importers.focus_import import import_focus
from streams.core.domain.codec import decode
from streams.core.domain.events import BillingPeriodClosed, UsageRecorded, close_marker_id
from streams.core.domain.focus import FocusUsage, iter_focus_rows
from streams.entrypoints.app import app
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS
from tests.support.kafka import drain, headers_of, java_partition

# The stack's own database and outbox connector (no sandbox): never beside another module
# that uses them (pytest-xdist --dist loadgroup keeps a group on one worker).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("stack-database")]

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"


def with_prefix(settings: Settings, prefix: str) -> Settings:
    kafka = settings.kafka.model_copy(update={"topic_prefix": prefix})
    return settings.model_copy(update={"kafka": kafka})


@pytest.fixture
def prefixed(settings: Settings, unique: str) -> Settings:
    prefix = f"test-close-{unique}."
    ensure_topics(settings.kafka, (ACCOUNT_EVENTS.with_prefix(prefix),))
    return with_prefix(settings, prefix)


@pytest.fixture
def pool(settings: Settings) -> Iterator[ConnectionPool]:
    p = bootstrap.postgres_pool(
        settings, role="close", name="test-close-period", min_size=1, max_size=2
    )
    yield p
    p.close()


@pytest.fixture
def producer(settings: Settings) -> Producer:
    return bootstrap.producer(settings)


def scan_consumer_of(settings: Settings) -> Callable[[], Consumer]:
    """close-period's scan consumer, as the composition root builds it."""
    return lambda: bootstrap.scan_consumer(settings)


def topic_of(settings: Settings) -> str:
    return settings.kafka.topic_prefix + ACCOUNT_EVENTS.name


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def sample_customers_by_period() -> dict[str, set[str]]:
    result: dict[str, set[str]] = defaultdict(set)
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        for row in iter_focus_rows(handle):
            assert isinstance(row, FocusUsage)
            result[row.usage.billing_period].add(row.usage.customer_id)
    return result


def markers(messages: list[Message]) -> list[tuple[Message, Any]]:
    found = []
    for msg in messages:
        envelope = decode(msg.key(), msg.value(), headers_of(msg))
        if isinstance(envelope.data, BillingPeriodClosed):
            found.append((msg, envelope))
    return found


def insert_usage(
    pg: psycopg.Connection[TupleRow], topic: str, customer: str, period: str, offset: int
) -> None:
    pg.execute(
        """
        INSERT INTO usage_lines (event_id, customer_id, billing_period, amount, currency,
                                 event_time, payload_sha256, source_topic, source_partition,
                                 source_offset)
        VALUES (%s, %s, %s, 1.25, 'USD', %s, 'test', %s, 0, %s)
        """,
        (
            f"test-{uuid.uuid4().hex}",
            customer,
            period,
            datetime(int(period[:4]), int(period[5:]), 3, tzinfo=UTC),
            topic,
            offset,
        ),
    )


def test_one_marker_per_customer_with_usage_and_a_rerun_sends_the_same_ids(
    prefixed: Settings, pool: ConnectionPool, producer: Producer, redis_conn: redis.Redis
) -> None:
    imported = import_focus(SAMPLE, prefixed, producer=producer, progress=False)
    assert imported.ok and imported.produced == 1000
    expected = sample_customers_by_period()
    assert {p: len(c) for p, c in expected.items()} == {"2024-09": 72, "2024-10": 1}

    runs = {}
    for period in ("2024-09", "2024-10"):
        first = close_period(
            period, prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
            scan_consumer=scan_consumer_of(prefixed),
            lease_ttl_s=5, progress=False,
        )  # fmt: skip
        assert first.ok, first.delivery_failures
        assert set(first.customers) == expected[period]
        assert first.from_topic == len(expected[period]) and first.from_db == 0
        assert first.markers_produced == len(expected[period])
        assert first.newly_requested + first.already_requested == len(expected[period])
        assert first.marker_ids == {c: close_marker_id(c, period) for c in expected[period]}
        assert first.lease_name == f"{prefixed.kafka.topic_prefix}close-period:{period}"
        runs[period] = first
    assert sum(len(r.customers) for r in runs.values()) == 73

    # A second run: same ids again, every customer already requested, a higher token.
    again = close_period(
        "2024-09", prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
        scan_consumer=scan_consumer_of(prefixed),
        lease_ttl_s=5, progress=False,
    )  # fmt: skip
    assert again.ok
    assert again.marker_ids == runs["2024-09"].marker_ids
    assert (again.newly_requested, again.already_requested) == (0, 72)
    assert again.fencing_token > runs["2024-09"].fencing_token

    # On the topic: 72 * 2 + 1 markers, each on its key's murmur2 partition, after the
    # customer's usage of that period, with deterministic ids.
    messages = drain(prefixed.kafka, topic_of(prefixed), expected=1073 + 145, timeout_s=60)
    assert len(messages) == 1073 + 145
    found = markers(messages)
    assert len(found) == 145
    last_usage: dict[tuple[str, str], int] = {}
    for msg in messages:
        envelope = decode(msg.key(), msg.value(), headers_of(msg))
        if isinstance(envelope.data, UsageRecorded):
            key = (envelope.subject, envelope.data.billing_period)
            offset = msg.offset()
            assert offset is not None
            last_usage[key] = max(last_usage.get(key, -1), offset)
    ids_per_customer: dict[tuple[str, str], set[str]] = defaultdict(set)
    for msg, envelope in found:
        data = envelope.data
        marker_key, marker_offset = msg.key(), msg.offset()
        assert marker_key is not None and marker_offset is not None
        assert msg.partition() == java_partition(marker_key, 12)
        assert envelope.id == close_marker_id(data.customer_id, data.billing_period)
        assert marker_offset > last_usage[(data.customer_id, data.billing_period)]
        assert data.lease_fencing_token is not None
        ids_per_customer[(data.customer_id, data.billing_period)].add(envelope.id)
    assert len(ids_per_customer) == 73
    assert all(len(ids) == 1 for ids in ids_per_customer.values())


def test_usage_lines_of_the_same_topic_join_the_scan(
    prefixed: Settings,
    pool: ConnectionPool,
    producer: Producer,
    redis_conn: redis.Redis,
    pg: psycopg.Connection[TupleRow],
    unique: str,
) -> None:
    topic = topic_of(prefixed)
    insert_usage(pg, topic, f"db-only-{unique}", "2024-09", 1)
    insert_usage(pg, topic, f"db-other-period-{unique}", "2024-08", 2)
    insert_usage(pg, "some.other.topic", f"db-other-topic-{unique}", "2024-09", 3)
    summary = close_period(
        "2024-09", prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
        scan_consumer=scan_consumer_of(prefixed),
        lease_ttl_s=5, progress=False,
    )  # fmt: skip
    assert summary.ok
    assert summary.customers == (f"db-only-{unique}",)
    assert (summary.from_topic, summary.from_db, summary.newly_requested) == (0, 1, 1)
    row = pg.execute(
        "SELECT event_id, lease_fencing_token FROM close_requests "
        "WHERE customer_id = %s AND billing_period = '2024-09'",
        (f"db-only-{unique}",),
    ).fetchone()
    assert row == (close_marker_id(f"db-only-{unique}", "2024-09"), summary.fencing_token)


def commit_as_group(settings: Settings, group: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` (partition → next offset) for ``group`` on the account-events topic,
    as the invoicing workers commit after storing what precedes them."""
    committer = bootstrap.reader(settings, group)
    try:
        committer.commit(
            offsets=[TopicPartition(topic_of(settings), p, o) for p, o in offsets.items()],
            asynchronous=False,
        )
    finally:
        committer.close()


def test_the_scan_reads_only_what_the_workers_have_not_stored(
    prefixed: Settings,
    pool: ConnectionPool,
    producer: Producer,
    redis_conn: redis.Redis,
    pg: psycopg.Connection[TupleRow],
    unique: str,
) -> None:
    """Below the workers' committed offsets the run reads nothing and takes the customers
    from the database; above them it reads the records. Here the "workers" (a group of
    the test's own) committed every record of partitions 0-5 and stored their customers'
    usage; partitions 6-11 were not stored, so only they are read."""
    imported = import_focus(SAMPLE, prefixed, producer=producer, progress=False)
    assert imported.ok and imported.produced == 1000
    topic = topic_of(prefixed)
    messages = drain(prefixed.kafka, topic, expected=1073, timeout_s=60)  # and 73 customers
    assert len(messages) == 1073
    customers_on: dict[int, set[str]] = defaultdict(set)
    records_on: dict[int, int] = defaultdict(int)
    for msg in messages:
        envelope = decode(msg.key(), msg.value(), headers_of(msg))
        partition = msg.partition()
        assert partition is not None
        records_on[partition] += 1
        if isinstance(envelope.data, UsageRecorded) and envelope.data.billing_period == "2024-09":
            customers_on[partition].add(envelope.data.customer_id)
    stored_partitions = range(6)
    group = f"test-close-workers-{unique}"
    commit_as_group(prefixed, group, {p: records_on[p] for p in stored_partitions})
    for p in stored_partitions:
        for customer in customers_on[p]:
            insert_usage(pg, topic, customer, "2024-09", 1)
    held = f"held-{unique}"  # a record of the period dead-lettered: only its hold is stored
    pg.execute(
        "INSERT INTO invoice_holds (customer_id, billing_period, reason, source_topic, "
        "source_partition, source_offset) VALUES (%s, '2024-09', 'test', %s, 0, 0)",
        (held, topic),
    )
    stored_offsets = close_period_module.workers_committed(
        lambda: bootstrap.reader(prefixed, group)
    )

    summary = close_period(
        "2024-09", prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
        scan_consumer=scan_consumer_of(prefixed), stored_offsets=stored_offsets,
        lease_ttl_s=5, progress=False,
    )  # fmt: skip

    assert summary.ok, summary.delivery_failures
    stored = sum(records_on[p] for p in stored_partitions)
    assert (summary.stored_records, summary.scanned_records) == (stored, 1073 - stored)
    assert set(summary.customers) == sample_customers_by_period()["2024-09"] | {held}
    assert summary.from_topic == sum(len(customers_on[p]) for p in range(6, 12))
    assert summary.from_db == sum(len(customers_on[p]) for p in stored_partitions) + 1

    # Every partition stored, the first run's markers handled too: nothing is read.
    watermarks = bootstrap.reader(prefixed, group)
    try:
        ends = {
            p: watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(12)
        }
    finally:
        watermarks.close()
    assert sum(ends.values()) == 1073 + len(summary.customers)
    commit_as_group(prefixed, group, ends)
    for p in range(6, 12):
        for customer in customers_on[p]:
            insert_usage(pg, topic, customer, "2024-09", 2)
    again = close_period(
        "2024-09", prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
        scan_consumer=scan_consumer_of(prefixed), stored_offsets=stored_offsets,
        lease_ttl_s=5, progress=False,
    )  # fmt: skip
    assert again.ok
    assert (again.stored_records, again.scanned_records, again.from_topic) == (
        sum(ends.values()),
        0,
        0,
    )
    assert again.customers == summary.customers


def test_a_held_lease_refuses_the_run_names_the_holder_and_emits_nothing(
    prefixed: Settings,
    pool: ConnectionPool,
    producer: Producer,
    redis_conn: redis.Redis,
    pg: psycopg.Connection[TupleRow],
    unique: str,
) -> None:
    topic = topic_of(prefixed)
    insert_usage(pg, topic, f"busy-{unique}", "2024-09", 1)
    name = lease_name_for("2024-09", prefixed)
    with Lease.acquire(redis_conn, name, ttl_s=30, holder="ops-laptop:4242"):
        with pytest.raises(LeaseBusy) as busy:
            close_period(
                "2024-09", prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
                scan_consumer=scan_consumer_of(prefixed),
                progress=False,
            )  # fmt: skip
        assert busy.value.holder == "ops-laptop:4242"

        env = {"INVOICING_KAFKA__TOPIC_PREFIX": prefixed.kafka.topic_prefix}
        result = CliRunner().invoke(app, ["close-period", "2024-09", "--no-progress"], env=env)
        assert result.exit_code == 4, result.output
        assert "ops-laptop:4242" in result.stderr

    assert drain(prefixed.kafka, topic, timeout_s=3) == []
    row = pg.execute(
        "SELECT count(*) FROM close_requests WHERE customer_id = %s", (f"busy-{unique}",)
    ).fetchone()
    assert row == (0,)


def test_redis_down_refuses_to_start_and_emits_nothing(
    prefixed: Settings,
    pool: ConnectionPool,
    producer: Producer,
    pg: psycopg.Connection[TupleRow],
    unique: str,
) -> None:
    topic = topic_of(prefixed)
    insert_usage(pg, topic, f"no-redis-{unique}", "2024-09", 1)
    port = closed_port()
    dead = redis.Redis(port=port, socket_timeout=0.5, socket_connect_timeout=0.5)
    with pytest.raises(LeaseUnavailable):
        close_period(
            "2024-09", prefixed, producer=producer, redis_conn=dead, pool=pool,
            scan_consumer=scan_consumer_of(prefixed), progress=False,
        )  # fmt: skip

    env = {
        "INVOICING_KAFKA__TOPIC_PREFIX": prefixed.kafka.topic_prefix,
        "INVOICING_REDIS__URL": f"redis://127.0.0.1:{port}/0",
        "INVOICING_REDIS__SOCKET_TIMEOUT_S": "0.5",
    }
    result = CliRunner().invoke(app, ["close-period", "2024-09", "--no-progress"], env=env)
    assert result.exit_code == 3, result.output
    assert "refusing to start" in result.stderr and "Redis unreachable" in result.stderr

    assert drain(prefixed.kafka, topic, timeout_s=3) == []
    row = pg.execute(
        "SELECT count(*) FROM close_requests WHERE customer_id = %s", (f"no-redis-{unique}",)
    ).fetchone()
    assert row == (0,)


class _LeaseThief:
    """A producer that, on the first marker, deletes the run's lease key behind its back."""

    def __init__(self, inner: Producer, redis_conn: redis.Redis, key: str, lease: str) -> None:
        self.inner = inner
        self.redis_conn = redis_conn
        self.key = key
        self.lease = lease
        self.stolen = False
        self.noticed = False

    def lost_count(self) -> float:
        value = REGISTRY.get_sample_value(
            "invoicing_lease_lost_while_running_total", {"lease": self.lease}
        )
        return value or 0.0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.inner.produce(*args, **kwargs)
        if not self.stolen:
            self.stolen = True
            before = self.lost_count()
            self.redis_conn.delete(self.key)
            # Until the renewal thread has declared the lease lost (its metric), not a sleep.
            deadline = time.monotonic() + 10
            while self.lost_count() == before and time.monotonic() < deadline:
                time.sleep(0.02)
            self.noticed = self.lost_count() > before

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_lease_lost_part_way_aborts_the_run(
    prefixed: Settings,
    pool: ConnectionPool,
    producer: Producer,
    redis_conn: redis.Redis,
    pg: psycopg.Connection[TupleRow],
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chunks of 2 customers: the lease is stolen at the first chunk's first marker; that
    chunk was committed, so both its markers go out, and the run stops before the next."""
    monkeypatch.setattr(close_period_module, "CLOSE_BATCH", 2)
    topic = topic_of(prefixed)
    customers = [f"lost-{unique}-{i}" for i in range(3)]
    for i, customer in enumerate(customers):
        insert_usage(pg, topic, customer, "2024-09", i)
    lease = lease_name_for("2024-09", prefixed)
    thief = _LeaseThief(producer, redis_conn, DEFAULT_KEY_PREFIX + lease, lease)
    with pytest.raises(CloseAborted) as aborted:
        close_period(
            "2024-09", prefixed, producer=thief, redis_conn=redis_conn, pool=pool,  # type: ignore[arg-type]
            scan_consumer=scan_consumer_of(prefixed), lease_ttl_s=1.2, progress=False,
        )  # fmt: skip
    assert thief.noticed, "the renewal thread never declared the stolen lease lost"
    partial = aborted.value.summary
    assert partial.customers == tuple(customers)
    assert (partial.newly_requested, partial.markers_produced) == (2, 2)
    assert "lost" in str(aborted.value)

    # A rerun continues: the first chunk is already requested, the last customer is new.
    summary = close_period(
        "2024-09", prefixed, producer=producer, redis_conn=redis_conn, pool=pool,
        scan_consumer=scan_consumer_of(prefixed),
        lease_ttl_s=5, progress=False,
    )  # fmt: skip
    assert (summary.newly_requested, summary.already_requested) == (1, 2)
    found = markers(drain(prefixed.kafka, topic, expected=5))
    assert sorted(e.data.customer_id for _m, e in found) == sorted(
        [customers[0], customers[1], *customers]
    )
