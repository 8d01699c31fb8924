"""The usage view's batch apply and its table writes outside an event
(docs/usage-api.md, "Throughput"): the source records of one ``take_events`` batch,
the in-memory overlay that writes each changed key once, :func:`delivered`, which holds
a batch's acknowledgement until its changelog records are on the broker, and
:func:`on_partition`, which points faust's RocksDB store at a partition's database."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import Counter
from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

from faust.streams import _current_event


class SourceRecord(NamedTuple):
    """One source record as the view applies it."""

    key: bytes | None
    value: bytes | None
    headers: Any
    partition: int
    offset: int


def current_records(events: Any, generation: int) -> list[SourceRecord]:
    """The records of ``events`` (faust events of one ``take_events`` batch) fetched in
    the consumer group's current ``generation``; the others are marked acknowledged
    without being applied, so faust neither applies them nor commits past them.

    Why: ``take_events`` holds a batch while it fills, and a rebalance in that time
    seeks every assigned partition back to its committed offset, so the records
    fetched before it come again after the ones held. Applied, the held records would
    make the earlier ones of the same partition look redelivered (a value's
    ``last_offset`` is past them) and lose them, and for a partition that moved they
    would be a second writer of its changelog. faust's own per-event stream skips such
    records the same way (``Stream._c_aiter`` compares ``generation_id``).
    """
    records: list[SourceRecord] = []
    for event in events:
        message = event.message
        if message.generation_id != generation:
            withhold([event])
            continue
        records.append(
            SourceRecord(
                message.key, message.value, message.headers, message.partition, message.offset
            )
        )
    return records


class Batch:
    """The table values one batch of records reads and writes: a read goes to the
    table once per key (under the record's partition, which picks the RocksDB
    database), later reads and every write stay here, and :meth:`write` sends each
    changed key once, to the changelog partition of the record that changed it last.

    Values are never edited in place (:func:`streams.apps.usage_view.state.apply` is
    pure), so a value read or written earlier in the batch is the next record's input
    as is.
    """

    __slots__ = ("_changed", "_read", "sent")

    def __init__(self) -> None:
        self._read: dict[tuple[int, bytes], Any] = {}
        self._changed: dict[tuple[int, bytes], tuple[Any, bytes, Any, int]] = {}
        #: the changelog records :meth:`write` queued (faust ``FutureMessage`` objects, each
        #: done once the broker has the record), for :func:`delivered`
        self.sent: list[Any] = []

    def get(self, table: Any, key: bytes, partition: int) -> Any:
        """The value of ``key`` in ``table`` as the batch has it so far (``None``: absent)."""
        slot = (id(table), key)
        changed = self._changed.get(slot)
        if changed is not None:
            return changed[2]
        if slot in self._read:
            return self._read[slot]
        with on_partition(partition):
            value = table.get(key)
        self._read[slot] = value
        return value

    def put(self, table: Any, key: bytes, value: Any, partition: int) -> None:
        """Set ``key`` of ``table`` to ``value``, written by :meth:`write`."""
        self._changed[(id(table), key)] = (table, key, value, partition)

    def write(self) -> dict[str, int]:
        """Send every changed key to its changelog and local store, once each, in the
        order first changed; returns the keys written per table name."""
        written: Counter[str] = Counter()
        for table, key, value, partition in self._changed.values():
            self.sent.append(put_key(table, key, value, partition))
            written[table.name] += 1
        self._changed.clear()
        self._read.clear()
        return dict(written)


def put_key(table: Any, key: bytes, value: Any, partition: int) -> Any:
    """Write ``key`` = ``value`` to ``table``'s changelog ``partition`` and local store;
    returns the changelog record's faust ``FutureMessage`` (done once it is on the
    broker)."""
    sent = table.send_changelog(partition, key, value)
    with on_partition(partition):
        table.data[key] = value
    return sent


class ChangelogNotDelivered(RuntimeError):
    """A changelog record of a batch did not reach the broker; the batch's offsets were
    withheld from faust's commits (:func:`delivered`)."""


def withhold(events: Iterable[Any]) -> None:
    """Keep the offsets of ``events`` (faust events) out of every commit of this
    instance: each message is marked acknowledged, so faust's ``Consumer.ack`` (called
    by ``take_events`` on every event of a batch, even one whose body raised) leaves its
    offset alone and the committed offset cannot pass it. The partition's next owner
    reads the records again from the last committed offset."""
    for event in events:
        event.message.acked = True


async def delivered(sent: list[Any], events: list[Any]) -> None:
    """Return once every changelog record in ``sent`` (faust ``FutureMessage`` objects, from
    :attr:`Batch.sent`) is on the broker, so that the ``events`` of the batch are
    acknowledged, and their offsets committed, only after the state they produced can be
    recovered from the changelog.

    Why not faust's own order (its consumer flushes the producer before it commits):
    faust's ``ProducerBuffer.flush`` returns when no record has been handed to aiokafka
    for 0.1 s, even with records still queued, and a record its sender task has taken
    from the queue but aiokafka has not yet accepted (waiting for room in a batch) is
    counted by neither flush. A commit could then pass an offset whose changelog record
    was still in the process, and a ``kill -9`` at that moment lost it for the next owner
    (docs/decisions/0098-usage-view-state.md). Pinned by
    ``tests/unit/usage_view/test_changelog_delivery.py``.

    Raises :class:`ChangelogNotDelivered` (with the producer's error as its cause) when
    a record failed, and lets a cancellation through (the instance stopping); either
    way after withholding every one of ``events`` (:func:`withhold`), so a record whose
    delivery is unknown is read again by the partition's next owner, where the offsets
    in the state values make it count once (docs/decisions/0098-usage-view-state.md).
    """
    if not sent:
        return
    try:
        await asyncio.gather(*sent)
    except BaseException as exc:
        withhold(events)
        if not isinstance(exc, Exception):
            raise  # cancelled: the batch is read again by the next owner
        failed = sum(1 for fut in sent if fut.done() and (fut.cancelled() or fut.exception()))
        raise ChangelogNotDelivered(
            f"{failed} of {len(sent)} changelog records of a batch of {len(events)}"
            f" events were not delivered: {type(exc).__name__}: {exc}"
        ) from exc


class _PartitionEvent:
    """What faust's stores read of the event being processed: its message's partition."""

    __slots__ = ("__weakref__", "message")

    def __init__(self, partition: int) -> None:
        self.message = SimpleNamespace(partition=partition)


@contextlib.contextmanager
def on_partition(partition: int) -> Iterator[None]:
    """Table writes in the block go to ``partition``'s local store, outside any event.

    faust's RocksDB store keeps one database per partition and picks the one of the
    event being processed (``faust.stores.rocksdb.Store._set`` asserts there is one;
    the context variable ``faust.streams._current_event`` holds it); a timer, such as
    the retention, has none. The memory store ignores the partition. Pinned by
    ``tests/unit/usage_view/test_store_partition.py`` against the installed faust.
    """
    stand_in = _PartitionEvent(partition)
    token = _current_event.set(weakref.ref(stand_in))  # type: ignore[arg-type]
    try:
        yield
    finally:
        _current_event.reset(token)
