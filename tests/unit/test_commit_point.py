"""A synchronous offset commit waits at most ``wait_s`` (streams/core/billing/commit.py):
a commit the group coordinator never answers must not stop the caller's poll loop."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams.core.billing.commit import CommitPoint
from streams.core.billing.metrics import OFFSET_COMMIT_FAILURES


class Consumer:
    """A consumer whose synchronous commits wait for ``release`` (when ``hold`` is set)."""

    def __init__(self) -> None:
        self.hold = False
        self.release = threading.Event()
        self.calls: list[tuple[list[TopicPartition], str]] = []
        self.refuse: KafkaError | None = None

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        self.calls.append((offsets, threading.current_thread().name))
        if self.hold:
            self.release.wait(30)
        if self.refuse is not None:
            raise KafkaException(self.refuse)
        return offsets


def _failures() -> float:
    return float(OFFSET_COMMIT_FAILURES._value.get())


def test_a_commit_the_coordinator_never_answers_is_refused_after_wait_s() -> None:
    consumer = Consumer()
    point = CommitPoint(consumer, wait_s=0.3)  # type: ignore[arg-type]
    consumer.hold = True
    before = _failures()
    started = time.monotonic()
    assert point.commit([TopicPartition("t", 0, 5)]) is False
    assert 0.25 < time.monotonic() - started < 5
    # while it waits, a later commit is refused at once and never queued behind it
    started = time.monotonic()
    assert point.commit([TopicPartition("t", 0, 6)]) is False
    assert time.monotonic() - started < 0.2
    assert len(consumer.calls) == 1 and consumer.calls[0][1] == "offset-commit"
    assert _failures() == before + 2
    consumer.hold = False
    consumer.release.set()  # the coordinator answers at last
    deadline = time.monotonic() + 5
    while point.commit([TopicPartition("t", 0, 7)]) is False and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [offsets[0].offset for offsets, _ in consumer.calls][-1] == 7


def test_a_refusal_within_wait_s_is_reported_as_before() -> None:
    consumer = Consumer()
    consumer.refuse = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
    point = CommitPoint(consumer, wait_s=5)  # type: ignore[arg-type]
    before = _failures()
    assert point.commit([TopicPartition("t", 1, 9)]) is False
    assert _failures() == before + 1
    consumer.refuse = None
    assert point.commit([TopicPartition("t", 1, 9)]) is True


def test_without_wait_s_the_commit_runs_on_the_callers_thread() -> None:
    consumer = Consumer()
    point = CommitPoint(consumer)  # type: ignore[arg-type]
    assert point.commit([TopicPartition("t", 2, 1)]) is True
    assert consumer.calls[0][1] == threading.current_thread().name
