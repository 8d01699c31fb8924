"""In-memory Kafka: the twin of the :class:`~streams.billing.ports.KafkaSource` and
:class:`~streams.billing.ports.KafkaSink` ports.

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

Not modelled: transactions, compaction and retention, ``max.poll.interval.ms`` and
session timeouts (use :meth:`~InMemoryKafka.lose`), KIP-848, asynchronous commit
errors (an asynchronous commit is applied when valid, dropped otherwise).
"""

from __future__ import annotations

import itertools
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, overload

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from streams.billing.ports import DeliveryReport, KafkaSource, RebalanceCallback
from streams.topics import TopicSpec

__all__ = [
    "DEFAULT_MESSAGE_MAX_BYTES",
    "InMemoryConsumer",
    "InMemoryKafka",
    "InMemoryProducer",
    "murmur2",
    "partition_for",
]

#: librdkafka's default ``message.max.bytes``.
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
#: ``TopicPartition.offset`` of an entry of ``assignment()`` (librdkafka's OFFSET_STORED).
_OFFSET_STORED = -1000
#: ``Message.timestamp()`` type of a producer's timestamp (TIMESTAMP_CREATE_TIME).
_CREATE_TIME = 1

Header = tuple[str, bytes | None]
TP = tuple[str, int]


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` (the Java client's partitioner hash), signed 32-bit."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(length // 4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length & ~3 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a keyed record: ``toPositive(murmur2(key)) % partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(frozen=True)
class _Stored:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] | None
    timestamp_ms: int


def _message(topic: str, partition: int, record: _Stored) -> Message:
    return Message(
        topic=topic,
        partition=partition,
        offset=record.offset,
        key=record.key,
        value=record.value,
        headers=list(record.headers) if record.headers is not None else None,
        timestamp=(_CREATE_TIME, record.timestamp_ms),
    )


def _error(code: int, reason: str | None = None) -> KafkaException:
    return KafkaException(KafkaError(code, reason) if reason else KafkaError(code))


@dataclass
class _Rebalance:
    generation: int
    revoked: list[TP]
    assigned: list[TP]


@dataclass
class _Lost:
    partitions: list[TP]


@dataclass
class _ErrorEvent:
    error: KafkaError


@dataclass
class _Group:
    group_id: str
    generation: int = 0
    #: member id → consumer, in join order
    members: dict[str, InMemoryConsumer] = field(default_factory=dict)
    #: (topic, partition) → next offset to read
    committed: dict[TP, int] = field(default_factory=dict)
    #: partitions revoked from a member that has not served the revocation yet
    pending: dict[TP, str] = field(default_factory=dict)


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
        self._topics: dict[str, list[list[_Stored]]] = {}
        self._groups: dict[str, _Group] = {}
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
                if any(name in member._topics for member in group.members.values()):
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
        """A producer (the :class:`~streams.billing.ports.KafkaSink` port)."""
        return InMemoryProducer(self)

    def consumer(
        self, group_id: str, *, auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    ) -> InMemoryConsumer:
        """A consumer of ``group_id`` (the :class:`~streams.billing.ports.KafkaSource`
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
            return [_message(topic, p, r) for p in numbers for r in logs[p]]

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
            return list(group.members.values()) if group is not None else []

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
            if consumer._member_id not in group.members:
                return
            self._leave(group, consumer)
            consumer._events.clear()
            consumer._events.append(_Lost(sorted(consumer._assignment)))
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
            consumer._events.append(_ErrorEvent(error))
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
            raise _error(KafkaError._UNKNOWN_TOPIC, f"Unknown topic {topic}")
        if partition < 0:
            partition = (
                partition_for(key, len(logs))
                if key is not None
                else next(self._round_robin) % len(logs)
            )
        elif partition >= len(logs):
            raise _error(KafkaError._UNKNOWN_PARTITION, f"Unknown partition {topic}[{partition}]")
        pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
        stored_headers = tuple(
            (name, data.encode() if isinstance(data, str) else data) for name, data in pairs
        )
        log = logs[partition]
        record = _Stored(len(log), key, value, stored_headers or None, int(self._clock() * 1000))
        log.append(record)
        self._cond.notify_all()
        return _message(topic, partition, record)

    def _group(self, group_id: str) -> _Group:
        group = self._groups.get(group_id)
        if group is None:
            group = self._groups[group_id] = _Group(group_id)
        return group

    def _join(self, consumer: InMemoryConsumer) -> None:
        group = self._group(consumer.group_id)
        consumer._member_id = f"rdkafka-{uuid.uuid4()}"
        consumer._owned = set()
        group.members[consumer._member_id] = consumer
        self._rebalance(group)

    def _leave(self, group: _Group, consumer: InMemoryConsumer) -> None:
        group.members.pop(consumer._member_id, None)
        consumer._owned = set()
        for tp in [tp for tp, member in group.pending.items() if member == consumer._member_id]:
            del group.pending[tp]

    def _rebalance(self, group: _Group) -> None:
        """A new generation: keep, revoke what must move, assign what is free."""
        group.generation += 1
        members = list(group.members.values())
        if not members:
            return
        eligible = {
            m._member_id: {
                (t, p) for t in m._topics if t in self._topics for p in range(len(self._topics[t]))
            }
            for m in members
        }
        every = set().union(*eligible.values())
        base, extra = divmod(len(every), len(members))
        by_size = sorted(members, key=lambda m: -len(m._owned & eligible[m._member_id]))
        quota = {m._member_id: base + (1 if i < extra else 0) for i, m in enumerate(by_size)}
        revoked: dict[str, list[TP]] = {}
        for m in members:
            keep = sorted(m._owned & eligible[m._member_id])
            surplus = max(0, len(keep) - quota[m._member_id])
            give = sorted(m._owned - eligible[m._member_id]) + keep[:surplus]
            revoked[m._member_id] = give
            m._owned -= set(give)
            for tp in give:
                group.pending[tp] = m._member_id
        taken = set(group.pending).union(*(m._owned for m in members))
        assigned: dict[str, list[TP]] = {m._member_id: [] for m in members}
        for tp in sorted(every - taken):
            candidates = [
                m
                for m in members
                if tp in eligible[m._member_id] and len(m._owned) < quota[m._member_id]
            ]
            if not candidates:
                continue
            chosen = min(candidates, key=lambda m: len(m._owned))
            chosen._owned.add(tp)
            assigned[chosen._member_id].append(tp)
        for m in members:
            m._events.append(
                _Rebalance(group.generation, revoked[m._member_id], assigned[m._member_id])
            )
        self._cond.notify_all()

    def _revoked(self, consumer: InMemoryConsumer, partitions: list[TP]) -> None:
        """``consumer`` served the revocation of ``partitions``: once nothing is pending,
        the next rebalance assigns what was held back."""
        group = self._groups[consumer.group_id]
        for tp in partitions:
            if group.pending.get(tp) == consumer._member_id:
                del group.pending[tp]
        if not group.pending and partitions:
            self._rebalance(group)

    def _take_produce_failure(self) -> BaseException | KafkaError | None:
        return self._produce_failures.popleft() if self._produce_failures else None

    def _take_commit_failure(self) -> KafkaError | None:
        return self._commit_failures.popleft() if self._commit_failures else None


class InMemoryProducer:
    """A producer of an :class:`InMemoryKafka` (the :class:`~streams.billing.ports.KafkaSink`
    port; see the module docstring)."""

    def __init__(self, kafka: InMemoryKafka) -> None:
        self._kafka = kafka
        self._reports: deque[tuple[DeliveryReport, KafkaError | None, Message]] = deque()
        self._lock = threading.Lock()

    def produce(
        self,
        topic: str,
        value: str | bytes | None = None,
        key: str | bytes | None = None,
        partition: int = -1,
        on_delivery: DeliveryReport | None = None,
        *,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        callback: DeliveryReport | None = None,
    ) -> None:
        """Write one record now; its report is served by :meth:`poll` / :meth:`flush`.

        Raises:
            KafkaException: ``MSG_SIZE_TOO_LARGE``, ``_UNKNOWN_TOPIC``, ``_UNKNOWN_PARTITION``.
            BaseException: an injected failure (:meth:`InMemoryKafka.fail_produce`).
        """
        report = on_delivery or callback
        raw_key = key.encode() if isinstance(key, str) else key
        raw_value = value.encode() if isinstance(value, str) else value
        size = (
            len(raw_key or b"")
            + len(raw_value or b"")
            + sum(
                len(name) + len(data.encode() if isinstance(data, str) else data or b"")
                for name, data in headers or []
            )
        )
        if size > self._kafka.message_max_bytes:
            raise _error(
                KafkaError.MSG_SIZE_TOO_LARGE,
                "Unable to produce message: Broker: Message size too large",
            )
        with self._kafka._cond:
            if topic not in self._kafka._topics:
                raise _error(KafkaError._UNKNOWN_TOPIC, f"Unknown topic {topic}")
            failure = self._kafka._take_produce_failure()
            if isinstance(failure, BaseException):
                raise failure
            if failure is not None:
                refused = Message(topic=topic, key=raw_key, value=raw_value, error=failure)
                self._queue(report, failure, refused)
                return
            delivered = self._kafka._append(topic, raw_key, raw_value, headers, partition)
        self._queue(report, None, delivered)

    def _queue(self, report: DeliveryReport | None, err: KafkaError | None, msg: Message) -> None:
        if report is not None:
            with self._lock:
                self._reports.append((report, err, msg))

    def poll(self, timeout: float = -1) -> int:
        """Serve the delivery reports queued so far; returns how many."""
        served = 0
        while True:
            with self._lock:
                if not self._reports:
                    return served
                report, err, msg = self._reports.popleft()
            report(err, msg)
            served += 1

    def flush(self, timeout: float = -1) -> int:
        """Serve every delivery report; returns 0 (nothing stays queued)."""
        self.poll(0)
        return 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._reports)


class InMemoryConsumer:
    """A consumer of an :class:`InMemoryKafka` (the :class:`~streams.billing.ports.KafkaSource`
    port; see the module docstring). Used by one thread at a time, like a librdkafka one.

    Attributes:
        group_id: its group.
        before_commit: a test hook: called with the offsets of each commit, on the
            committing thread, before the coordinator sees it (e.g. to check what the
            database holds at that moment). None: no hook.
    """

    def __init__(
        self,
        kafka: InMemoryKafka,
        group_id: str,
        *,
        auto_offset_reset: Literal["earliest", "latest"] = "earliest",
    ) -> None:
        self._kafka = kafka
        self.group_id = group_id
        self._reset = auto_offset_reset
        self._topics: list[str] = []
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        # the coordinator's side (guarded by the broker's lock)
        self._member_id = ""
        self._owned: set[TP] = set()
        self._events: deque[_Rebalance | _Lost | _ErrorEvent] = deque()
        # what this consumer knows (its thread only)
        self._generation = -1
        self._known_member_id = ""
        self._assignment: set[TP] = set()
        self._positions: dict[TP, int] = {}
        self._paused: set[TP] = set()
        self._next = 0
        self._closed = False
        self.before_commit: Callable[[list[TopicPartition]], None] | None = None

    # ------------------------------------------------------------------ membership

    def _alive(self) -> None:
        if self._closed:
            raise RuntimeError("Consumer closed")

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join the group for ``topics``; the assignment arrives at the next poll."""
        self._alive()
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        with self._kafka._cond:
            self._topics = list(topics)
            group = self._kafka._group(self.group_id)
            if self._member_id in group.members:
                self._kafka._rebalance(group)
            else:
                self._kafka._join(self)

    @property
    def member_id(self) -> str:
        """The member id the coordinator gave this consumer ("" when not in the group)."""
        with self._kafka._cond:
            return self._member_id

    def _call(self, callback: RebalanceCallback | None, partitions: Iterable[TP]) -> None:
        if callback is not None:
            target: KafkaSource = self
            callback(target, [TopicPartition(t, p) for t, p in sorted(partitions)])

    def _serve(self) -> KafkaError | None:
        """Serve pending rebalance events (callbacks on this thread); returns an error
        event if one comes first."""
        kafka = self._kafka
        while True:
            with kafka._cond:
                if not self._events:
                    return None
                event = self._events.popleft()
            if isinstance(event, _ErrorEvent):
                return event.error
            if isinstance(event, _Lost):
                self._known_member_id = ""
                lost = set(event.partitions)
                self._call(self._on_lost, lost)
                self._assignment -= lost
                for tp in lost:
                    self._positions.pop(tp, None)
                with kafka._cond:
                    if not self._closed:
                        kafka._join(self)
                continue
            self._generation = event.generation
            with kafka._cond:
                self._known_member_id = self._member_id
            if event.revoked:
                self._call(self._on_revoke, event.revoked)
                self._assignment -= set(event.revoked)
                for tp in event.revoked:
                    self._positions.pop(tp, None)
                with kafka._cond:
                    kafka._revoked(self, event.revoked)
            self._assignment |= set(event.assigned)
            self._call(self._on_assign, event.assigned)

    # ------------------------------------------------------------------ reading

    def poll(self, timeout: float = -1) -> Message | None:
        """One record or error event, waiting up to ``timeout`` seconds (< 0: for ever)."""
        found = self.consume(1, timeout)
        return found[0] if found else None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records, waiting up to ``timeout`` seconds for the first."""
        self._alive()
        deadline = None if timeout < 0 else time.monotonic() + timeout
        while True:
            error = self._serve()
            if error is not None:
                return [Message(error=error)]
            found = self._fetch(num_messages)
            if found:
                return found
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            with self._kafka._cond:
                if not self._events:
                    self._kafka._cond.wait(0.05 if remaining is None else min(remaining, 0.05))

    def _fetch(self, limit: int) -> list[Message]:
        kafka = self._kafka
        with kafka._cond:
            ready = sorted(self._assignment - self._paused)
            if not ready:
                return []
            start = self._next % len(ready)
            self._next += 1
            found: list[Message] = []
            for topic, partition in ready[start:] + ready[:start]:
                log = kafka._topics[topic][partition]
                position = self._positions.get((topic, partition))
                if position is None:
                    group = kafka._group(self.group_id)
                    position = group.committed.get(
                        (topic, partition), 0 if self._reset == "earliest" else len(log)
                    )
                take = log[position : position + limit - len(found)]
                self._positions[(topic, partition)] = position + len(take)
                found.extend(_message(topic, partition, record) for record in take)
                if len(found) >= limit:
                    break
            return found

    def assignment(self) -> list[TopicPartition]:
        """The partitions assigned to this consumer (as its callbacks were told)."""
        self._alive()
        return [TopicPartition(t, p, _OFFSET_STORED) for t, p in sorted(self._assignment)]

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Stop returning records of ``partitions`` (no error for one not assigned)."""
        self._alive()
        self._paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Return records of ``partitions`` again."""
        self._alive()
        self._paused -= {(tp.topic, tp.partition) for tp in partitions}

    def seek(self, partition: TopicPartition) -> None:
        """Continue reading at ``partition.offset`` (``OFFSET_BEGINNING`` / ``OFFSET_END`` too).

        Raises:
            KafkaException: ``_STATE``: the partition is not assigned.
        """
        self._alive()
        tp = (partition.topic, partition.partition)
        if tp not in self._assignment:
            raise _error(KafkaError._STATE, "Local: Erroneous state")
        with self._kafka._cond:
            end = len(self._kafka._topics[tp[0]][tp[1]])
        offset = partition.offset
        self._positions[tp] = (
            0 if offset == OFFSET_BEGINNING else end if offset == OFFSET_END else offset
        )

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The next offset to read of each of ``partitions`` (``OFFSET_INVALID`` if unknown)."""
        self._alive()
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                self._positions.get((tp.topic, tp.partition), OFFSET_INVALID),
            )
            for tp in partitions
        ]

    # ------------------------------------------------------------------ offsets

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
        """Commit ``offsets`` for the group (see the module docstring for refusals).

        Raises:
            KafkaException: (synchronous only) an injected failure,
                ``REBALANCE_IN_PROGRESS``, ``UNKNOWN_MEMBER_ID``.
            RuntimeError: the consumer is closed.
        """
        self._alive()
        if self.before_commit is not None:
            self.before_commit(list(offsets))
        kafka = self._kafka
        with kafka._cond:
            group = kafka._group(self.group_id)
            refusal: KafkaError | None = None
            failure = None if asynchronous else kafka._take_commit_failure()
            if failure is not None:
                refusal = failure
            elif self._member_id not in group.members:
                refusal = KafkaError(KafkaError.UNKNOWN_MEMBER_ID)
            elif any(isinstance(e, _Rebalance | _Lost) for e in self._events):
                refusal = KafkaError(KafkaError.REBALANCE_IN_PROGRESS)
            if refusal is not None:
                if asynchronous:
                    return None
                raise KafkaException(refusal)
            for tp in offsets:
                group.committed[(tp.topic, tp.partition)] = tp.offset
        if asynchronous:
            return None
        return [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in offsets]

    def committed(
        self, partitions: list[TopicPartition], timeout: float = -1
    ) -> list[TopicPartition]:
        """The group's committed offsets of ``partitions`` (``OFFSET_INVALID`` if none)."""
        self._alive()
        with self._kafka._cond:
            group = self._kafka._group(self.group_id)
            return [
                TopicPartition(
                    tp.topic,
                    tp.partition,
                    group.committed.get((tp.topic, tp.partition), OFFSET_INVALID),
                )
                for tp in partitions
            ]

    def consumer_group_metadata(self) -> bytes:
        """librdkafka's ``CGMDv2`` serialisation of this member's group metadata."""
        self._alive()
        return (
            b"CGMDv2:"
            + struct.pack("=i", self._generation)
            + self.group_id.encode()
            + b"\x00"
            + self._known_member_id.encode()
            + b"\x00\x01"
        )

    def close(self) -> None:
        """Revoke what this consumer has (``on_revoke``), leave the group, close.

        Raises:
            RuntimeError: it was closed already.
        """
        self._alive()
        kafka = self._kafka
        with kafka._cond:
            self._events.clear()
            group = kafka._groups.get(self.group_id)
            member = group is not None and self._member_id in group.members
        if member and self._assignment:
            self._call(self._on_revoke, self._assignment)
        with kafka._cond:
            self._closed = True
            if group is not None and member:
                kafka._leave(group, self)
                kafka._rebalance(group)
            self._assignment = set()
            self._member_id = ""
