"""Test helpers for Kafka: an independent murmur2, topic creation, draining a topic,
typed access to a consumed record's headers.

Every client here is built by the project's factories (:mod:`streams.adapters.kafka`)
from the settings, so it speaks the settings' security protocol (the TLS profile's
SASL_SSL too), never from the bootstrap servers alone."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

from confluent_kafka import Message, TopicPartition

from streams.adapters.kafka import ensure_topics, make_reader
from streams.apps.ops import status
from streams.settings import KafkaSettings, Settings
from streams.topics import TopicSpec


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (Java), ported independently of librdkafka for the test.

    Returns the signed 32-bit hash as Java computes it.
    """
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = (
            (data[i4] & 0xFF)
            + ((data[i4 + 1] & 0xFF) << 8)
            + ((data[i4 + 2] & 0xFF) << 16)
            + ((data[i4 + 3] & 0xFF) << 24)
        )
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= (data[(length & ~3) + 2] & 0xFF) << 16
    if rest >= 2:
        h ^= (data[(length & ~3) + 1] & 0xFF) << 8
    if rest >= 1:
        h ^= data[length & ~3] & 0xFF
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """The partition Java's default partitioner picks for a keyed record:
    ``Utils.toPositive(Utils.murmur2(key)) % numPartitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def make_topic(kafka: KafkaSettings, name: str, partitions: int = 12) -> str:
    """Create a throwaway topic (idempotent) and return its name."""
    ensure_topics(
        kafka, (TopicSpec(name=name, partitions=partitions, key="test", description="test"),)
    )
    return name


def drain(
    kafka: KafkaSettings,
    topic: str,
    *,
    expected: int | None = None,
    timeout_s: float = 60.0,
    idle_s: float = 3.0,
) -> list[Message]:
    """Read ``topic`` from the beginning of every partition (no group commits).

    Stops when ``expected`` records were read, or after ``idle_s`` without records
    once something was read, or at ``timeout_s``.
    """
    consumer = make_reader(
        kafka,
        f"drain-{topic}-{time.time_ns()}",
        **{"auto.offset.reset": "earliest", "isolation.level": "read_committed"},
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        parts = metadata.topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        last = time.monotonic()
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                if out and expected is None and time.monotonic() - last > idle_s:
                    break
                continue
            if msg.error():
                continue
            out.append(msg)
            last = time.monotonic()
            if expected is not None and len(out) >= expected:
                break
        return out
    finally:
        consumer.close()


#: Headers as ``Producer.produce`` accepts them (the stubs' ``HeadersType``, list form).
ProduceHeaders = list[tuple[str, str | bytes | None]]


def headers_of(msg: Message) -> list[tuple[str, bytes | None]]:
    """A consumed record's headers in order, as librdkafka returns them: ``(name, value)``
    pairs, the value ``bytes`` or None; ``[]`` when the record has none.

    The stubs type ``Message.headers()`` as the producer-side union (a dict, or str values);
    a consumed record never carries those, and this says so by failing the test.

    Raises:
        AssertionError: the headers are not a list of ``(str, bytes | None)`` pairs.
    """
    raw = msg.headers()
    if raw is None:
        return []
    assert isinstance(raw, list), f"consumed headers are not a list: {raw!r}"
    pairs: list[tuple[str, bytes | None]] = []
    for name, value in raw:
        assert value is None or isinstance(value, bytes), f"header {name!r} is {value!r}"
        pairs.append((name, value))
    return pairs


def text(data: bytes | None) -> str:
    """``data`` (a key, value or header value that must be present) decoded as UTF-8.

    Raises:
        AssertionError: ``data`` is None.
        UnicodeDecodeError: ``data`` is not UTF-8.
    """
    assert data is not None, "expected bytes, got None"
    return data.decode()


def partitions_of(messages: Iterable[Message]) -> dict[bytes, set[int]]:
    result: dict[bytes, set[int]] = {}
    for msg in messages:
        key, partition = msg.key(), msg.partition()
        if partition is not None:
            result.setdefault(bytes(key or b""), set()).add(partition)
    return result


def group_lag(kafka: KafkaSettings, group: str, topic: str) -> int:
    """Records of ``topic`` not yet committed by ``group`` (sum over partitions)."""
    consumer = make_reader(kafka, group)
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p) for p in parts]
        committed = consumer.committed(tps, timeout=10)
        lag = 0
        for tp in committed:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10
            )
            position = tp.offset if tp.offset >= 0 else 0
            lag += max(0, high - position)
        return lag
    finally:
        consumer.close()


def wait_for_no_lag(kafka: KafkaSettings, group: str, topic: str, timeout_s: float = 120.0) -> None:
    """Wait until ``group`` committed everything of ``topic``.

    Raises:
        AssertionError: lag remains after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    lag = -1
    while time.monotonic() < deadline:
        lag = group_lag(kafka, group, topic)
        if lag == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"group {group} still lags {lag} records on {topic} after {timeout_s}s")


def topic_size(settings: Settings, topic: str) -> int:
    """Records in ``topic`` now (:func:`streams.apps.ops.status.topic_size`, the status view's count)."""
    with contextlib.closing(make_reader(settings.kafka, status.PROBE_GROUP)) as consumer:
        return status.topic_size(consumer, topic)


def read_to_end(kafka: KafkaSettings, topic: str, *, timeout_s: float = 60.0) -> list[Message]:
    """Every record of ``topic`` up to each partition's high watermark at the time of the
    call (no group commits): an exact read, for a test that already knows the producers
    are done (after a sentinel or a settled pipeline), with no idle wait.

    Raises:
        AssertionError: the watermarks were not reached within ``timeout_s``.
    """
    consumer = make_reader(
        kafka,
        f"read-to-end-{topic}-{time.time_ns()}",
        **{"auto.offset.reset": "earliest", "isolation.level": "read_committed"},
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends: dict[int, int] = {}
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out: list[Message] = []
        deadline = time.monotonic() + timeout_s
        while ends:
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: watermarks {ends} not reached in {timeout_s}s")
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                out.append(msg)
            for tp in consumer.position([TopicPartition(topic, p) for p in list(ends)]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
        return out
    finally:
        consumer.close()
