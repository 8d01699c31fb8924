"""The in-memory Kafka's records: murmur2 partitioning, stored records, librdkafka's values.

What the twin's broker (:mod:`streams.adapters.memory.kafka`) and clients
(:mod:`streams.adapters.memory.kafka_clients`) share: the Java client's partitioner
(:func:`murmur2`, :func:`partition_for`), a stored record and the
``confluent_kafka.Message`` a consumer reads of it (:func:`to_message`), and librdkafka's constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Message

#: librdkafka's default ``message.max.bytes``.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
#: ``TopicPartition.offset`` of an entry of ``assignment()`` (librdkafka's OFFSET_STORED).
OFFSET_STORED = -1000
#: ``Message.timestamp()`` type of a producer's timestamp (TIMESTAMP_CREATE_TIME).
CREATE_TIME = 1

Header = tuple[str, bytes | None]
#: (topic, partition)
TP = tuple[str, int]


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (the Java client's partitioner hash), signed 32-bit."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length & ~3 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a keyed record: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class Stored:
    """One record of a partition's log, as the broker keeps it."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] | None
    timestamp_ms: int


def to_message(topic: str, partition: int, record: Stored) -> Message:
    """The ``confluent_kafka.Message`` a consumer reads of ``record``."""
    return Message(
        topic=topic,
        partition=partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=list(record.headers) if record.headers is not None else None,
        timestamp=(CREATE_TIME, record.timestamp_ms),
    )


def kafka_exception(code: int, reason: str | None = None) -> KafkaException:
    """librdkafka's exception for error ``code`` (with ``reason`` when given)."""
    return KafkaException(KafkaError(code, reason) if reason else KafkaError(code))
