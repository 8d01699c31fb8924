"""The Kafka ports' contract (tests/contracts/kafka.py) on the in-memory Kafka, and what
only the twin does (forced rebalances, scripted produce and commit failures, error events)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams.adapters.kafka import parse_group_metadata
from streams.adapters.memory.kafka import InMemoryConsumer, InMemoryKafka, murmur2
from streams.core.billing.ports import KafkaSink, KafkaSource
from tests.contracts.kafka import (
    KafkaContract,
    KafkaHarness,
    Member,
    new_group,
    poll_until,
    settled,
)
from tests.support.kafka import murmur2 as independent_murmur2


class TestInMemoryKafka(KafkaContract):
    @pytest.fixture
    def harness(self) -> KafkaHarness:
        kafka = InMemoryKafka()
        names = iter(range(1_000_000))

        def topic(partitions: int) -> str:
            name = f"t{next(names)}"
            kafka.create_topic(name, partitions)
            return name

        def producer() -> KafkaSink:
            return kafka.producer()

        def consumer(group_id: str) -> KafkaSource:
            return kafka.consumer(group_id)

        def lose(victim: KafkaSource, alive: Sequence[KafkaSource]) -> None:
            assert isinstance(victim, InMemoryConsumer)
            kafka.lose(victim)

        return KafkaHarness(
            topic=topic, producer=producer, consumer=consumer, lose=lose, settle_s=5.0, quiet_s=0.1
        )


def test_murmur2_is_the_java_hash() -> None:
    keys = [b"", b"a", b"ab", b"abc", b"abcd", b"cust-42", "kundé-ü".encode(), bytes(range(256))]
    assert [murmur2(k) for k in keys] == [independent_murmur2(k) for k in keys]
    assert murmur2(b"21") == -973932308  # Kafka's own test vector (UtilsTest.testMurmur2)


def subscribed(kafka: InMemoryKafka, topic: str, group: str, n: int = 1) -> list[Member]:
    members = [Member(kafka.consumer(group)) for _ in range(n)]
    for member in members:
        member.subscribe(topic)
    partitions = kafka.partitions(topic)
    poll_until(members, settled(members, partitions), 5, "the assignment")
    return members


def test_a_forced_rebalance_bumps_every_generation_and_moves_nothing() -> None:
    kafka = InMemoryKafka()
    kafka.create_topic("t", 4)
    first, second = subscribed(kafka, "t", "g", 2)
    before = (first.metadata().generation_id, set(first.assigned), set(second.assigned))
    kafka.rebalance("g")
    first.poll()
    second.poll()
    assert first.metadata().generation_id == before[0] + 1 == kafka.generation("g")
    assert (set(first.assigned), set(second.assigned)) == before[1:]
    assert first.events[-1][:2] == second.events[-1][:2] == ("assign", [])


def test_a_commit_before_serving_a_rebalance_is_refused() -> None:
    kafka = InMemoryKafka()
    kafka.create_topic("t", 1)
    (member,) = subscribed(kafka, "t", "g")
    kafka.rebalance("g")
    with pytest.raises(KafkaException) as caught:
        member.consumer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
    assert caught.value.args[0].code() == KafkaError.REBALANCE_IN_PROGRESS
    member.poll()
    member.consumer.commit(offsets=[TopicPartition("t", 0, 1)], asynchronous=False)
    assert kafka.committed("g", "t") == {0: 1}


def test_scripted_commit_failures() -> None:
    kafka = InMemoryKafka()
    kafka.create_topic("t", 1)
    (member,) = subscribed(kafka, "t", "g")
    kafka.fail_commit(1, KafkaError(KafkaError.ILLEGAL_GENERATION))
    with pytest.raises(KafkaException) as caught:
        member.consumer.commit(offsets=[TopicPartition("t", 0, 3)], asynchronous=False)
    assert caught.value.args[0].code() == KafkaError.ILLEGAL_GENERATION
    assert kafka.committed("g", "t") == {}
    member.consumer.commit(offsets=[TopicPartition("t", 0, 3)], asynchronous=False)
    assert kafka.committed("g", "t") == {0: 3}


def test_scripted_produce_failures() -> None:
    kafka = InMemoryKafka()
    kafka.create_topic("t", 1)
    producer = kafka.producer()
    kafka.fail_produce(1)  # a delivery error
    kafka.fail_produce(1, BufferError("Local: Queue full"))
    reports: list[KafkaError | None] = []
    producer.produce("t", value=b"a", on_delivery=lambda err, _msg: reports.append(err))
    with pytest.raises(BufferError):
        producer.produce("t", value=b"b", on_delivery=lambda err, _msg: reports.append(err))
    producer.produce("t", value=b"c", on_delivery=lambda err, _msg: reports.append(err))
    assert len(producer) == 2
    assert producer.flush(1) == 0
    assert [None if e is None else e.code() for e in reports] == [KafkaError._MSG_TIMED_OUT, None]
    assert [m.value() for m in kafka.records("t")] == [b"c"]
    with pytest.raises(KafkaException) as caught:
        producer.produce("missing", value=b"x")
    assert caught.value.args[0].code() == KafkaError._UNKNOWN_TOPIC


def test_an_injected_error_event_is_polled_once() -> None:
    kafka = InMemoryKafka()
    kafka.create_topic("t", 1)
    consumer = kafka.consumer("g")
    consumer.subscribe(["t"])
    kafka.inject_error(consumer, KafkaError(KafkaError._FATAL, "fenced", fatal=True))
    msg = consumer.poll(1)
    assert msg is not None and msg.error() is not None
    assert msg.error().fatal()  # type: ignore[union-attr]
    assert consumer.poll(0.01) is None


def test_the_pause_flag_outlives_a_loss_and_reassignment() -> None:
    """As librdkafka 2.16 does (measured; streams/apps/invoicing/worker.py ``_on_assign``)."""
    kafka = InMemoryKafka()
    kafka.create_topic("t", 1)
    (member,) = subscribed(kafka, "t", "g")
    member.consumer.pause([TopicPartition("t", 0)])
    assert isinstance(member.consumer, InMemoryConsumer)
    kafka.lose(member.consumer)
    poll_until([member], lambda: member.assigned == {0} and "lost" in member.names(), 5, "back")
    kafka.append("t", value=b"x")
    member.poll(0.1)
    assert member.records == []  # still paused
    member.consumer.resume([TopicPartition("t", 0)])
    member.poll(0.1)
    assert [m.value() for m in member.records] == [b"x"]


def test_the_token_bytes_are_librdkafkas() -> None:
    kafka = InMemoryKafka()
    kafka.create_topic("t", 1)
    (member,) = subscribed(kafka, "t", "grp")
    raw = bytes(member.consumer.consumer_group_metadata())
    meta = parse_group_metadata(raw)
    assert raw.startswith(b"CGMDv2:") and raw.endswith(b"\x00\x01")
    assert (meta.group_id, meta.generation_id) == ("grp", kafka.generation("grp"))
    assert isinstance(member.consumer, InMemoryConsumer)
    assert meta.member_id == member.consumer.member_id


def test_a_topic_created_later_is_assigned() -> None:
    kafka = InMemoryKafka()
    member = Member(kafka.consumer(new_group()))
    member.subscribe("later")
    member.poll()
    assert member.assigned == set()
    kafka.create_topic("later", 2)
    poll_until([member], lambda: member.assigned == {0, 1}, 5, "the new topic")
