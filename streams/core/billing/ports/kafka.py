"""The Kafka ports the loops use: a producer (:class:`KafkaSink`) and a consumer-group
member (:class:`KafkaSource`), typed with librdkafka's value types.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, SupportsBytes, overload

from confluent_kafka import KafkaError, Message, TopicPartition

#: The delivery report callback of :meth:`KafkaSink.produce`: ``(error or None, message)``;
#: on success the message carries its partition and offset.
DeliveryReport = Callable[[KafkaError | None, Message], None]


class KafkaSink(Protocol):
    """A Kafka producer (``confluent_kafka.Producer``, built by
    :func:`streams.adapters.kafka.make_producer`: murmur2 partitioner, idempotent,
    ``acks=all``).

    ``produce`` queues one record — partition chosen by the key's murmur2 (the Java
    client's partitioner), unless ``partition`` is given — and returns; the record's
    delivery report reaches ``on_delivery`` from a later :meth:`poll` or :meth:`flush`
    of this producer (on the caller's thread), with ``None`` and the delivered message
    (partition, offset), or with the error that refused it.

    Raises (from ``produce``):
        BufferError: the local queue is full.
        KafkaException: refused before queueing: ``MSG_SIZE_TOO_LARGE`` (larger than
            ``message.max.bytes``), ``_UNKNOWN_TOPIC``, …
    """

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        partition: int = -1,
        on_delivery: DeliveryReport | None = None,
    ) -> None:
        """Queue one record (see the class docstring)."""
        ...

    def poll(self, timeout: float = -1) -> int:
        """Serve delivery reports (waiting up to ``timeout`` seconds for one); returns
        how many were served."""
        ...

    def flush(self, timeout: float = -1) -> int:
        """Wait until every queued record is delivered (or refused) and its report
        served, at most ``timeout`` seconds; returns how many are still queued."""
        ...


#: A rebalance callback of :meth:`KafkaSource.subscribe`: ``(consumer, partitions)``.
RebalanceCallback = Callable[["KafkaSource", list[TopicPartition]], None]


class KafkaSource(Protocol):
    """A member of a Kafka consumer group (``confluent_kafka.Consumer`` built by
    :func:`streams.adapters.kafka.make_consumer`: auto-commit off, cooperative-sticky,
    no static membership).

    **Group membership.** :meth:`subscribe` joins the group; the group coordinator
    assigns the topics' partitions among the members. Every rebalance increments the
    group's generation. With cooperative-sticky assignment a member keeps the
    partitions it has across rebalances and only the partitions that move are
    revoked (``on_revoke``) from their owner before they are assigned
    (``on_assign``, incremental: the partitions added, possibly none) to another
    member. A member removed by the coordinator (session timeout, poll interval
    exceeded) gets ``on_lost`` with what it had, and rejoins under a new member id.
    The callbacks run on the caller's thread, inside :meth:`poll`, :meth:`consume`
    or :meth:`close` (which revokes what the member has before leaving).

    **Fencing token.** :meth:`consumer_group_metadata` is librdkafka's serialised
    group metadata, whose bytes are the ``CGMDv2`` format parsed by
    :func:`streams.adapters.kafka.parse_group_metadata`: the generation (the one of
    the last rebalance this member took part in; -1 before joining) and the member id.

    **Reading.** A newly assigned partition starts at the group's committed offset,
    else at ``auto.offset.reset``. :meth:`pause` stops returning a partition's records
    until :meth:`resume`; :meth:`seek` sets where reading continues. Records are
    ``confluent_kafka.Message`` objects (``headers()`` is ``None`` when a record has none;
    ``error()`` set on an error event instead of a record).

    **Offsets.** :meth:`commit` stores the next offset to read per partition for the
    group (auto-commit is off: nothing else commits); :meth:`committed` reads them back
    (``OFFSET_INVALID``, -1001, when none).

    Raises:
        KafkaException: with a ``KafkaError``: a commit refused by the coordinator
            (``REBALANCE_IN_PROGRESS``, ``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID``…),
            a seek of a partition not assigned (``_UNKNOWN_PARTITION``/``_STATE``).
        RuntimeError: any call after :meth:`close` ("Consumer closed").
    """

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join the group for ``topics`` (see the class docstring)."""
        ...

    def poll(self, timeout: float = -1) -> Message | None:
        """One record (or error event), waiting up to ``timeout`` seconds; None if none came."""
        ...

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records, waiting up to ``timeout`` seconds for them."""
        ...

    def assignment(self) -> list[TopicPartition]:
        """The partitions currently assigned to this member."""
        ...

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop returning records of ``partitions`` (kept across rebalances) until resumed."""
        ...

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Return records of ``partitions`` again."""
        ...

    def seek(self, partition: TopicPartition) -> None:
        """Continue reading ``partition.partition`` at ``partition.offset``."""
        ...

    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[True] = ...
    ) -> None: ...
    @overload
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: Literal[False]
    ) -> list[TopicPartition]: ...
    def commit(
        self, *, offsets: list[TopicPartition], asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        """Commit ``offsets`` (next offsets to read) for the group; synchronous returns
        the committed partitions, asynchronous reports only a local refusal."""
        ...

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """The group's committed offsets of ``partitions`` (``OFFSET_INVALID`` when none)."""
        ...

    def consumer_group_metadata(self) -> SupportsBytes:
        """The group metadata; ``bytes(...)`` of it is the ``CGMDv2`` format."""
        ...

    def close(self) -> None:
        """Revoke what this member has (``on_revoke``), leave the group, and close."""
        ...
