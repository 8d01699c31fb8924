"""Contract of the Kafka ports: :class:`~streams.core.billing.ports.KafkaSink` (a producer) and
:class:`~streams.core.billing.ports.KafkaSource` (a consumer-group member).

Run on :class:`~streams.adapters.memory.kafka.InMemoryKafka` (unit tier) and on
confluent-kafka clients against the stack's Kafka broker (integration tier). A
subclass provides the ``harness`` fixture. The checks are what the loops rely on
(partitioning as Java's, headers, the cooperative rebalance and its callbacks, the
fencing token's bytes, offsets, pause/resume/seek, close, a lost member), written
so that they hold whatever the timing of a real broker.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from streams.adapters.kafka import GroupMetadata, group_metadata
from streams.core.billing.ports import KafkaSink, KafkaSource
from tests.support.kafka import java_partition


@dataclass
class KafkaHarness:
    """Factories of the implementation under test."""

    #: A new topic with ``n`` partitions (deleted after the test by the harness).
    topic: Callable[[int], str]
    producer: Callable[[], KafkaSink]
    #: A new consumer of group ``group_id`` (closed after the test by the harness
    #: unless the test closed it).
    consumer: Callable[[str], KafkaSource]
    #: Make ``victim`` lose its partitions (its session expires) while ``alive``
    #: keep polling; returns once the coordinator has removed it.
    lose: Callable[[KafkaSource, Sequence[KafkaSource]], None]
    #: Longest wait for a rebalance to settle (seconds).
    settle_s: float = 30.0
    #: How long "nothing arrives" is watched for (seconds).
    quiet_s: float = 1.0


def new_group() -> str:
    return f"contract-{uuid.uuid4().hex[:10]}"


@dataclass
class Member:
    """A subscribed consumer and what its callbacks saw: ``(callback, partitions,
    generation, member id)`` in order."""

    consumer: KafkaSource
    events: list[tuple[str, list[int], int, str]] = field(default_factory=list)
    assigned: set[int] = field(default_factory=set)
    records: list[Message] = field(default_factory=list)
    errors: list[KafkaError] = field(default_factory=list)

    def subscribe(self, topic: str) -> None:
        def callback(name: str) -> Callable[[KafkaSource, list[TopicPartition]], None]:
            def seen(consumer: KafkaSource, partitions: list[TopicPartition]) -> None:
                meta = group_metadata(consumer)
                numbers = sorted(tp.partition for tp in partitions)
                self.events.append((name, numbers, meta.generation_id, meta.member_id))
                if name == "assign":
                    assert not self.assigned & set(numbers), "assigned twice"
                    self.assigned |= set(numbers)
                else:
                    assert set(numbers) <= self.assigned, f"{name} of partitions it did not have"
                    self.assigned -= set(numbers)

            return seen

        self.consumer.subscribe(
            [topic],
            on_assign=callback("assign"),
            on_revoke=callback("revoke"),
            on_lost=callback("lost"),
        )

    def poll(self, timeout: float = 0.05) -> None:
        for msg in self.consumer.consume(num_messages=100, timeout=timeout):
            err = msg.error()
            if err is not None:
                self.errors.append(err)
            else:
                self.records.append(msg)

    def metadata(self) -> GroupMetadata:
        return group_metadata(self.consumer)

    def names(self) -> list[str]:
        return [name for name, *_ in self.events]


def poll_until(
    members: Sequence[Member], done: Callable[[], bool], timeout_s: float, what: str
) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        for member in members:
            member.poll()


def settled(members: Sequence[Member], partitions: int) -> Callable[[], bool]:
    """Every partition owned by exactly one member, each member owning some."""

    def done() -> bool:
        owned = [m.assigned for m in members]
        union = set().union(*owned)
        return (
            union == set(range(partitions))
            and sum(len(o) for o in owned) == partitions
            and all(owned)
        )

    return done


Report = tuple[KafkaError | None, int | None, int | None]


def produce_all(
    producer: KafkaSink, topic: str, records: Sequence[tuple[bytes | None, bytes]]
) -> list[Report]:
    """Produce ``records``; returns each one's delivery report ``(error, partition,
    offset)``, in the order of ``records`` (reports of different partitions may
    arrive in any order)."""
    reports: dict[int, Report] = {}

    def report(n: int) -> Callable[[KafkaError | None, Message], None]:
        return lambda err, msg: reports.__setitem__(n, (err, msg.partition(), msg.offset()))

    for n, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, on_delivery=report(n))
    assert producer.flush(30) == 0
    assert sorted(reports) == list(range(len(records))), "a delivery report is missing"
    return [reports[n] for n in range(len(records))]


class KafkaContract:
    """The Kafka ports' contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> KafkaHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    # ------------------------------------------------------------------ the sink

    def test_keyed_records_go_to_the_java_partition_in_order(self, harness: KafkaHarness) -> None:
        topic = harness.topic(4)
        keys = [f"cust-{i}".encode() for i in range(12)]
        records = [(key, f"v{n}".encode()) for n, key in enumerate(keys * 2)]
        reports = produce_all(harness.producer(), topic, records)
        assert len(reports) == len(records)
        assert all(err is None for err, _, _ in reports)
        # each keyed record on the partition Java's default partitioner picks
        by_partition: dict[int, list[int]] = {}
        for (key, _), (_, partition, offset) in zip(records, reports, strict=True):
            assert partition == java_partition(key or b"", 4)
            assert offset is not None
            by_partition.setdefault(partition, []).append(offset)
        for offsets in by_partition.values():
            assert offsets == list(range(len(offsets)))  # dense, from 0, in produce order
        reader = Member(harness.consumer(new_group()))
        reader.subscribe(topic)
        poll_until([reader], lambda: len(reader.records) == len(records), harness.settle_s, "all")
        got: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
        for msg in reader.records:
            partition = msg.partition()
            assert partition is not None
            got.setdefault(partition, []).append((msg.key(), msg.value()))
        expected: dict[int, list[tuple[bytes | None, bytes | None]]] = {}
        for key, value in records:
            expected.setdefault(java_partition(key or b"", 4), []).append((key, value))
        assert got == expected

    def test_headers_come_back_as_bytes_and_none_when_absent(self, harness: KafkaHarness) -> None:
        topic = harness.topic(1)
        producer = harness.producer()
        producer.produce(
            topic,
            key=b"k",
            value=b"with",
            headers=[("ce_id", b"e-1"), ("text", "café"), ("empty", None), ("ce_id", b"e-2")],
        )
        producer.produce(topic, key=b"k", value=b"without")
        assert producer.flush(30) == 0
        reader = Member(harness.consumer(new_group()))
        reader.subscribe(topic)
        poll_until([reader], lambda: len(reader.records) == 2, harness.settle_s, "both records")
        with_headers, without = reader.records
        assert with_headers.headers() == [
            ("ce_id", b"e-1"),
            ("text", "café".encode()),
            ("empty", None),
            ("ce_id", b"e-2"),
        ]
        assert without.headers() is None
        kind, stamp = with_headers.timestamp()
        assert kind == 1  # the producer's create time
        assert abs(stamp / 1000 - time.time()) < 120

    def test_a_record_over_message_max_bytes_is_refused_by_produce(
        self, harness: KafkaHarness
    ) -> None:
        topic = harness.topic(1)
        producer = harness.producer()
        with pytest.raises(KafkaException) as caught:
            producer.produce(topic, key=b"k", value=b"x" * 2_000_000)
        assert caught.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
        reports = produce_all(producer, topic, [(b"k", b"small")])
        assert [(err, offset) for err, _, offset in reports] == [(None, 0)]  # nothing before it

    # ------------------------------------------------------------------ the group

    def test_before_joining_the_token_is_empty(self, harness: KafkaHarness) -> None:
        group = new_group()
        meta = group_metadata(harness.consumer(group))
        assert (meta.generation_id, meta.member_id, meta.group_id) == (-1, "", group)
        assert meta.group_instance_id is None

    def test_a_sole_member_is_assigned_every_partition_under_a_token(
        self, harness: KafkaHarness
    ) -> None:
        topic, group = harness.topic(3), new_group()
        member = Member(harness.consumer(group))
        member.subscribe(topic)
        poll_until([member], settled([member], 3), harness.settle_s, "the assignment")
        (name, partitions, generation, member_id) = member.events[0]
        assert (name, partitions) == ("assign", [0, 1, 2])
        assert generation >= 1 and member_id
        meta = member.metadata()
        assert (meta.generation_id, meta.member_id, meta.group_id) == (generation, member_id, group)
        assert sorted(tp.partition for tp in member.consumer.assignment()) == [0, 1, 2]

    def test_a_joining_member_gets_partitions_revoked_from_the_first(
        self, harness: KafkaHarness
    ) -> None:
        topic, group = harness.topic(4), new_group()
        first = Member(harness.consumer(group))
        first.subscribe(topic)
        poll_until([first], settled([first], 4), harness.settle_s, "the first assignment")
        first_generation = first.metadata().generation_id
        second = Member(harness.consumer(group))
        second.subscribe(topic)
        poll_until(
            [first, second],
            lambda: settled([first, second], 4)() and len(first.assigned) == 2,
            harness.settle_s,
            "the partitions to be shared",
        )
        # cooperative-sticky: the first member only gave some up, the second got them
        revoked = [parts for name, parts, _, _ in first.events if name == "revoke"]
        assert len(revoked) == 1 and len(revoked[0]) == 2
        assert second.assigned == set(revoked[0])
        assert first.assigned == {0, 1, 2, 3} - set(revoked[0])
        # assignments are incremental: a member told of a rebalance that gave it nothing
        assert ("assign", []) in [(name, parts) for name, parts, _, _ in first.events]
        # the token: the generation grew for both, also for the member that kept partitions
        assert first.metadata().generation_id > first_generation
        assert second.metadata().generation_id == first.metadata().generation_id
        assert first.metadata().member_id != second.metadata().member_id
        gained = [gen for name, parts, gen, _ in second.events if name == "assign" and parts]
        assert gained and min(gained) > first_generation

    def test_a_closing_member_revokes_then_its_partitions_move(self, harness: KafkaHarness) -> None:
        topic, group = harness.topic(2), new_group()
        first, second = Member(harness.consumer(group)), Member(harness.consumer(group))
        first.subscribe(topic)
        second.subscribe(topic)
        poll_until([first, second], settled([first, second], 2), harness.settle_s, "sharing")
        had = set(second.assigned)
        second.consumer.close()
        assert second.events[-1][:2] == ("revoke", sorted(had))  # inside close()
        assert second.assigned == set()
        poll_until([first], lambda: first.assigned == {0, 1}, harness.settle_s, "the move")
        with pytest.raises(RuntimeError, match="Consumer closed"):
            second.consumer.poll(0)
        with pytest.raises(RuntimeError, match="Consumer closed"):
            second.consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)

    def test_a_member_that_loses_its_partitions_is_told_and_rejoins(
        self, harness: KafkaHarness
    ) -> None:
        topic, group = harness.topic(2), new_group()
        victim, other = Member(harness.consumer(group)), Member(harness.consumer(group))
        victim.subscribe(topic)
        other.subscribe(topic)
        poll_until([victim, other], settled([victim, other], 2), harness.settle_s, "sharing")
        had, old_id = set(victim.assigned), victim.metadata().member_id
        harness.lose(victim.consumer, [other.consumer])
        poll_until([other], lambda: other.assigned == {0, 1}, harness.settle_s, "reassignment")
        # the coordinator no longer knows it: its commits are refused
        with pytest.raises(KafkaException) as caught:
            victim.consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        assert caught.value.args[0].code() == KafkaError.UNKNOWN_MEMBER_ID
        poll_until([victim, other], lambda: "lost" in victim.names(), harness.settle_s, "on_lost")
        lost = [parts for name, parts, _, _ in victim.events if name == "lost"]
        assert lost == [sorted(had)]
        assert victim.assigned == set()
        # it rejoins under a new member id and gets a share again
        poll_until([victim, other], settled([victim, other], 2), harness.settle_s, "the rejoin")
        assert victim.metadata().member_id not in ("", old_id)

    # ------------------------------------------------------------------ offsets and reading

    def test_committed_offsets_are_where_the_next_member_starts(
        self, harness: KafkaHarness
    ) -> None:
        topic, group = harness.topic(2), new_group()
        producer = harness.producer()
        for i in range(6):
            producer.produce(topic, value=f"r{i}".encode(), partition=i % 2)
        assert producer.flush(30) == 0
        first = Member(harness.consumer(group))
        first.subscribe(topic)
        poll_until([first], lambda: len(first.records) == 6, harness.settle_s, "the records")
        parts = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        assert [tp.offset for tp in first.consumer.committed(parts, 10)] == [OFFSET_INVALID] * 2
        done = first.consumer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
        assert [(tp.topic, tp.partition, tp.offset) for tp in done] == [(topic, 0, 2)]
        assert [tp.offset for tp in first.consumer.committed(parts, 10)] == [2, OFFSET_INVALID]
        first.consumer.close()
        # the next member of the group starts at the committed offset (else the beginning)
        nxt = Member(harness.consumer(group))
        nxt.subscribe(topic)
        poll_until([nxt], lambda: len(nxt.records) == 4, harness.settle_s, "the rest")
        starts = {
            p: min(m.offset() or 0 for m in nxt.records if m.partition() == p) for p in (0, 1)
        }
        assert starts[0] == 2 and starts[1] == 0

    def test_pause_resume_and_seek(self, harness: KafkaHarness) -> None:
        topic, group = harness.topic(2), new_group()
        member = Member(harness.consumer(group))
        member.subscribe(topic)
        poll_until([member], settled([member], 2), harness.settle_s, "the assignment")
        member.consumer.pause([TopicPartition(topic, 0)])
        producer = harness.producer()
        for partition in (0, 1):
            for i in range(3):
                producer.produce(topic, value=f"p{partition}-{i}".encode(), partition=partition)
        assert producer.flush(30) == 0
        poll_until([member], lambda: len(member.records) == 3, harness.settle_s, "partition 1")
        deadline = time.monotonic() + harness.quiet_s
        while time.monotonic() < deadline:
            member.poll()
        assert {m.partition() for m in member.records} == {1}  # nothing of the paused one
        member.consumer.resume([TopicPartition(topic, 0)])
        poll_until([member], lambda: len(member.records) == 6, harness.settle_s, "partition 0")
        member.consumer.seek(TopicPartition(topic, 0, 1))
        poll_until([member], lambda: len(member.records) == 8, harness.settle_s, "the re-read")
        assert [(m.partition(), m.offset()) for m in member.records[6:]] == [(0, 1), (0, 2)]
        # pause/resume of a partition not assigned is no error; a seek of one is refused
        member.consumer.pause([TopicPartition(topic, 7)])
        member.consumer.resume([TopicPartition(topic, 7)])
        with pytest.raises(KafkaException) as caught:
            member.consumer.seek(TopicPartition(topic, 7, 0))
        assert caught.value.args[0].code() == KafkaError._STATE
