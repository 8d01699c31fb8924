"""The Kafka ports' contract (tests/contracts/kafka.py) on confluent-kafka clients built as
the product builds them (:func:`streams.adapters.kafka.make_producer` /
:func:`~streams.adapters.kafka.make_consumer`) against the stack's real broker: a topic
and a group of their own per test, deleted afterwards.

Consumers run with a 6 s session timeout and ``max.poll.interval.ms``, so that "a member
loses its partitions" is a member that stops polling for longer than that."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest

from streams.adapters.kafka import admin_client, ensure_topics, make_consumer, make_producer
from streams.core.billing.ports import KafkaSink, KafkaSource
from streams.settings import Settings
from streams.topics import TopicSpec
from tests.contracts.kafka import KafkaContract, KafkaHarness

LOSS_S = 6_000  # session.timeout.ms and max.poll.interval.ms of the contract's consumers


class TestKafka(KafkaContract):
    @pytest.fixture
    def harness(self, settings: Settings) -> Iterator[KafkaHarness]:
        kafka = settings.kafka.model_copy(update={"group_protocol": "classic"})
        topics: list[str] = []
        consumers: list[KafkaSource] = []

        def topic(partitions: int) -> str:
            name = f"test.contract.{uuid.uuid4().hex[:10]}"
            ensure_topics(
                kafka,
                (TopicSpec(name=name, partitions=partitions, key="test", description="contract"),),
            )
            topics.append(name)
            return name

        def producer() -> KafkaSink:
            return make_producer(kafka)

        def consumer(group_id: str) -> KafkaSource:
            made = make_consumer(
                kafka,
                group_id,
                **{
                    "session.timeout.ms": LOSS_S,
                    "max.poll.interval.ms": LOSS_S,
                    "heartbeat.interval.ms": 1_000,
                },
            )
            consumers.append(made)
            return made

        def lose(victim: KafkaSource, alive: Sequence[KafkaSource]) -> None:
            # The victim stops polling: past max.poll.interval.ms librdkafka leaves the
            # group on its behalf and the coordinator moves its partitions.
            deadline = time.monotonic() + LOSS_S / 1000 + 2
            while time.monotonic() < deadline:
                for member in alive:
                    member.poll(0.1)

        yield KafkaHarness(
            topic=topic, producer=producer, consumer=consumer, lose=lose, settle_s=45.0
        )
        for made in consumers:
            with contextlib.suppress(RuntimeError):  # closed by the test
                made.close()
        if topics:
            admin = admin_client(kafka)
            for future in admin.delete_topics(topics, operation_timeout=30).values():
                future.result()
