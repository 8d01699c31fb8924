"""The usage view's batch apply and its table writes outside an event
(docs/usage-api.md, "Throughput"): the source records of one ``take_events`` batch,
the in-memory overlay that writes each changed key once, and :func:`on_partition`,
which points faust's RocksDB store at a partition's database."""

from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from collections.abc import Iterator
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
            message.acked = True  # faust's Consumer.ack then leaves its offsets alone
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

    __slots__ = ("_changed", "_read")

    def __init__(self) -> None:
        self._read: dict[tuple[int, bytes], Any] = {}
        self._changed: dict[tuple[int, bytes], tuple[Any, bytes, Any, int]] = {}

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
            put_key(table, key, value, partition)
            written[table.name] += 1
        self._changed.clear()
        self._read.clear()
        return dict(written)


def put_key(table: Any, key: bytes, value: Any, partition: int) -> None:
    """Write ``key`` = ``value`` to ``table``'s changelog ``partition`` and local store."""
    table.send_changelog(partition, key, value)
    with on_partition(partition):
        table.data[key] = value


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
