"""Contract of the :class:`~streams.core.billing.ports.DeadLetterSink` port: a published record is
on the dead-letter topic as it was read plus the ``dlq.*`` headers (docs/design.md, invariant 5);
one too large for the producer arrives truncated and says so; one that cannot be delivered raises
:class:`~streams.core.billing.dead_letters.DeadLetterError`.

Run on :class:`~streams.adapters.memory.dead_letters.InMemoryDeadLetterSink` (unit tier)
and on :class:`~streams.core.billing.dead_letters.DeadLetters` with a real producer and a
topic of its own on the stack's broker (integration tier). Size refusals by the
broker's topic configuration stay in ``tests/integration/test_dead_letters.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from confluent_kafka import Message

from streams.core.billing.dead_letters import TRUNCATED_VALUE_BYTES, DeadLetterError
from streams.core.billing.ports import DeadLetterSink

GROUP = "contract-group"


@dataclass
class DeadLetterHarness:
    """A sink publishing for consumer group :data:`GROUP`, a reader of its topic, and a
    sink that cannot deliver."""

    sink: DeadLetterSink
    #: The records on the sink's topic, waiting until there are ``n``.
    read: Callable[[int], list[Message]]
    failing: DeadLetterSink


def headers(msg: Message) -> list[tuple[str, bytes | None]]:
    raw = msg.headers() or []
    assert isinstance(raw, list)
    return [(name, value if not isinstance(value, str) else value.encode()) for name, value in raw]


def meta(msg: Message) -> dict[str, str]:
    return {
        name: (value or b"").decode() for name, value in headers(msg) if name.startswith("dlq.")
    }


class DeadLetterSinkContract:
    """The dead-letter sink's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> DeadLetterHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_a_record_is_dead_lettered_as_read_with_reason_and_source(
        self, harness: DeadLetterHarness
    ) -> None:
        original = [("ce_id", b"e-1"), ("ce_type", b"usage.recorded"), ("ce_id", b"dup")]
        before = datetime.now(UTC)
        harness.sink.publish(
            key=b"cust-1",
            value=b"\x00not json",
            headers=original,
            source_topic="billing.account-events.v1",
            source_partition=3,
            source_offset=42,
            kind="invalid",
            reason="value is not JSON: line 1",
        )
        (record,) = harness.read(1)
        assert (record.key(), record.value()) == (b"cust-1", b"\x00not json")
        assert headers(record)[: len(original)] == original  # original headers first, in order
        got = meta(record)
        assert got["dlq.reason"] == "value is not JSON: line 1"
        assert got["dlq.kind"] == "invalid"
        assert (got["dlq.source.topic"], got["dlq.source.partition"], got["dlq.source.offset"]) == (
            "billing.account-events.v1",
            "3",
            "42",
        )
        assert got["dlq.consumer.group"] == GROUP
        failed_at = datetime.fromisoformat(got["dlq.failed_at"].replace("Z", "+00:00"))
        assert failed_at.tzinfo is not None and failed_at >= before.replace(microsecond=0)
        assert "dlq.truncated" not in got

    def test_no_key_no_value_no_headers(self, harness: DeadLetterHarness) -> None:
        harness.sink.publish(
            key=None,
            value=None,
            headers=None,
            source_topic="t",
            source_partition=0,
            source_offset=1,
            kind="invalid",
            reason="empty record",
            attributed=False,
        )
        (record,) = harness.read(1)
        assert (record.key(), record.value()) == (None, None)
        assert set(meta(record)) >= {"dlq.reason", "dlq.kind", "dlq.source.offset"}

    def test_a_record_too_large_for_the_producer_arrives_truncated(
        self, harness: DeadLetterHarness
    ) -> None:
        value = bytes(range(256)) * 6000  # 1.5 MB, over message.max.bytes
        harness.sink.publish(
            key=b"cust-2",
            value=value,
            headers=[("ce_id", b"e-2"), ("blob", b"y" * 10_000)],
            source_topic="events",
            source_partition=1,
            source_offset=9,
            kind="conflict",
            reason="event id e-2 already recorded with a different payload",
        )
        (record,) = harness.read(1)
        assert record.value() == value[:TRUNCATED_VALUE_BYTES]
        got = meta(record)
        assert f"value {len(value)} -> {TRUNCATED_VALUE_BYTES} bytes" in got["dlq.truncated"]
        assert "1 of 2 headers dropped" in got["dlq.truncated"]
        assert "events[1]@9" in got["dlq.truncated"]
        assert got["dlq.kind"] == "conflict"
        kept = dict(headers(record))
        assert kept["ce_id"] == b"e-2" and "blob" not in kept

    def test_a_record_that_cannot_be_delivered_is_an_error(
        self, harness: DeadLetterHarness
    ) -> None:
        with pytest.raises(DeadLetterError):
            harness.failing.publish(
                key=b"cust-3",
                value=b"{}",
                headers=[],
                source_topic="t",
                source_partition=0,
                source_offset=5,
                kind="invalid",
                reason="r",
            )
