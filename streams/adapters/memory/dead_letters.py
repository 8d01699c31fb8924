"""Twin of the :class:`~streams.core.billing.ports.DeadLetterSink` port.

:class:`InMemoryDeadLetterSink` is the real sink, :class:`streams.core.billing.dead_letters.DeadLetters`
(the same ``dlq.*`` headers, the same truncation of records too large for the topic,
the same :class:`~streams.core.billing.dead_letters.DeadLetterError`\\ s), publishing to a
topic of an :class:`~streams.adapters.memory.kafka.InMemoryKafka` — as the tax twin
runs the fake tax service's own engine — with readers for what was dead-lettered and
:meth:`~InMemoryDeadLetterSink.fail_next` to refuse deliveries.

A worker built on an :class:`~streams.adapters.memory.kafka.InMemoryKafka` producer
builds its own ``DeadLetters`` on it: read its dead letters with
:meth:`InMemoryKafka.records <streams.adapters.memory.kafka.InMemoryKafka.records>`
of its dead-letter topic; :func:`dlq_headers` decodes their headers.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message

from streams.adapters.memory.kafka import InMemoryKafka
from streams.core.billing.dead_letters import DeadLetters

__all__ = ["InMemoryDeadLetterSink", "dlq_headers"]


def dlq_headers(msg: Message) -> dict[str, str]:
    """The ``dlq.*`` headers of a dead-letter record, decoded (UTF-8, replacing errors)."""
    raw = msg.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else raw
    return {
        name: (data.encode() if isinstance(data, str) else data or b"").decode(errors="replace")
        for name, data in pairs
        if name.startswith("dlq.")
    }


class InMemoryDeadLetterSink:
    """:class:`~streams.core.billing.dead_letters.DeadLetters` on an in-memory topic.

    Args:
        topic: the dead-letter topic (created with one partition if missing).
        group_id: the consumer group named in ``dlq.consumer.group``.
        kafka: the in-memory Kafka (default: a new one).
    """

    def __init__(
        self, topic: str = "dlq", group_id: str = "test", *, kafka: InMemoryKafka | None = None
    ) -> None:
        self.kafka = kafka if kafka is not None else InMemoryKafka()
        self.topic = topic
        try:
            self.kafka.partitions(topic)
        except KeyError:
            self.kafka.create_topic(topic, 1)
        self._sink = DeadLetters(self.kafka.producer(), topic, group_id, timeout_s=1.0)

    def publish(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        source_topic: str,
        source_partition: int,
        source_offset: int,
        kind: str,
        reason: str,
        attributed: bool = True,
    ) -> None:
        """See :meth:`streams.core.billing.dead_letters.DeadLetters.publish`."""
        self._sink.publish(
            key=key,
            value=value,
            headers=headers,
            source_topic=source_topic,
            source_partition=source_partition,
            source_offset=source_offset,
            kind=kind,
            reason=reason,
            attributed=attributed,
        )

    def fail_next(self, count: int = 1) -> None:
        """The next ``count`` records are not delivered (a delivery timeout): ``publish``
        raises :class:`~streams.core.billing.dead_letters.DeadLetterError`."""
        self.kafka.fail_produce(count, KafkaError(KafkaError._MSG_TIMED_OUT))

    def records(self) -> list[Message]:
        """Every dead-letter record published, oldest first."""
        return self.kafka.records(self.topic)

    def reasons(self) -> list[str]:
        """The ``dlq.reason`` of every dead-letter record, oldest first."""
        return [dlq_headers(msg).get("dlq.reason", "") for msg in self.records()]
