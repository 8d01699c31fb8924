"""The dead-letter sink's contract (tests/contracts/dead_letters.py) on
:class:`~streams.core.billing.dead_letters.DeadLetters` with a real producer
(:func:`streams.adapters.kafka.make_producer`) and a topic of its own on the stack's
broker; "cannot deliver" is a topic that does not exist (the broker does not create
topics) with a short delivery timeout."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Message

from streams.adapters.kafka import admin_client, ensure_topics, make_producer
from streams.core.billing.dead_letters import DeadLetters
from streams.settings import Settings
from streams.topics import TopicSpec
from tests.contracts.dead_letters import GROUP, DeadLetterHarness, DeadLetterSinkContract
from tests.support.kafka import drain


class TestDeadLetters(DeadLetterSinkContract):
    @pytest.fixture
    def harness(self, settings: Settings) -> Iterator[DeadLetterHarness]:
        kafka = settings.kafka
        topic = f"test.contract.dlq.{uuid.uuid4().hex[:10]}"
        ensure_topics(kafka, (TopicSpec(name=topic, partitions=1, key="k", description="dlq"),))

        def read(n: int) -> list[Message]:
            records = drain(kafka, topic, expected=n, timeout_s=30, idle_s=2)
            assert len(records) == n, records
            return records

        failing = DeadLetters(
            make_producer(kafka, **{"message.timeout.ms": 1500}),
            f"test.contract.missing.{uuid.uuid4().hex[:10]}",
            GROUP,
            timeout_s=5,
        )
        yield DeadLetterHarness(
            sink=DeadLetters(make_producer(kafka), topic, GROUP, timeout_s=30),
            read=read,
            failing=failing,
        )
        admin = admin_client(kafka)
        for future in admin.delete_topics([topic], operation_timeout=30).values():
            future.result()
