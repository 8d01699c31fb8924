"""The usage view's event ids: written a chunk per batch, looked up in memory
(docs/usage-api.md, "Event ids").

Why: deduplicating by event id needs every id of a live period, and the view kept
one ``event_ids`` key per event. That was one changelog record and one store write
per event, where a period's or a day's value is written once per batch, and it
was 35-40 % of an instance's time (docs/benchmarks.md, "The usage view: where a
record's time goes").

Now a batch writes, per (partition, period), **one chunk** (or one per
:data:`CHUNK_IDS` ids): the key ``"\\x00<partition>|<period or ->|<first offset of the
partition in the batch>|<part>"`` in
the same ``event_ids`` table (no event id holds a control character: the contract's
text pattern refuses them, so a chunk key never meets an id), and the value
``{event id: seen value}`` (:func:`streams.apps.usage_view.state.seen_value`) of the
ids the batch recorded there. The changelog carries the chunks, so whatever rebuilds
an instance's tables (a restart, a failover, a new host, a standby taking over)
has them.

Lookups go to an :class:`EventIndex` in memory: per partition the instance owns,
``event id → seen value``. It is built from the table (chunks and the per-id keys
written before chunks) the first time a batch needs it in a consumer-group
generation, so after every rebalance it is built again from what faust recovered,
and kept up to date by the batches in between.

Why this is as exact as one key per event, after any crash: a record's source
offset is committed only after the changelog producer is flushed, which carries the
chunk of the batch that applied it (docs/usage-api.md "Throughput"). So every record
at or below the committed offset has its id in a chunk on the changelog, and every
record above it is read and applied again, its id written again in a later chunk.
A chunk key is written again only by a batch that starts at the same offset of the
same partition, which applies those records again; a smaller batch that overwrites
a chunk leaves the rest of its records above the committed offset, to be applied
and chunked again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streams.apps.usage_view import state

__all__ = ["CHUNK_IDS", "CHUNK_PREFIX", "Chunks", "EventIndex", "chunk_key", "parse_chunk_key"]

#: First byte of a chunk's key; an event id never starts with it.
CHUNK_PREFIX = b"\x00"

#: Most ids in one chunk: about 100 KB of JSON, far below a changelog record's limit
#: (the broker's ``message.max.bytes``, 1 MB by default) whatever the batch size.
CHUNK_IDS = 1_000


def chunk_key(partition: int, period: str | None, first_offset: int, part: int = 0) -> bytes:
    """The ``event_ids`` key of the ``part``-th chunk of the ids a batch recorded for
    ``period`` (None: events of no period) on ``partition``, the batch's first record of
    that partition at ``first_offset``."""
    return CHUNK_PREFIX + f"{partition}|{period or '-'}|{first_offset}|{part}".encode()


def parse_chunk_key(key: bytes) -> tuple[int, str | None, int, int] | None:
    """``(partition, period or None, first offset, part)`` of a chunk key; None for the key
    of one event id."""
    if not key.startswith(CHUNK_PREFIX):
        return None
    partition, period, first, part = key[1:].decode().split("|")
    return int(partition), None if period == "-" else period, int(first), int(part)


class EventIndex:
    """The event ids of the partitions an instance owns, in memory: ``partition →
    {event id: seen value}``, for the consumer-group ``generation`` it was built in.

    Memory: each live id of an owned partition, about 200 bytes in the heap for an id
    of 25-40 characters (docs/usage-api.md "Memory bounds").
    """

    __slots__ = ("_by_partition", "generation")

    def __init__(self) -> None:
        self._by_partition: dict[int, dict[str, str]] = {}
        self.generation: int | None = None

    def ensure(self, table: Any, generation: int, partitions: Iterable[int]) -> int:
        """Have the ids of ``partitions`` for ``generation``: a new generation (a
        rebalance) forgets everything; partitions not held yet are read from ``table``
        (``event_ids``) in one pass over its items. Returns the ids read."""
        if generation != self.generation:
            self._by_partition.clear()
            self.generation = generation
        missing = {p for p in partitions if p not in self._by_partition}
        if not missing:
            return 0
        built: dict[int, dict[str, str]] = {p: {} for p in missing}
        read = 0
        for key, value in table.items():
            if value is None:
                continue
            where = parse_chunk_key(key)
            if where is None:  # one event id's key (written before chunks)
                partition = state.parse_seen(value)[2]
                ids = built.get(partition)
                if ids is not None:
                    ids.setdefault(key.decode(), value)
                    read += 1
                continue
            ids = built.get(where[0])
            if ids is None:
                continue
            for event_id, seen in value.items():
                ids.setdefault(event_id, seen)
            read += len(value)
        self._by_partition.update(built)
        return read

    def get(self, partition: int, event_id: str) -> str | None:
        """The seen value of ``event_id`` on ``partition``, if recorded."""
        ids = self._by_partition.get(partition)
        return None if ids is None else ids.get(event_id)

    def add(self, partition: int, event_id: str, seen: str) -> None:
        """Record ``event_id`` on ``partition`` (the batch's chunk carries it to the changelog)."""
        self._by_partition.setdefault(partition, {})[event_id] = seen

    def drop(self, partition: int, event_ids: Iterable[str]) -> None:
        """Forget ``event_ids`` of ``partition`` (their period was dropped by the retention)."""
        ids = self._by_partition.get(partition)
        if ids is not None:
            for event_id in event_ids:
                ids.pop(event_id, None)

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._by_partition.values())


class Chunks:
    """The ids one batch recorded, per (partition, period): written as one chunk each
    by :meth:`write_to`."""

    __slots__ = ("_first", "_ids")

    def __init__(self) -> None:
        self._ids: dict[tuple[int, str | None], dict[str, str]] = {}
        self._first: dict[int, int] = {}

    def first_offset(self, partition: int, offset: int) -> None:
        """Note a record of the batch (the first one per partition names its chunks)."""
        self._first.setdefault(partition, offset)

    def add(self, partition: int, event_id: str, seen: str) -> None:
        """``event_id`` recorded on ``partition`` with the seen value ``seen``."""
        period = state.parse_seen(seen)[1]
        self._ids.setdefault((partition, period), {})[event_id] = seen

    def items(self) -> Iterable[tuple[bytes, Mapping[str, str], int]]:
        """``(chunk key, {event id: seen value}, partition)`` of each chunk, at most
        :data:`CHUNK_IDS` ids each."""
        for (partition, period), ids in self._ids.items():
            pairs = list(ids.items())
            for part, start in enumerate(range(0, len(pairs), CHUNK_IDS)):
                key = chunk_key(partition, period, self._first[partition], part)
                yield key, dict(pairs[start : start + CHUNK_IDS]), partition
