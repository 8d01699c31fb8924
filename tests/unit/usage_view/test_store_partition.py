"""``on_partition`` against the installed faust's RocksDB store (the retention's writes:
streams/apps/usage_view/batch.py). No broker: only the local store is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faust
import pytest

from streams.apps.usage_view.batch import on_partition


def _table(tmp_path: Path) -> Any:
    app = faust.App(
        "test-store-partition",
        broker="kafka://127.0.0.1:9",
        store="rocksdb://",
        datadir=str(tmp_path),
        autodiscover=False,
    )
    return app.Table("things", default=None, key_type=bytes, partitions=12)


def test_rocksdb_refuses_a_write_outside_any_event(tmp_path: Path) -> None:
    """What the view works around: faust's RocksDB store picks a partition's database
    from the event being processed, and a timer has none."""
    store = _table(tmp_path).data
    with pytest.raises(AssertionError):
        store[b"k"] = {"a": 1}


def test_on_partition_writes_into_that_partitions_database(tmp_path: Path) -> None:
    store = _table(tmp_path).data
    with on_partition(3):
        store[b"k"] = {"a": 1}
    with on_partition(7):
        store[b"j"] = {"b": 2}
    assert sorted(store._dbs) == [3, 7]
    assert store._key_index[b"k"] == 3 and store._key_index[b"j"] == 7
    assert store[b"k"] == {"a": 1} and store[b"j"] == {"b": 2}  # read back outside any event
    with pytest.raises(AssertionError):  # the stand-in is gone after the block
        store[b"x"] = {"c": 3}
