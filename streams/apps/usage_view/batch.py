"""The usage view's batch apply and its table writes outside an event
(docs/usage-api.md, "Throughput"): the source records of one ``take_events`` batch,
the in-memory overlay that writes each changed key once, :class:`ChangelogDeliveries`,
which keeps faust's commits behind the changelog records, and
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

from streams.errors import InvoicingError


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
        #: done once the broker has the record), for :class:`ChangelogDeliveries`
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


class ChangelogNotDelivered(InvoicingError):
    """A changelog record did not reach the broker (:class:`ChangelogDeliveries`): the
    commit that waited for it fails, so no offset past it is committed."""


def withhold(events: Iterable[Any]) -> None:
    """Keep the offsets of ``events`` (faust events) out of every commit of this
    instance: each message is marked acknowledged, so faust's ``Consumer.ack`` (called
    by ``take_events`` on every event of a batch, even one whose body raised) leaves its
    offset alone and the committed offset cannot pass it. The partition's next owner
    reads the records again from the last committed offset."""
    for event in events:
        event.message.acked = True


#: Longest wait of a commit for the changelog records sent before it (seconds); then the
#: commit fails and the instance stops (:class:`ChangelogDeliveries`).
CHANGELOG_DELIVERY_TIMEOUT_S = 60.0


class ChangelogDeliveries:
    """The changelog records sent and not yet known to be on the broker; faust's commits
    wait for them (:func:`guard_commits`), so an offset is committed only once the state
    its record produced can be recovered from the changelog.

    Why faust's own order is not enough: its consumer flushes the producer before it
    commits, but its ``ProducerBuffer.flush`` returns when no record has been handed to
    aiokafka for 0.1 s, even with records still queued, and a record its sender task has
    taken from the queue while aiokafka waits for room in a batch is counted by neither
    flush. A commit could then pass an offset whose changelog record was still inside the
    process, and a ``kill -9`` at that moment lost it for the partition's next owner
    (docs/decisions/0098-usage-view-state.md). Pinned by
    ``tests/unit/usage_view/test_changelog_delivery.py``.

    The agent does not wait: it tracks each batch's records (:meth:`track`) before
    faust acknowledges the batch's events, and goes on with the next batch.
    """

    __slots__ = ("_pending", "failure", "timeout_s")

    def __init__(self, timeout_s: float = CHANGELOG_DELIVERY_TIMEOUT_S) -> None:
        self._pending: set[Any] = set()
        #: the first changelog record that failed, if any (every later wait raises)
        self.failure: BaseException | None = None
        self.timeout_s = timeout_s

    def track(self, sent: Iterable[Any]) -> None:
        """Track ``sent`` (faust ``FutureMessage`` objects, from :attr:`Batch.sent`)."""
        for fut in sent:
            if fut is None:
                continue
            self._pending.add(fut)
            fut.add_done_callback(self._done)

    def _done(self, fut: Any) -> None:
        self._pending.discard(fut)
        if self.failure is None:
            if fut.cancelled():
                self.failure = asyncio.CancelledError("changelog record cancelled")
            elif fut.exception() is not None:
                self.failure = fut.exception()

    @property
    def pending(self) -> int:
        """How many tracked records are not yet delivered."""
        return len(self._pending)

    async def wait(self) -> None:
        """Return once every record tracked so far is on the broker (records tracked
        while waiting are the next commit's).

        Raises:
            ChangelogNotDelivered: a tracked record failed (now or earlier: the instance
                stops, it never commits again), or some are still undelivered after
                :attr:`timeout_s` seconds.
        """
        snapshot = list(self._pending)
        if snapshot:
            _, late = await asyncio.wait(snapshot, timeout=self.timeout_s)
            if late:
                raise ChangelogNotDelivered(
                    f"{len(late)} of {len(snapshot)} changelog records not delivered after"
                    f" {self.timeout_s:g} s"
                )
        if self.failure is not None:
            raise ChangelogNotDelivered(
                f"a changelog record was not delivered: {type(self.failure).__name__}:"
                f" {self.failure}"
            ) from self.failure


def guard_commits(app: Any, deliveries: ChangelogDeliveries) -> None:
    """Make ``app``'s producer flush, which faust's consumer awaits before every commit
    (``Consumer._commit_offsets``) and its rebalance awaits after revoking partitions,
    wait for ``deliveries`` first. A :class:`ChangelogNotDelivered` from it fails the
    commit (no offset is committed) and stops the instance."""
    producer = app.producer
    flush = producer.flush

    async def flush_after_deliveries() -> None:
        await deliveries.wait()
        await flush()

    producer.flush = flush_after_deliveries


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
