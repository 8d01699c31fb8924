"""The view's event ids in chunks (streams/apps/usage_view/event_index.py): the chunk keys,
the index built from the ``event_ids`` table (chunks and per-id keys) on the installed
faust's RocksDB store, and deduplication by chunks + index against one key per event,
on generated batches with resends, conflicts, rebuilds after a rebalance and a lost
chunk after a crash."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import faust
import pytest
from faust.types import TP

from streams.apps.usage_view import state
from streams.apps.usage_view.batch import on_partition
from streams.apps.usage_view.event_index import (
    CHUNK_IDS,
    Chunks,
    EventIndex,
    chunk_key,
    parse_chunk_key,
)
from streams.apps.usage_view.scenario import ScenarioConfig, events
from streams.core.domain.events import Envelope, UsageRecorded
from tests.unit.usage_view.test_view_state import View


def test_chunk_keys_round_trip_and_never_meet_an_event_id() -> None:
    key = chunk_key(7, "2024-09", 1234)
    assert key == b"\x007|2024-09|1234|0"
    assert parse_chunk_key(key) == (7, "2024-09", 1234, 0)
    assert parse_chunk_key(chunk_key(0, None, 0, 3)) == (0, None, 0, 3)
    assert parse_chunk_key(b"u-acme-1") is None  # one event id's key


def test_a_batch_of_many_ids_is_written_in_chunks_of_at_most_chunk_ids() -> None:
    chunks = Chunks()
    chunks.first_offset(2, 40)
    for n in range(CHUNK_IDS * 2 + 5):
        chunks.add(2, f"e{n}", state.seen_value("d", "2024-09", 2, 40 + n))
    written = list(chunks.items())
    assert [key for key, _, _ in written] == [chunk_key(2, "2024-09", 40, p) for p in range(3)]
    assert [len(ids) for _, ids, _ in written] == [CHUNK_IDS, CHUNK_IDS, 5]
    assert {e for _, ids, _ in written for e in ids} == {f"e{n}" for n in range(CHUNK_IDS * 2 + 5)}


def _rocksdb_table(tmp_path: Path, owned: set[int]) -> Any:
    app = faust.App(
        "test-event-index",
        broker="kafka://127.0.0.1:9",
        store="rocksdb://",
        datadir=str(tmp_path),
        autodiscover=False,
    )
    table: Any = app.Table("event_ids", default=None, key_type=bytes, partitions=12)
    topic = table.changelog_topic_name
    # faust's RocksDB store iterates the databases of the actively assigned partitions
    app.assignor.assigned_actives = lambda: {TP(topic, p) for p in owned}  # type: ignore[method-assign]
    return table


def test_the_index_is_built_from_chunks_and_per_id_keys_of_the_owned_partitions(
    tmp_path: Path,
) -> None:
    table = _rocksdb_table(tmp_path, owned={1, 2})
    with on_partition(1):
        table.data[chunk_key(1, "2024-09", 10)] = {
            "a": state.seen_value("d1", "2024-09", 1, 10),
            "b": state.seen_value("d2", "2024-09", 1, 11),
        }
        table.data[b"old"] = state.seen_value("d0", "2024-08", 1, 3)  # a per-id key
    with on_partition(2):
        table.data[chunk_key(2, "2024-09", 5)] = {"c": state.seen_value("d3", "2024-09", 2, 5)}
    with on_partition(3):  # not owned: its database is not read
        table.data[chunk_key(3, "2024-09", 1)] = {"z": state.seen_value("d9", "2024-09", 3, 1)}

    index = EventIndex()
    assert index.ensure(table, 1, {1}) == 3
    assert index.get(1, "a") == "d1 2024-09 1 10" and index.get(1, "old") == "d0 2024-08 1 3"
    assert index.get(2, "c") is None  # partition 2 not asked for yet
    assert index.ensure(table, 1, {1, 2}) == 1  # only the partition it lacked
    assert index.get(2, "c") == "d3 2024-09 2 5" and index.get(1, "c") is None
    assert index.ensure(table, 1, {1, 2}) == 0
    index.add(1, "n", "d4 2024-09 1 12")
    assert index.ensure(table, 2, {1}) == 3  # a new generation: built again from the table
    assert index.get(1, "n") is None and index.get(2, "c") is None and len(index) == 3
    index.drop(1, ["a", "missing"])
    assert index.get(1, "a") is None and len(index) == 2


class ChunkedView(View):
    """:class:`View` with the event ids as the app keeps them: a chunk per batch and
    (partition, period) in ``table`` (what the changelog holds), lookups in an
    :class:`EventIndex` built from it."""

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[bytes, Any] = {}
        self.index = EventIndex()
        self.generation = 0
        self._chunks = Chunks()

    def rebalance(self) -> None:
        self.generation += 1

    def seen(self, partition: int, event_id: str) -> str | None:
        return self.index.get(partition, event_id)

    def record_id(self, partition: int, event_id: str, value: str) -> None:
        self.index.add(partition, event_id, value)
        self._chunks.add(partition, event_id, value)

    def feed_batch(
        self, batch: list[tuple[Envelope, int]], partition: int = 0, *, keep_chunks: bool = True
    ) -> None:
        self.index.ensure(self.table, self.generation, {partition})
        self._chunks = Chunks()
        for envelope, offset in batch:
            self._chunks.first_offset(partition, offset)
            self.feed(envelope, offset, partition)
        if keep_chunks:
            for chunk, ids, _ in self._chunks.items():
                self.table[chunk] = dict(ids)


def _stream(seed: int) -> list[Envelope]:
    """A scenario's events with resends (the same event again later) and conflicts (an
    id again with another amount) mixed in."""
    rng = random.Random(seed)
    config = ScenarioConfig(customers=6, pass_through_lines=15, metered_events=12, seed=seed)
    stream: list[Envelope] = []
    for envelope in events(config):
        stream.append(envelope)
        if rng.random() < 0.15 and len(stream) > 3:
            earlier = rng.choice(stream[len(stream) // 2 :])
            data = earlier.data
            if isinstance(data, UsageRecorded) and rng.random() < 0.3:
                other = data.model_copy(update={"amount": data.amount + 1})
                stream.append(Envelope.wrap(other, id=earlier.id, source="t"))
            else:
                stream.append(earlier)
    return stream


@pytest.mark.parametrize("seed", range(8))
def test_chunks_and_a_rebuilt_index_deduplicate_as_one_key_per_event(seed: int) -> None:
    rng = random.Random(1000 + seed)
    stream = _stream(seed)
    per_event, chunked = View(), ChunkedView()
    for offset, envelope in enumerate(stream):
        per_event.feed(envelope, offset)
    offset = 0
    while offset < len(stream):
        size = rng.randint(1, 40)
        chunked.feed_batch([(e, offset + i) for i, e in enumerate(stream[offset : offset + size])])
        offset += size
        if rng.random() < 0.3:
            chunked.rebalance()  # the next batch reads the index from the chunks again
    assert chunked.outcomes == per_event.outcomes
    assert chunked.periods == per_event.periods and chunked.days == per_event.days
    assert {event_id for ids in chunked.table.values() for event_id in ids} == set(per_event.ids)
    for customer_id in per_event.customers:
        assert chunked.answer(customer_id) == per_event.answer(customer_id)


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_whose_chunk_was_lost_in_a_crash_is_applied_again_exactly(seed: int) -> None:
    """A crash after a batch's values reached the changelog and before its chunk did:
    the new owner builds the index from the chunks it has and reads the batch again from
    the committed offset (the batch's start); the answer is that of no crash."""
    rng = random.Random(2000 + seed)
    stream = _stream(seed)
    clean, crashed = ChunkedView(), ChunkedView()
    cut = sorted(rng.sample(range(1, len(stream)), 2))
    bounds = [0, *cut, len(stream)]
    for first, end in itertools.pairwise(bounds):
        clean.feed_batch([(e, first + i) for i, e in enumerate(stream[first:end])])
    for number, (first, end) in enumerate(itertools.pairwise(bounds)):
        batch = [(e, first + i) for i, e in enumerate(stream[first:end])]
        if number == 1:
            crashed.feed_batch(batch, keep_chunks=False)  # its chunk never reached the broker
            crashed.rebalance()  # the partition's new owner
            crashed.outcomes = crashed.outcomes[: -len(batch)]
        crashed.feed_batch(batch)
    assert crashed.periods == clean.periods and crashed.days == clean.days
    for customer_id in clean.customers:
        assert crashed.answer(customer_id) == clean.answer(customer_id)
