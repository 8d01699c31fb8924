"""The in-memory Kafka's group coordinator: generations, cooperative-sticky assignment.

Classic protocol with the cooperative-sticky assignor, as measured against librdkafka
2.16 and the stack's broker (the module docstring of :mod:`streams.adapters.memory.kafka`
lists what is kept): every rebalance bumps the group's generation and reaches every
member as a :class:`Rebalance` event (partitions revoked, partitions assigned,
possibly none); a member keeps what it has; partitions are spread evenly; a partition
that must move is first revoked from its owner and assigned to its new owner only in
the rebalance after the owner served the revocation (a join costs two generations).

The coordinator works on each consumer's :class:`Membership` (what the coordinator
knows of it: member id, topics, partitions owned, events not served yet). Callers hold
the broker's lock; nothing here blocks or notifies.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

from streams.adapters.memory.kafka_records import TP


@dataclass
class Rebalance:
    """A new generation for a member: what it gives up, then what it gets."""

    generation: int
    revoked: list[TP]
    assigned: list[TP]


@dataclass
class Lost:
    """The member's partitions were lost (its session expired)."""

    partitions: list[TP]


@dataclass
class ErrorEvent:
    """An error event for the member's next poll."""

    error: KafkaError


Event = Rebalance | Lost | ErrorEvent


@dataclass(eq=False)
class Membership:
    """A consumer as the coordinator knows it (guarded by the broker's lock).

    ``member_id`` is ``""`` outside the group; ``events`` are served, in order, by the
    consumer's thread.
    """

    topics: list[str] = field(default_factory=list)
    member_id: str = ""
    owned: set[TP] = field(default_factory=set)
    events: deque[Event] = field(default_factory=deque)


@dataclass
class Group:
    """One consumer group: its generation, members, committed offsets.

    ``members`` maps member id → membership, in join order; ``pending`` holds the
    partitions revoked from a member that has not served the revocation yet.
    """

    group_id: str
    generation: int = 0
    members: dict[str, Membership] = field(default_factory=dict)
    #: (topic, partition) → next offset to read
    committed: dict[TP, int] = field(default_factory=dict)
    pending: dict[TP, str] = field(default_factory=dict)

    def join(self, member: Membership, partitions: Mapping[str, int]) -> None:
        """``member`` joins under a new member id; the group rebalances.

        Args:
            partitions: topic → partition count, of the topics that exist.
        """
        member.member_id = f"rdkafka-{uuid.uuid4()}"
        member.owned = set()
        self.members[member.member_id] = member
        self.rebalance(partitions)

    def leave(self, member: Membership) -> None:
        """``member`` leaves: what it owned or had pending is free (no rebalance here)."""
        self.members.pop(member.member_id, None)
        member.owned = set()
        for tp in [tp for tp, owner in self.pending.items() if owner == member.member_id]:
            del self.pending[tp]

    def rebalance(self, partitions: Mapping[str, int]) -> None:
        """A new generation: every member keeps what it may, gives up its surplus (held
        back as pending until it served the revocation), and the free partitions go to
        the members with the fewest, up to an even share.

        Args:
            partitions: topic → partition count, of the topics that exist.
        """
        self.generation += 1
        members = list(self.members.values())
        if not members:
            return
        eligible = {
            m.member_id: {(t, p) for t in m.topics if t in partitions for p in range(partitions[t])}
            for m in members
        }
        every = set().union(*eligible.values())
        base, extra = divmod(len(every), len(members))
        by_size = sorted(members, key=lambda m: -len(m.owned & eligible[m.member_id]))
        quota = {m.member_id: base + (1 if i < extra else 0) for i, m in enumerate(by_size)}
        revoked: dict[str, list[TP]] = {}
        for m in members:
            keep = sorted(m.owned & eligible[m.member_id])
            surplus = max(0, len(keep) - quota[m.member_id])
            give = sorted(m.owned - eligible[m.member_id]) + keep[:surplus]
            revoked[m.member_id] = give
            m.owned -= set(give)
            for tp in give:
                self.pending[tp] = m.member_id
        taken = set(self.pending).union(*(m.owned for m in members))
        assigned: dict[str, list[TP]] = {m.member_id: [] for m in members}
        for tp in sorted(every - taken):
            candidates = [
                m
                for m in members
                if tp in eligible[m.member_id] and len(m.owned) < quota[m.member_id]
            ]
            if not candidates:
                continue
            chosen = min(candidates, key=lambda m: len(m.owned))
            chosen.owned.add(tp)
            assigned[chosen.member_id].append(tp)
        for m in members:
            m.events.append(Rebalance(self.generation, revoked[m.member_id], assigned[m.member_id]))

    def served_revocation(
        self, member: Membership, revoked: list[TP], partitions: Mapping[str, int]
    ) -> None:
        """``member`` served the revocation of ``revoked``: once nothing is pending, the
        next rebalance assigns what was held back."""
        for tp in revoked:
            if self.pending.get(tp) == member.member_id:
                del self.pending[tp]
        if not self.pending and revoked:
            self.rebalance(partitions)
