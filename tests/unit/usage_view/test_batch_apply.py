"""The view's batch apply (streams/apps/usage_view/app.py, docs/usage-api.md
"Throughput"): :class:`Batch` against the installed faust's RocksDB store, and
:func:`current_records` on a batch that straddles a rebalance. No broker: the changelog
sends are recorded instead of produced."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import faust
import pytest

from streams.apps.usage_view.batch import Batch, SourceRecord, current_records, on_partition


def _table(tmp_path: Path, name: str, sent: list[tuple[str, int, bytes, Any]]) -> Any:
    app = faust.App(
        f"test-batch-{name}",
        broker="kafka://127.0.0.1:9",
        store="rocksdb://",
        datadir=str(tmp_path / name),
        autodiscover=False,
    )
    table: Any = app.Table(name, default=None, key_type=bytes, partitions=12)

    def send_changelog(partition: int, key: bytes, value: Any, *args: Any, **kw: Any) -> None:
        sent.append((name, partition, key, value))

    table.send_changelog = send_changelog
    return table


def test_each_changed_key_is_written_once_with_its_last_value(tmp_path: Path) -> None:
    sent: list[tuple[str, int, bytes, Any]] = []
    periods = _table(tmp_path, "periods", sent)
    days = _table(tmp_path, "days", sent)
    with on_partition(4):
        periods.data[b"c1 2024-09"] = "stored"
    batch = Batch()
    assert batch.get(periods, b"c1 2024-09", 4) == "stored"  # read from partition 4's database
    assert batch.get(periods, b"c2 2024-09", 4) is None
    batch.put(periods, b"c1 2024-09", "one", 4)
    assert batch.get(periods, b"c1 2024-09", 4) == "one"  # the next record sees the change
    batch.put(days, b"c1 2024-09-03", "day", 4)
    batch.put(periods, b"c1 2024-09", "two", 4)
    assert batch.get(periods, b"c1 2024-09", 4) == "two"
    assert sent == []  # nothing leaves before write()
    assert batch.write() == {"periods": 1, "days": 1}
    assert sent == [
        ("periods", 4, b"c1 2024-09", "two"),
        ("days", 4, b"c1 2024-09-03", "day"),
    ]
    with on_partition(4):
        assert periods.data[b"c1 2024-09"] == "two"  # the local store has it too
        assert days.data[b"c1 2024-09-03"] == "day"
    assert batch.write() == {}  # a written batch is empty


def test_a_read_is_cached_so_a_later_store_change_is_not_seen(tmp_path: Path) -> None:
    """One store read per key per batch: the batch is the only writer while it runs
    (no ``await`` inside), so the cached value is the stored one."""
    sent: list[tuple[str, int, bytes, Any]] = []
    customers = _table(tmp_path, "customers", sent)
    batch = Batch()
    assert batch.get(customers, b"c1", 2) is None
    with on_partition(2):
        customers.data[b"c1"] = "behind the batch's back"
    assert batch.get(customers, b"c1", 2) is None


def _event(partition: int, offset: int, generation: int) -> Any:
    message = SimpleNamespace(
        key=b"c1",
        value=b"{}",
        headers=[],
        partition=partition,
        offset=offset,
        generation_id=generation,
        acked=False,
    )
    return SimpleNamespace(message=message)


def test_records_fetched_before_a_rebalance_are_dropped_and_acknowledged() -> None:
    events = [_event(0, 10, 5), _event(1, 3, 5), _event(0, 7, 6), _event(1, 4, 6)]
    records = current_records(events, 6)
    assert records == [
        SourceRecord(b"c1", b"{}", [], 0, 7),
        SourceRecord(b"c1", b"{}", [], 1, 4),
    ]
    assert [e.message.acked for e in events] == [True, True, False, False]


@pytest.mark.parametrize("generation", [5, 6])
def test_a_batch_of_one_generation_is_kept_whole(generation: int) -> None:
    events = [_event(0, n, generation) for n in range(3)]
    assert [r.offset for r in current_records(events, generation)] == [0, 1, 2]
    assert not any(e.message.acked for e in events)
