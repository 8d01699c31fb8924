"""The in-memory Kafka's clients: a producer and a consumer with librdkafka's surface.

:class:`InMemoryProducer` and :class:`InMemoryConsumer` implement the
:class:`~streams.core.billing.ports.KafkaSink` and
:class:`~streams.core.billing.ports.KafkaSource` ports over an
:class:`~streams.adapters.memory.kafka.InMemoryKafka` (what they keep of librdkafka's
behaviour: that module's docstring). Build them with
:meth:`~streams.adapters.memory.kafka.InMemoryKafka.producer` and
:meth:`~streams.adapters.memory.kafka.InMemoryKafka.consumer`.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Literal, overload

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from streams.adapters.memory.kafka_coordinator import ErrorEvent, Lost, Membership, Rebalance
from streams.adapters.memory.kafka_records import OFFSET_STORED, TP, kafka_exception, to_message
from streams.core.billing.ports import DeliveryReport, KafkaSource, RebalanceCallback

if TYPE_CHECKING:
    from streams.adapters.memory.kafka import InMemoryKafka


class InMemoryProducer:
    """A producer of an :class:`InMemoryKafka` (the :class:`~streams.core.billing.ports.KafkaSink`
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
            raise kafka_exception(
                KafkaError.MSG_SIZE_TOO_LARGE,
                "Unable to produce message: Broker: Message size too large",
            )
        with self._kafka._cond:
            if topic not in self._kafka._topics:
                raise kafka_exception(KafkaError._UNKNOWN_TOPIC, f"Unknown topic {topic}")
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
    """A consumer of an :class:`InMemoryKafka` (the :class:`~streams.core.billing.ports.KafkaSource`
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
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        #: the coordinator's side (guarded by the broker's lock)
        self.membership = Membership()
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
            self.membership.topics = list(topics)
            group = self._kafka._group(self.group_id)
            if self.membership.member_id in group.members:
                self._kafka._rebalance(group)
            else:
                self._kafka._join(self)

    @property
    def member_id(self) -> str:
        """The member id the coordinator gave this consumer ("" when not in the group)."""
        with self._kafka._cond:
            return self.membership.member_id

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
                if not self.membership.events:
                    return None
                event = self.membership.events.popleft()
            if isinstance(event, ErrorEvent):
                return event.error
            if isinstance(event, Lost):
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
                self._known_member_id = self.membership.member_id
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
                if not self.membership.events:
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
                found.extend(to_message(topic, partition, record) for record in take)
                if len(found) >= limit:
                    break
            return found

    def assignment(self) -> list[TopicPartition]:
        """The partitions assigned to this consumer (as its callbacks were told)."""
        self._alive()
        return [TopicPartition(t, p, OFFSET_STORED) for t, p in sorted(self._assignment)]

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
            raise kafka_exception(KafkaError._STATE, "Local: Erroneous state")
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
            elif self.membership.member_id not in group.members:
                refusal = KafkaError(KafkaError.UNKNOWN_MEMBER_ID)
            elif any(isinstance(e, Rebalance | Lost) for e in self.membership.events):
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
            self.membership.events.clear()
            group = kafka._groups.get(self.group_id)
            member = group is not None and self.membership.member_id in group.members
        if member and self._assignment:
            self._call(self._on_revoke, self._assignment)
        with kafka._cond:
            self._closed = True
            if group is not None and member:
                kafka._leave(group, self)
                kafka._rebalance(group)
            self._assignment = set()
            self.membership.member_id = ""
