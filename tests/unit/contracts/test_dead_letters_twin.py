"""The dead-letter sink's contract (tests/contracts/dead_letters.py) on the in-memory twin,
and what only the twin does (scripted delivery failures, its readers)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Message

from streams.adapters.memory.dead_letters import InMemoryDeadLetterSink, dlq_headers
from streams.core.billing.dead_letters import DeadLetterError
from tests.contracts.dead_letters import GROUP, DeadLetterHarness, DeadLetterSinkContract


class TestInMemoryDeadLetterSink(DeadLetterSinkContract):
    @pytest.fixture
    def harness(self) -> DeadLetterHarness:
        twin = InMemoryDeadLetterSink("dlq", GROUP)
        failing = InMemoryDeadLetterSink("dlq", GROUP)
        failing.fail_next(100)

        def read(n: int) -> list[Message]:
            records = twin.records()
            assert len(records) == n, records
            return records

        return DeadLetterHarness(sink=twin, read=read, failing=failing)


def test_fail_next_refuses_then_delivers() -> None:
    twin = InMemoryDeadLetterSink()
    twin.fail_next()
    kwargs: dict[str, Any] = dict(
        key=b"k",
        value=b"v",
        headers=[],
        source_topic="t",
        source_partition=0,
        source_offset=1,
        kind="invalid",
        reason="bad",
    )
    with pytest.raises(DeadLetterError):
        twin.publish(**kwargs)
    assert twin.records() == []
    twin.publish(**kwargs)
    assert twin.reasons() == ["bad"]
    assert dlq_headers(twin.records()[0])["dlq.source.offset"] == "1"
