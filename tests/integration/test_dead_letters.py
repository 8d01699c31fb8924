"""Records too large for the dead-letter topic, against the real broker (streams/core/billing/dead_letters.py).

Both refusals librdkafka can give are exercised: the producer's own
``message.max.bytes`` (``produce`` raises) and the topic's ``max.message.bytes``
(the broker refuses, the delivery report carries the error). Either way the
record is dead-lettered truncated, with a ``dlq.truncated`` header, instead of
raising out of the worker (which restarted on the same record for ever).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest
from confluent_kafka.cimpl import NewTopic  # admin re-exports it untyped (no __all__)

from streams.adapters.kafka import admin_client, make_producer
from streams.core.billing.dead_letters import TRUNCATED_VALUE_BYTES, DeadLetters
from streams.settings import Settings
from tests.support.kafka import drain, headers_of, text

TOPIC_MAX_MESSAGE_BYTES = 8192
PRODUCER_MAX_MESSAGE_BYTES = 20_000


@pytest.fixture
def dlq_topic(settings: Settings, unique: str) -> Iterator[str]:
    name = f"t{unique}.dlq"
    admin = admin_client(settings.kafka)
    topic = NewTopic(
        name,
        num_partitions=1,
        replication_factor=1,
        config={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)},
    )
    admin.create_topics([topic])[name].result(30)
    yield name
    with contextlib.suppress(Exception):  # already gone: nothing to do
        admin.delete_topics([name], operation_timeout=30)[name].result(30)


@pytest.mark.parametrize(
    "size",
    [PRODUCER_MAX_MESSAGE_BYTES + 10_000, TOPIC_MAX_MESSAGE_BYTES + 4_000],
    ids=["refused-by-the-producer", "refused-by-the-broker"],
)
def test_an_oversized_record_is_dead_lettered_truncated(
    settings: Settings, dlq_topic: str, size: int
) -> None:
    producer = make_producer(settings.kafka, **{"message.max.bytes": PRODUCER_MAX_MESSAGE_BYTES})
    value = os.urandom(size)  # incompressible: the producer compresses batches
    DeadLetters(producer, dlq_topic, "invoicing-test", timeout_s=20).publish(
        key=b"cust-1",
        value=value,
        headers=[("ce_id", b"e-1")],
        source_topic="events",
        source_partition=2,
        source_offset=7,
        kind="invalid",
        reason="value is not JSON",
    )
    [record] = drain(settings.kafka, dlq_topic, expected=1, timeout_s=30)
    meta = {name: text(data) for name, data in headers_of(record)}
    assert record.key() == b"cust-1"
    assert record.value() == value[:TRUNCATED_VALUE_BYTES]
    assert meta["dlq.reason"] == "value is not JSON"
    assert (meta["dlq.source.topic"], meta["dlq.source.offset"]) == ("events", "7")
    assert f"value {len(value)} -> {TRUNCATED_VALUE_BYTES} bytes" in meta["dlq.truncated"]
    assert meta["ce_id"] == "e-1"
