"""The broker: keyed produce/consume, and murmur2 partitioning identical to Java's."""

from __future__ import annotations

import json
import time
import uuid

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaError, Message

from streams.adapters.kafka import make_producer
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS
from tests.support.kafka import drain, java_partition, make_topic, murmur2

# Kafka's own vectors for Utils.murmur2 (clients/src/test/java/.../utils/UtilsTest.java).
KAFKA_MURMUR2_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_independent_murmur2_matches_kafka_vectors() -> None:
    for key, expected in KAFKA_MURMUR2_VECTORS.items():
        assert murmur2(key) == expected, key


def _produce(settings: Settings, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    producer = make_producer(settings.kafka)
    delivered: dict[bytes, int] = {}
    errors: list[KafkaError] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
        else:
            key, partition = msg.key(), msg.partition()
            assert key is not None and partition is not None
            delivered[key] = partition

    for key in keys:
        producer.produce(topic, key=key, value=b'{"probe": true}', on_delivery=report)
    assert producer.flush(30) == 0
    assert not errors, errors
    return delivered


def test_keyed_record_round_trip_on_account_events(settings: Settings, unique: str) -> None:
    topic = settings.kafka.topic_prefix + ACCOUNT_EVENTS.name
    key = f"probe-{unique}".encode()
    partition = _produce(settings, topic, [key])[key]
    assert partition == java_partition(key, ACCOUNT_EVENTS.partitions)

    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"probe-{unique}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    from confluent_kafka import TopicPartition

    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    consumer.assign([TopicPartition(topic, partition, max(low, high - 50))])
    found = None
    deadline = time.monotonic() + 20
    while found is None and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error() and msg.key() == key:
            found = msg
    consumer.close()
    assert found is not None, "the produced record was not read back"
    assert found.value() == b'{"probe": true}'


def test_python_producer_partitions_like_the_java_client(settings: Settings, unique: str) -> None:
    topic = make_topic(settings.kafka, f"test.partitioning.{unique}", 12)
    keys = [f"customer-{i}".encode() for i in range(300)] + [
        b"51738928782",
        b"/subscriptions/x",
        "Zürich".encode(),
    ]
    delivered = _produce(settings, topic, keys)
    mismatches = {
        k: (p, java_partition(k, 12)) for k, p in delivered.items() if p != java_partition(k, 12)
    }
    assert not mismatches
    assert len(set(delivered.values())) == 12  # the keys spread over every partition


def test_java_producer_of_connect_agrees_with_python_producer(
    settings: Settings, unique: str
) -> None:
    """Debezium (a Java producer) and our producer put each key on the same partition."""
    topic = make_topic(settings.kafka, f"test.java-partitioning.{unique}.billing.invoices.v1", 12)
    keys = [f"cust-{unique}-{i}" for i in range(40)]
    with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as conn:
        for key in keys:
            conn.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, ce_time, document_id)"
                " VALUES (%s, %s, %s, 'test.probe', %s, '/tests', '2026-01-01T00:00:00Z', %s)",
                (uuid.uuid4(), topic, key, json.dumps({"probe": key}), uuid.uuid4()),
            )
    from_java = {m.key(): m.partition() for m in drain(settings.kafka, topic, expected=len(keys))}
    assert len(from_java) == len(keys)
    from_python = _produce(
        settings,
        make_topic(settings.kafka, f"test.py-partitioning.{unique}", 12),
        [k.encode() for k in keys],
    )
    assert from_java == from_python


@pytest.mark.parametrize("partitions", [1, 3, 12])
def test_java_partition_formula_is_positive(partitions: int) -> None:
    for key in (b"", b"a", b"\xff\xff\xff\xff"):
        assert 0 <= java_partition(key, partitions) < partitions
