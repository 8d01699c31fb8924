"""A poll batch's effects, for every partition it read, and the statements that write them.

One :class:`Batch` per poll: what the records of every partition the worker may
process now stand for (customers, usage rows, metered and subscription events, the
dead letters and holds of bad records), written in **one** transaction whose first
statement reads the fence rows of all its partitions ``FOR SHARE``
(:func:`streams.core.billing.fencing.check_many`). Effects are keyed by their
record's (partition, offset), so a batch can be split (bisection of a batch the
database refuses for good) and a partition dropped (its fence refused, its dead
letter not delivered) without touching the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from streams.core.billing import rows
from streams.core.billing.dead_letters import Delivery
from streams.core.billing.fencing import Fenced
from streams.core.billing.rows import Record
from streams.core.billing.stores import Stores
from streams.core.domain.events import CustomerUpserted, UsageRecorded
from streams.errors import InvoicingError

__all__ = [
    "Batch",
    "FencesRefused",
    "RecordConflicts",
    "UsageConflicts",
    "usage_row",
    "write_batch",
]

Key = tuple[int, int]


def _key(source: rows.SourceCoordinates) -> Key:
    return (source.partition, source.offset)


@dataclass
class Batch:
    """Effects of the records of one poll, written in one transaction.

    ``messages`` are the records moved past (their offsets are committed after the
    transaction); ``letters`` the dead letters handed to the producer for them
    (``deliveries``, waited for before the transaction) and recorded in
    ``dead_letters`` by it; ``holds`` the holds they cause.
    """

    #: (event id, data, source, the envelope's ``time``): upserts are ordered by that time.
    customers: list[tuple[str, CustomerUpserted, rows.SourceCoordinates, datetime]] = field(
        default_factory=list
    )
    usage: list[rows.UsageRow] = field(default_factory=list)
    metered: list[rows.MeteredRecord] = field(default_factory=list)
    subscriptions: list[rows.SubscriptionRecord] = field(default_factory=list)
    holds: list[rows.HoldRequest] = field(default_factory=list)
    messages: list[Record] = field(default_factory=list)
    letters: list[rows.DeadLetterRecord] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)

    def partitions(self) -> set[int]:
        """The partitions whose records this batch moves past."""
        return {msg.partition for msg in self.messages}

    def first_offset(self, partition: int) -> int:
        """The first offset of ``partition`` in the batch (where a retry restarts)."""
        return min(msg.offset for msg in self.messages if msg.partition == partition)

    def offsets(self) -> list[Key]:
        """The (partition, offset) of every effect of this batch, in order."""
        found = {_key(source) for _id, _data, source, _time in self.customers}
        found |= {_key(row.source) for row in self.usage}
        found |= {_key(record.source) for record in self.metered}
        found |= {_key(record.source) for record in self.subscriptions}
        found |= {_key(hold["source"]) for hold in self.holds}
        found |= {(letter.source_partition, letter.source_offset) for letter in self.letters}
        return sorted(found)

    def _keep(self, keep: Callable[[Key], bool]) -> Batch:
        return Batch(
            customers=[c for c in self.customers if keep(_key(c[2]))],
            usage=[r for r in self.usage if keep(_key(r.source))],
            metered=[r for r in self.metered if keep(_key(r.source))],
            subscriptions=[r for r in self.subscriptions if keep(_key(r.source))],
            holds=[h for h in self.holds if keep(_key(h["source"]))],
            messages=[m for m in self.messages if keep((m.partition, m.offset))],
            letters=[d for d in self.letters if keep((d.source_partition, d.source_offset))],
        )

    def split(self, at: Key) -> tuple[Batch, Batch]:
        """The effects of records before ``at`` (by partition, then offset), and the
        others (deliveries stay out: they are awaited before)."""
        return self._keep(lambda key: key < at), self._keep(lambda key: key >= at)

    def without(self, partitions: Iterable[int]) -> Batch:
        """This batch without the records of ``partitions``."""
        dropped = set(partitions)
        return self._keep(lambda key: key[0] not in dropped)

    def without_effects_at(self, keys: Iterable[Key]) -> Batch:
        """This batch with the stored effects (customers, usage, metered, subscription
        events) of ``keys`` removed; their records are still moved past."""
        gone = set(keys)
        kept = Batch(
            customers=[c for c in self.customers if _key(c[2]) not in gone],
            usage=[r for r in self.usage if _key(r.source) not in gone],
            metered=[r for r in self.metered if _key(r.source) not in gone],
            subscriptions=[r for r in self.subscriptions if _key(r.source) not in gone],
            holds=list(self.holds),
            messages=list(self.messages),
            letters=list(self.letters),
            deliveries=list(self.deliveries),
        )
        return kept

    def has_record_at(self, key: Key) -> bool:
        """Whether a stored effect (customer, usage, metered or subscription event)
        comes from the record at ``key``."""
        return (
            any(_key(s) == key for _i, _d, s, _t in self.customers)
            or any(_key(r.source) == key for r in self.usage)
            or any(_key(m.source) == key for m in self.metered)
            or any(_key(e.source) == key for e in self.subscriptions)
        )

    def merge(self, other: Batch) -> None:
        """Add ``other``'s effects (another partition's) to this batch."""
        self.customers += other.customers
        self.usage += other.usage
        self.metered += other.metered
        self.subscriptions += other.subscriptions
        self.holds += other.holds
        self.messages += other.messages
        self.letters += other.letters
        self.deliveries += other.deliveries


class FencesRefused(InvoicingError):
    """The fence rows of some of the batch's partitions hold another token: nothing was
    written (the transaction rolled back); those partitions are dropped, the rest retried."""

    def __init__(self, refused: list[Fenced]) -> None:
        super().__init__("; ".join(str(f) for f in refused))
        self.refused = refused


class UsageConflicts(InvoicingError):
    """Usage rows of the batch whose id is stored with another payload: the transaction
    is rolled back, they are dead-lettered, and the batch is written without them."""

    def __init__(self, conflicts: list[rows.UsageRowConflict]) -> None:
        super().__init__(f"{len(conflicts)} conflicting usage event(s)")
        self.conflicts = conflicts


class RecordConflicts(InvoicingError):
    """Metered or subscription events of the batch conflict with stored ones (same id,
    another payload): the batch's transaction is rolled back, they are dead-lettered,
    and the batch is written without them."""

    def __init__(self, conflicts: list[rows.RecordConflict]) -> None:
        super().__init__(f"{len(conflicts)} conflicting metered or subscription event(s)")
        self.conflicts = conflicts


def usage_row(
    event_id: str,
    data: UsageRecorded,
    digest: str,
    source: rows.SourceCoordinates,
    key_id: str | None = None,
) -> rows.UsageRow:
    """The hot-path row of a ``usage.recorded`` the reference decoder read (the fast
    decoder declined its form): decimals as written (``format(d, "f")``), the time in
    ISO 8601."""

    def text(value: Any) -> str | None:
        return None if value is None else format(value, "f")

    values = (
        data.customer_id,
        data.billing_period,
        text(data.amount),
        data.currency,
        text(data.quantity),
        data.unit,
        text(data.consumed_quantity),
        data.consumed_unit,
        data.sku_id,
        data.description,
        data.region_id,
        data.charge_category,
        data.provider,
        data.event_time.isoformat(),
    )
    return rows.UsageRow(event_id, values, data.event_time, digest, source, key_id)


def write_batch(batch: Batch, stores: Stores[Any], tokens: list[Any]) -> Callable[[Any], None]:
    """The batch's statements, in one transaction: the fence rows of its partitions
    ``FOR SHARE`` first (a refusal: :class:`FencesRefused`), then customers, usage
    (a conflict: :class:`UsageConflicts`), metered and subscription events (a
    conflict: :class:`RecordConflicts`), holds, and the dead letters' rows. Every
    exception rolls the whole transaction back."""

    def work(conn: Any) -> None:
        refused = stores.fences.check_many(conn, tokens)
        if refused:
            raise FencesRefused(refused)
        for event_id, data, source, event_time in batch.customers:
            stores.usage.upsert_customer(conn, event_id, data, source, event_time)
        conflicts = stores.usage.insert_usage_rows(conn, batch.usage)
        if conflicts:
            raise UsageConflicts(conflicts)
        others = stores.metering.insert_metered(
            conn, batch.metered
        ) + stores.metering.insert_subscriptions(conn, batch.subscriptions)
        if others:
            raise RecordConflicts(others)
        for hold in batch.holds:
            stores.holds.record_hold(conn, **hold)
        stores.dead_letters.record(conn, batch.letters)

    return work
