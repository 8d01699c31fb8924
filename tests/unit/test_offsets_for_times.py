"""``offsets_for_times`` asks again while a partition's leadership settles, and only then.

The answers scripted below are the shapes librdkafka gives: a whole-request failure raises
``KafkaException(KafkaError)``; a per-partition failure comes back as a ``TopicPartition``
whose ``error`` is set (seen in CI as ``UNKNOWN_LEADER_EPOCH`` on one partition of a topic
created a moment before). The real broker's side is in the integration tier
(tests/integration/test_close_period.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streams.adapters import kafka
from streams.adapters.kafka import offsets_for_times


@dataclass
class Answered:
    """One partition of an answer, as ``TopicPartition`` but with ``error`` settable."""

    partition: int
    offset: int
    error: KafkaError | None = None
    topic: str = "t"


class Scripted:
    """Answers ``offsets_for_times`` from ``script``, one entry a call (an exception to
    raise or a list to return), and counts the calls."""

    def __init__(self, *script: Any) -> None:
        self.script = list(script)
        self.calls = 0

    def offsets_for_times(self, wanted: list[TopicPartition], timeout: float) -> Any:
        self.calls += 1
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        if isinstance(step, Exception):
            raise step
        return step


WANTED = [TopicPartition("t", 0, 1000), TopicPartition("t", 1, 1000)]
GOOD = [Answered(0, 5), Answered(1, 7)]


class _NoSleep:
    """``time`` with ``sleep`` a no-op (the waits are 0.2 s each)."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def sleep(_seconds: float) -> None:
        return None


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "time", _NoSleep())


@pytest.mark.parametrize(
    "code", [KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION]
)
def test_a_partition_settling_is_asked_again_until_it_answers(code: int) -> None:
    consumer = Scripted([Answered(0, 5), Answered(1, -1, KafkaError(code))], GOOD)
    assert offsets_for_times(consumer, WANTED) == GOOD  # type: ignore[arg-type]
    assert consumer.calls == 2


def test_a_whole_request_settling_is_asked_again() -> None:
    consumer = Scripted(KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE)), GOOD)
    assert offsets_for_times(consumer, WANTED) == GOOD  # type: ignore[arg-type]
    assert consumer.calls == 2


def test_another_partition_error_is_returned_at_once_for_the_caller_to_report() -> None:
    bad = [Answered(0, 5), Answered(1, -1, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]
    consumer = Scripted(bad)
    assert offsets_for_times(consumer, WANTED) == bad  # type: ignore[arg-type]
    assert consumer.calls == 1


def test_another_request_error_is_raised_at_once() -> None:
    consumer = Scripted(KafkaException(KafkaError(KafkaError._TIMED_OUT)))
    with pytest.raises(KafkaException):
        offsets_for_times(consumer, WANTED)  # type: ignore[arg-type]
    assert consumer.calls == 1


def test_settling_past_the_deadline_gives_the_last_answer_or_raises() -> None:
    settling = [Answered(0, -1, KafkaError(KafkaError.UNKNOWN_LEADER_EPOCH))]
    consumer = Scripted(settling)
    assert offsets_for_times(consumer, WANTED, settle_s=0.0) == settling  # type: ignore[arg-type]
    assert consumer.calls == 1  # already past the deadline: not asked again

    raising = Scripted(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
    with pytest.raises(KafkaException):
        offsets_for_times(raising, WANTED, settle_s=0.0)  # type: ignore[arg-type]
