"""Kafka side of the harness: load generation, offsets, and the bare baselines.

The bare consumer and the bare producer use the product's client configurations
(:func:`benchmarks.product.kafka_consumer_config` / ``kafka_producer_config``), so
a ratio compares the product's work with the client's, not two configurations.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from benchmarks.measure import BenchError
from benchmarks.product import Record, Settings, kafka_consumer_config, kafka_producer_config

#: How long any wait on Kafka may take before the harness gives up (seconds).
KAFKA_TIMEOUT_S = 900.0


def admin(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})


def create_topic(settings: Settings, name: str, partitions: int = 12) -> None:
    """Create ``name`` (replication 1) and wait until every partition has a leader."""
    client = admin(settings)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1)], request_timeout=30
    )
    for future in futures.values():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = client.list_topics(name, timeout=10).topics.get(name)
        if (
            meta is not None
            and meta.error is None
            and len(meta.partitions) == partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
        ):
            return
        time.sleep(0.1)
    raise BenchError(f"topic {name} has no leader for every partition")


def _plain_consumer(settings: Settings, **overrides: Any) -> Consumer:
    return Consumer(kafka_consumer_config(settings, f"bench-{uuid.uuid4().hex[:10]}", **overrides))


def partitions_of(settings: Settings, topic: str) -> list[int]:
    meta = admin(settings).list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        raise BenchError(f"topic {topic} does not exist")
    return sorted(meta.partitions)


def end_offsets(settings: Settings, topic: str) -> dict[int, int]:
    """High watermark per partition."""
    consumer = _plain_consumer(settings)
    try:
        return {
            p: int(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1])
            for p in partitions_of(settings, topic)
        }
    finally:
        consumer.close()


class CommittedOffsets:
    """Reads a group's committed offsets (OffsetFetch; never joins the group)."""

    def __init__(self, settings: Settings, group_id: str, topic: str) -> None:
        self.topic = topic
        self.partitions = partitions_of(settings, topic)
        self.consumer = Consumer(kafka_consumer_config(settings, group_id))

    def total(self) -> int:
        tps = [TopicPartition(self.topic, p) for p in self.partitions]
        return sum(max(0, tp.offset) for tp in self.consumer.committed(tps, timeout=10))

    def close(self) -> None:
        self.consumer.close()


def produce(
    settings: Settings,
    topic: str,
    records: Iterable[Record],
    *,
    partition: int | None = None,
) -> tuple[int, float]:
    """Produce ``records`` with the product's producer configuration; returns (count,
    seconds) once every delivery is confirmed.

    Raises:
        BenchError: a delivery failed.
    """
    producer = Producer(kafka_producer_config(settings))
    failures: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    count = 0
    t0 = time.perf_counter()
    for key, value, record_headers in records:
        headers: list[tuple[str, str | bytes | None]] = list(record_headers)
        while True:
            try:
                if partition is None:
                    producer.produce(
                        topic, key=key, value=value, headers=headers, on_delivery=delivered
                    )
                else:
                    producer.produce(
                        topic,
                        key=key,
                        value=value,
                        headers=headers,
                        partition=partition,
                        on_delivery=delivered,
                    )
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
        if count % 1000 == 0:
            producer.poll(0)
    left = producer.flush(KAFKA_TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if left or failures:
        raise BenchError(f"produce to {topic}: {left} undelivered, failures {failures[:3]}")
    return count, seconds


def bare_count(
    settings: Settings, topic: str, expected: int, partitions: list[int] | None = None
) -> float:
    """The bare baseline consumer: assign every partition at the beginning, consume in
    batches of 500 and only count, until ``expected`` records; returns seconds from
    the first record to the last (the client's start-up, metadata and offset lookup
    are not counted: a throughput, in the baseline's favour).

    Raises:
        BenchError: fewer records than expected within the timeout.
    """
    consumer = _plain_consumer(settings)
    try:
        parts = partitions if partitions is not None else partitions_of(settings, topic)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        seen = 0
        t0 = 0.0
        deadline = time.monotonic() + KAFKA_TIMEOUT_S
        while seen < expected:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is None:
                    if seen == 0:
                        t0 = time.perf_counter()
                    seen += 1
            if time.monotonic() > deadline:
                raise BenchError(f"bare consumer saw {seen} of {expected} records of {topic}")
        return time.perf_counter() - t0
    finally:
        consumer.close()


def read_records(settings: Settings, topic: str, expected: int) -> list[Record]:
    """Every record of ``topic`` (key, value, headers), in produce order (record
    timestamp, then partition and offset)."""
    consumer = _plain_consumer(settings)
    rows: list[tuple[int, int, int, Record]] = []
    try:
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(settings, topic)]
        )
        deadline = time.monotonic() + KAFKA_TIMEOUT_S
        while len(rows) < expected:
            for msg in consumer.consume(num_messages=500, timeout=0.5):
                if msg.error() is None:
                    headers = [(str(h[0]), _bytes(h[1])) for h in (msg.headers() or [])]
                    rows.append(
                        (
                            msg.timestamp()[1],
                            msg.partition() or 0,
                            msg.offset() or 0,
                            (_bytes(msg.key()), _bytes(msg.value()), headers),
                        )
                    )
            if time.monotonic() > deadline:
                raise BenchError(f"read {len(rows)} of {expected} records of {topic}")
    finally:
        consumer.close()
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return [r[3] for r in rows]


def _bytes(value: str | bytes | None) -> bytes:
    if value is None:
        return b""
    return value.encode() if isinstance(value, str) else value


class TopicCounter:
    """Counts records arriving on ``topic`` from its beginning (Debezium relay timing)."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.consumer = _plain_consumer(settings)
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(settings, topic)]
        )
        self.seen = 0

    def wait_for(self, total: int, timeout_s: float) -> float:
        """Consume until ``total`` records were seen; returns ``time.time()`` of the last.

        Raises:
            BenchError: not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while self.seen < total:
            for msg in self.consumer.consume(num_messages=500, timeout=0.05):
                if msg.error() is None:
                    self.seen += 1
            if time.monotonic() > deadline:
                raise BenchError(f"only {self.seen} of {total} outbox records reached the topic")
        return time.time()

    def close(self) -> None:
        self.consumer.close()
