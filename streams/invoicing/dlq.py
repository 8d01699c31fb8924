"""The dead-letter topic: bad records leave the partition with a reason, never silently.

A dead-lettered record keeps its original key, value and headers, plus headers
that say why and where it came from (DESIGN §3, invariant 5):

=========================  =====================================================
``dlq.reason``              human-readable reason (what was wrong, which field)
``dlq.kind``                ``invalid`` (undecodable/invalid), ``conflict`` (same
                            event id, different payload), ``rejected`` (a close
                            marker whose invoice was refused by a permanent rule)
``dlq.source.topic``        topic the record was read from
``dlq.source.partition``    its partition
``dlq.source.offset``       its offset
``dlq.consumer.group``      the group that dead-lettered it
``dlq.failed_at``           UTC time, ISO 8601
=========================  =====================================================

:meth:`DeadLetters.publish` returns only once the broker acknowledged the
record, so the caller may then commit the source offset.
"""

from __future__ import annotations

from datetime import UTC, datetime

from confluent_kafka import KafkaError, Message, Producer

from streams.invoicing.metrics import DEAD_LETTERED


class DeadLetterError(Exception):
    """The dead-letter record could not be delivered (transient: retry the batch)."""


class DeadLetters:
    """Publishes dead-letter records to one topic and waits for their delivery."""

    def __init__(
        self, producer: Producer, topic: str, group_id: str, timeout_s: float = 30.0
    ) -> None:
        self._producer = producer
        self.topic = topic
        self._group_id = group_id
        self._timeout_s = timeout_s

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
    ) -> None:
        """Dead-letter one record and wait for the broker's acknowledgement.

        Raises:
            DeadLetterError: not delivered within the timeout.
        """
        errors: list[KafkaError] = []
        delivered: list[bool] = []

        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered.append(True)

        extra = [
            ("dlq.reason", reason.encode()),
            ("dlq.kind", kind.encode()),
            ("dlq.source.topic", source_topic.encode()),
            ("dlq.source.partition", str(source_partition).encode()),
            ("dlq.source.offset", str(source_offset).encode()),
            ("dlq.consumer.group", self._group_id.encode()),
            ("dlq.failed_at", datetime.now(UTC).isoformat().replace("+00:00", "Z").encode()),
        ]
        self._producer.produce(
            self.topic, key=key, value=value, headers=[*(headers or []), *extra], on_delivery=report
        )
        remaining = self._producer.flush(self._timeout_s)
        if errors or remaining or not delivered:
            raise DeadLetterError(
                f"dead-letter record for {source_topic}[{source_partition}]@{source_offset} not delivered: "
                f"{errors[0] if errors else 'timeout'}"
            )
        DEAD_LETTERED.labels(kind).inc()
