"""In-memory Kafka: the twin of the :class:`~streams.core.billing.ports.KafkaSource` and
:class:`~streams.core.billing.ports.KafkaSink` ports.

:class:`InMemoryKafka` is a broker with topics (partitions of ordered records, each
with its offset), consumer groups (a coordinator, committed offsets) and clients
(:meth:`InMemoryKafka.consumer`, :meth:`InMemoryKafka.producer`) that speak the
subset of ``confluent_kafka.Consumer`` / ``Producer`` the loops use, with
librdkafka's value types (``Message``, ``TopicPartition``, ``KafkaError``) and
exceptions, so the code under test cannot tell. What is kept, as measured against
librdkafka 2.16 and the stack's Kafka 4.3 broker (``tests/contracts/kafka.py`` runs
the same checks on both):

* **Partitioning.** A keyed record goes to ``murmur2(key) & 0x7fffffff % partitions``
  (the Java client's partitioner, librdkafka's ``murmur2_random``); a record without
  a key round-robin. Delivery reports reach ``on_delivery`` from the producer's
  :meth:`~InMemoryProducer.poll` / :meth:`~InMemoryProducer.flush`; a record larger
  than ``message.max.bytes`` (1,000,000) is refused by ``produce`` with
  ``MSG_SIZE_TOO_LARGE``; headers come back as ``[(name, bytes | None)]``, or
  ``None`` when a record has none.
* **The group coordinator** (classic protocol, cooperative-sticky). Every rebalance
  bumps the group's generation and reaches every member (``on_assign`` with the
  partitions added, possibly none). A member keeps what it has; partitions are
  spread evenly; a partition that must move is first revoked from its owner
  (``on_revoke``) and assigned to its new owner only in the next rebalance, once
  the owner served the revocation (librdkafka's incremental protocol: a join costs
  two generations). A member that leaves (:meth:`~InMemoryConsumer.close`: its
  ``on_revoke`` first) frees its partitions at once. Callbacks run on the
  consumer's thread, inside ``poll`` / ``consume`` / ``close``.
* **The fencing token.** :meth:`~InMemoryConsumer.consumer_group_metadata` returns
  librdkafka's ``CGMDv2`` bytes (magic, generation as a host-order int32, group id,
  member id, no instance id), so :func:`streams.adapters.kafka.parse_group_metadata`
  works on the twin: generation -1 and member id ``""`` before the first rebalance
  the member served; the generation of the last one after.
* **Reading and offsets.** A newly assigned partition starts at the group's committed
  offset, else at the beginning (``auto.offset.reset=earliest``) or the end
  (``latest``); ``pause`` (a flag kept across revoke and re-assignment, as librdkafka
  keeps it) / ``resume`` (no error for a partition not assigned); ``seek`` of a
  partition not assigned raises ``KafkaException(_STATE)``; a synchronous commit
  from a member with a rebalance it has not served raises ``REBALANCE_IN_PROGRESS``,
  from a member no longer in the group ``UNKNOWN_MEMBER_ID``; ``committed`` gives
  ``OFFSET_INVALID`` (-1001) where nothing is committed; after ``close`` every call
  raises ``RuntimeError("Consumer closed")``.

Test hooks on :class:`InMemoryKafka`: :meth:`~InMemoryKafka.rebalance` (force one: a
new generation, nothing moves), :meth:`~InMemoryKafka.lose` (the member's partitions
are lost, as after a session timeout: the coordinator reassigns them at once, the
member gets ``on_lost`` at its next poll and rejoins under a new member id),
:meth:`~InMemoryKafka.fail_produce`, :meth:`~InMemoryKafka.fail_commit`,
:meth:`~InMemoryKafka.inject_error` (an error event for a consumer's next poll), and
readers (:meth:`~InMemoryKafka.records`, :meth:`~InMemoryKafka.committed`,
:meth:`~InMemoryKafka.generation`).

Layout: this module is the broker (topics, groups, test hooks); the clients are in
:mod:`~streams.adapters.memory.kafka_clients`, the group coordinator in
:mod:`~streams.adapters.memory.kafka_coordinator`, partitioning and the record values
in :mod:`~streams.adapters.memory.kafka_records`.

Not modelled: transactions, compaction and retention, ``max.poll.interval.ms`` and
session timeouts (use :meth:`~InMemoryKafka.lose`), KIP-848, asynchronous commit
errors (an asynchronous commit is applied when valid, dropped otherwise).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from confluent_kafka import KafkaError, Message

from streams.adapters.memory.kafka_clients import InMemoryConsumer, InMemoryProducer
from streams.adapters.memory.kafka_coordinator import ErrorEvent, Group, Lost, Membership
from streams.adapters.memory.kafka_records import (
    DEFAULT_MESSAGE_MAX_BYTES,
    TP,
    Stored,
    kafka_exception,
    murmur2,
    partition_for,
    to_message,
)
from streams.topics import TopicSpec

__all__ = [
    "DEFAULT_MESSAGE_MAX_BYTES",
    "InMemoryConsumer",
    "InMemoryKafka",
    "InMemoryProducer",
    "murmur2",
    "partition_for",
]


class InMemoryKafka:
    """A Kafka cluster in memory (module docstring). Thread-safe.

    Args:
        message_max_bytes: the producers' ``message.max.bytes``.
        clock: wall-clock seconds, for record timestamps.
    """

    def __init__(
        self,
        *,
        message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.message_max_bytes = message_max_bytes
        self._clock = clock
        self._cond = threading.Condition(threading.RLock())
        self._topics: dict[str, list[list[Stored]]] = {}
        self._groups: dict[str, Group] = {}
        #: membership → the consumer it belongs to
        self._members: dict[Membership, InMemoryConsumer] = {}
        self._produce_failures: deque[BaseException | KafkaError] = deque()
        self._commit_failures: deque[KafkaError] = deque()
        self._round_robin = itertools.count()

    # ------------------------------------------------------------------ topics

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Create topic ``name`` (idempotent). Groups subscribed to it rebalance.

        Raises:
            ValueError: it exists with another number of partitions.
        """
        with self._cond:
            existing = self._topics.get(name)
            if existing is not None:
                if len(existing) != partitions:
                    raise ValueError(f"topic {name} exists with {len(existing)} partitions")
                return
            self._topics[name] = [[] for _ in range(partitions)]
            for group in self._groups.values():
                if any(name in member.topics for member in group.members.values()):
                    self._rebalance(group)
            self._cond.notify_all()

    def create_topics(self, specs: Iterable[TopicSpec]) -> None:
        """Create the registry's topics (``spec.name``, ``spec.partitions``)."""
        for spec in specs:
            self.create_topic(spec.name, spec.partitions)

    def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has.

        Raises:
            KeyError: no such topic.
        """
        with self._cond:
            return len(self._topics[topic])

    # ------------------------------------------------------------------ clients

    def producer(self) -> InMemoryProducer:
        """A producer (the :class:`~streams.core.billing.ports.KafkaSink` port)."""
        return InMemoryProducer(self)

    def consumer(
        self, group_id: str, *, auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    ) -> InMemoryConsumer:
        """A consumer of ``group_id`` (the :class:`~streams.core.billing.ports.KafkaSource`
        port); it joins the group on :meth:`~InMemoryConsumer.subscribe`."""
        return InMemoryConsumer(self, group_id, auto_offset_reset=auto_offset_reset)

    # ------------------------------------------------------------------ reading, for tests

    def append(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: Sequence[tuple[str, str | bytes | None]] | None = None,
        partition: int | None = None,
    ) -> Message:
        """Write one record directly (as a producer whose report is already served);
        returns it with its partition and offset.

        Raises:
            KafkaException: unknown topic or partition.
        """
        with self._cond:
            return self._append(topic, key, value, headers, -1 if partition is None else partition)

    def records(self, topic: str, partition: int | None = None) -> list[Message]:
        """Every record of ``topic`` (or of one partition), by partition then offset."""
        with self._cond:
            logs = self._topics[topic]
            numbers = range(len(logs)) if partition is None else [partition]
            return [to_message(topic, p, r) for p in numbers for r in logs[p]]

    def end_offsets(self, topic: str) -> dict[int, int]:
        """partition → the offset the next record will get (the high watermark)."""
        with self._cond:
            return {p: len(log) for p, log in enumerate(self._topics[topic])}

    def committed(self, group_id: str, topic: str) -> dict[int, int]:
        """partition → the committed offset of ``group_id`` on ``topic`` (only those committed)."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return {}
            return {p: o for (t, p), o in group.committed.items() if t == topic}

    def generation(self, group_id: str) -> int:
        """The group's current generation (0: it never had a member)."""
        with self._cond:
            group = self._groups.get(group_id)
            return group.generation if group is not None else 0

    def members(self, group_id: str) -> list[InMemoryConsumer]:
        """The group's current members, in join order."""
        with self._cond:
            group = self._groups.get(group_id)
            if group is None:
                return []
            return [self._members[m] for m in group.members.values()]

    # ------------------------------------------------------------------ test hooks

    def rebalance(self, group_id: str) -> None:
        """Force a rebalance of ``group_id``: a new generation for every member, which
        keeps what it has (unless the assignment was uneven)."""
        with self._cond:
            self._rebalance(self._groups[group_id])

    def lose(self, consumer: InMemoryConsumer) -> None:
        """``consumer``'s partitions are lost (its session expired): the coordinator
        removes it and reassigns them at once; at its next poll it gets ``on_lost``
        with what it had, then rejoins under a new member id."""
        with self._cond:
            group = self._groups[consumer.group_id]
            membership = consumer.membership
            if membership.member_id not in group.members:
                return
            self._leave(group, consumer)
            membership.events.clear()
            membership.events.append(Lost(sorted(consumer._assignment)))
            self._rebalance(group)
            self._cond.notify_all()

    def fail_produce(self, count: int = 1, error: BaseException | KafkaError | None = None) -> None:
        """The next ``count`` records produced fail: an exception is raised by ``produce``
        (e.g. ``BufferError``), a ``KafkaError`` is their delivery report's error (the
        record is not written). Default: ``KafkaError(_MSG_TIMED_OUT)`` reported."""
        with self._cond:
            for _ in range(count):
                self._produce_failures.append(
                    error if error is not None else KafkaError(KafkaError._MSG_TIMED_OUT)
                )

    def fail_commit(self, count: int = 1, error: KafkaError | None = None) -> None:
        """The next ``count`` synchronous commits raise ``KafkaException(error)`` (default
        ``REBALANCE_IN_PROGRESS``) and store nothing."""
        with self._cond:
            for _ in range(count):
                self._commit_failures.append(
                    error if error is not None else KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
                )

    def inject_error(self, consumer: InMemoryConsumer, error: KafkaError) -> None:
        """``consumer``'s next poll returns an error event carrying ``error``."""
        with self._cond:
            consumer.membership.events.append(ErrorEvent(error))
            self._cond.notify_all()

    # ------------------------------------------------------------------ internals (lock held)

    def _append(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None,
        partition: int,
    ) -> Message:
        logs = self._topics.get(topic)
        if logs is None:
            raise kafka_exception(KafkaError._UNKNOWN_TOPIC, f"Unknown topic {topic}")
        if partition < 0:
            partition = (
                partition_for(key, len(logs))
                if key is not None
                else next(self._round_robin) % len(logs)
            )
        elif partition >= len(logs):
            raise kafka_exception(
                KafkaError._UNKNOWN_PARTITION, f"Unknown partition {topic}[{partition}]"
            )
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        stored_headers = tuple(
            (name, data.encode() if isinstance(data, str) else data) for name, data in pairs
        )
        log = logs[partition]
        record = Stored(len(log), key, value, stored_headers or None, int(self._clock() * 1000))
        log.append(record)
        self._cond.notify_all()
        return to_message(topic, partition, record)

    def _group(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = Group(group_id)
        return group

    def _sizes(self) -> dict[str, int]:
        return {name: len(logs) for name, logs in self._topics.items()}

    def _join(self, consumer: InMemoryConsumer) -> None:
        self._members[consumer.membership] = consumer
        self._group(consumer.group_id).join(consumer.membership, self._sizes())
        self._cond.notify_all()

    def _leave(self, group: Group, consumer: InMemoryConsumer) -> None:
        group.leave(consumer.membership)

    def _rebalance(self, group: Group) -> None:
        group.rebalance(self._sizes())
        self._cond.notify_all()

    def _revoked(self, consumer: InMemoryConsumer, partitions: list[TP]) -> None:
        """``consumer`` served the revocation of ``partitions``."""
        self._groups[consumer.group_id].served_revocation(
            consumer.membership, partitions, self._sizes()
        )
        self._cond.notify_all()

    def _take_produce_failure(self) -> BaseException | KafkaError | None:
        return self._produce_failures.popleft() if self._produce_failures else None

    def _take_commit_failure(self) -> KafkaError | None:
        return self._commit_failures.popleft() if self._commit_failures else None
