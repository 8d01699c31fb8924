"""The facts the view's routing rests on, pinned without a broker: the tables' changelog
keys are the raw customer id bytes, faust's producer partitioner is Java's murmur2 (as
our producers' ``murmur2_random``), and the changelog topics are co-partitioned with
the source. Plus the import rule for the view's pure modules and the edge's keys and
idempotency twin."""

from __future__ import annotations

import json
import stat
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner

from streams.apps.ingest.idempotency import Claim, MemoryIdempotency
from streams.apps.ingest.keys import ApiKeyFile, UnknownKey
from streams.apps.ops.focus_expected import expected_from_file
from streams.apps.usage_view.app import (
    RocksDBBounds,
    ViewConfig,
    changelog_topics,
    create_app,
    tables_of,
    usage_path,
)
from streams.apps.usage_view.price_book import StaticPriceBook
from tests.support.kafka import java_partition
from tests.unit.test_import_rule import forbidden_imports

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_IDS = sorted(
    {c for c, _ in expected_from_file(ROOT / "examples" / "focus" / "focus_sample.csv").sums}
)


def config(tmp_path: Path) -> ViewConfig:
    return ViewConfig(
        app_id="t-view",
        brokers="127.0.0.1:1",
        source_topic="billing.account-events.v1",
        partitions=12,
        host="127.0.0.1",
        port=18799,
        store="memory://",
        datadir=tmp_path,
        standby_replicas=0,
        retain_closed=timedelta(days=35),
        retain_open=timedelta(days=400),
        cleanup_interval_s=3600,
    )


def test_aiokafka_default_partitioner_is_javas_murmur2_on_the_raw_id() -> None:
    partitioner = DefaultPartitioner()
    partitions = list(range(12))
    for customer in [*SAMPLE_IDS, "acme", "/subscriptions/a/b", "é-unicode"]:
        key = customer.encode()
        assert partitioner(key, partitions, partitions) == java_partition(key, 12), customer


def test_tables_key_by_raw_bytes_and_share_the_source_partitioning(tmp_path: Path) -> None:
    app = create_app(config(tmp_path), StaticPriceBook(), keys=ApiKeyFile(tmp_path / "keys.json"))
    for name in ("customers", "periods", "event_ids", "usage_days"):
        table: Any = app.tables[name]
        assert table.key_serializer == "raw", name
        topic = table.changelog_topic
        assert topic.get_topic_name() == f"t-view-{name}-changelog"
        # what faust's router hashes: the key as the changelog serialises it
        assert topic.prepare_key("/subscriptions/x", None)[0] == b"/subscriptions/x"
        assert table.partitions == 12 and not table.use_partitioner
    specs = changelog_topics(config(tmp_path))
    assert [s.name for s in specs] == [
        f"t-view-{n}-changelog" for n in ("customers", "periods", "event_ids", "usage_days")
    ]
    assert {s.partitions for s in specs} == {12} and {s.cleanup_policy for s in specs} == {
        "compact"
    }


def test_usage_path_percent_encodes_slashes() -> None:
    assert (
        usage_path("/subscriptions/a b", "2024-09")
        == "/v1/customers/%2Fsubscriptions%2Fa%20b/usage?period=2024-09"
    )


@pytest.mark.parametrize(
    "module",
    [
        "apps/usage_view/state.py",
        "apps/usage_view/preview.py",
        "core/domain/http.py",
        "apps/usage_view/scenario.py",
        "apps/ingest/edge.py",
    ],
)
def test_pure_modules_import_no_io_library(module: str) -> None:
    path = ROOT / "streams" / module
    assert forbidden_imports(path.read_text(), str(path)) == []


def test_api_keys_are_hashed_at_rest_and_revocable(tmp_path: Path) -> None:
    store = ApiKeyFile(tmp_path / "keys.json")
    key_id, token = store.create("billing-sync")
    assert store.verify(token) is not None
    text = (tmp_path / "keys.json").read_text()
    assert token not in text and token.split(".", 1)[1] not in text
    assert json.loads(text)["keys"][0]["key_id"] == key_id
    assert stat.S_IMODE((tmp_path / "keys.json").stat().st_mode) == 0o600
    assert store.verify(token + "x") is None and store.verify("garbage") is None
    other = ApiKeyFile(tmp_path / "keys.json")  # another process: the edge
    assert other.verify(token) is not None
    store.revoke(key_id)
    assert other.verify(token) is None  # re-read on change, no restart
    with pytest.raises(UnknownKey):
        store.revoke("nope")


def test_idempotency_twin() -> None:
    claims = MemoryIdempotency()
    assert claims.claim([("a", "d1"), ("b", "d2")]) == [Claim.NEW, Claim.NEW]
    assert claims.claim([("a", "d1"), ("a", "other")]) == [Claim.PENDING, Claim.CONFLICT]
    claims.done([("a", "d1")])
    claims.release([("b", "d2")])
    assert claims.claim([("a", "d1"), ("b", "d2")]) == [Claim.DUPLICATE, Claim.NEW]


class FakeTable(dict[bytes, Any]):
    """What :func:`expire` uses of a faust table: the mapping, ``data`` and ``send_changelog``."""

    def __init__(self) -> None:
        super().__init__()
        self.data = self
        self.sent: list[tuple[int, bytes, Any]] = []

    def send_changelog(
        self, partition: int, key: bytes, value: Any, value_serializer: str | None = None
    ) -> None:
        self.sent.append((partition, key, value))


def test_retention_drops_closed_periods_and_their_ids_with_tombstones_on_their_partition(
    tmp_path: Path,
) -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    from faust.types import TP

    from streams.apps.usage_view import state
    from streams.apps.usage_view.retention import expire

    # the open period is kept (retain_open far away), the closed one is past retain_closed
    cfg = replace(config(tmp_path), retain_open=timedelta(days=100_000))
    customers, periods, ids = FakeTable(), FakeTable(), FakeTable()
    closed = {"closed_at": "2024-10-01T00:00:00Z", "offset": 9, "reason": "period_closed"}
    for customer_id, partition in (("a", 3), ("b", 5)):
        customers[customer_id.encode()] = {
            **state.new_customer(customer_id, partition),
            "periods": ["2024-08", "2024-09"],
        }
        for period in ("2024-08", "2024-09"):
            value = {
                **state.new_period(customer_id, period, partition),
                "closed": closed if period == "2024-08" else None,
            }
            periods[state.period_key(customer_id, period).encode()] = value
            ids[f"{customer_id}-{period}".encode()] = state.seen_value("d", period, partition, 1)
    # this instance owns partition 3 only
    app = SimpleNamespace(
        assignor=SimpleNamespace(assigned_actives=lambda: {TP(cfg.source_topic, 3)})
    )
    dropped = expire(app, cfg, customers, periods, ids)  # type: ignore[arg-type]
    assert dropped == {"periods": 1, "event_ids": 1, "subscription_events": 0}
    assert b"a|2024-08" not in periods and b"b|2024-08" in periods and b"a|2024-09" in periods
    assert periods.sent == [(3, b"a|2024-08", None)]
    assert ids.sent == [(3, b"a-2024-08", None)] and b"b-2024-08" in ids
    assert customers[b"a"]["periods"] == ["2024-09"] and customers.sent[0][0] == 3


def test_retention_drops_the_chunks_of_ids_of_a_dropped_period_and_forgets_their_ids(
    tmp_path: Path,
) -> None:
    from dataclasses import replace
    from types import SimpleNamespace

    from faust.types import TP

    from streams.apps.usage_view import state
    from streams.apps.usage_view.event_index import EventIndex, chunk_key
    from streams.apps.usage_view.retention import expire

    cfg = replace(config(tmp_path), retain_open=timedelta(days=100_000))
    customers, periods, ids = FakeTable(), FakeTable(), FakeTable()
    closed = {"closed_at": "2024-10-01T00:00:00Z", "offset": 9, "reason": "period_closed"}
    customers[b"a"] = {**state.new_customer("a", 3), "periods": ["2024-08", "2024-09"]}
    for period in ("2024-08", "2024-09"):
        periods[state.period_key("a", period).encode()] = {
            **state.new_period("a", period, 3),
            "closed": closed if period == "2024-08" else None,
        }
        ids[chunk_key(3, period, 1)] = {
            f"a-{period}-{n}": state.seen_value("d", period, 3, n) for n in (1, 2)
        }
    index = EventIndex()
    index.ensure(ids, 1, {3})
    app = SimpleNamespace(
        assignor=SimpleNamespace(assigned_actives=lambda: {TP(cfg.source_topic, 3)})
    )
    dropped = expire(app, cfg, customers, periods, ids, None, index)  # type: ignore[arg-type]
    assert dropped == {"periods": 1, "event_ids": 2, "subscription_events": 0}
    assert ids.sent == [(3, chunk_key(3, "2024-08", 1), None)]
    assert chunk_key(3, "2024-09", 1) in ids
    assert index.get(3, "a-2024-08-1") is None and index.get(3, "a-2024-09-1") is not None


def test_retention_bounds_the_subscription_history_of_owned_customers(tmp_path: Path) -> None:
    from dataclasses import replace
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from faust.types import TP

    from streams.apps.usage_view import state
    from streams.apps.usage_view.retention import expire
    from streams.core.domain.events import SubscriptionChanged

    cfg = replace(config(tmp_path), retain_open=timedelta(days=400))
    history = [
        {
            "type": "subscription.changed",
            "data": SubscriptionChanged(
                customer_id="a",
                effective_at=datetime(2020, 1 + n % 12, 1, tzinfo=UTC)
                + timedelta(days=365 * (n // 12)),
                plan_code="growth",
                plan_version=1 + n % 2,
            ).model_dump(mode="json"),
        }
        for n in range(24)  # 2020-2021: all before the horizon (400 days before now)
    ]
    customers, periods, ids = FakeTable(), FakeTable(), FakeTable()
    for customer_id, partition in (("a", 3), ("b", 5)):
        customers[customer_id.encode()] = {
            **state.new_customer(customer_id, partition),
            "subscriptions": history,
        }
    app = SimpleNamespace(
        assignor=SimpleNamespace(assigned_actives=lambda: {TP(cfg.source_topic, 3)})
    )
    dropped = expire(app, cfg, customers, periods, ids)  # type: ignore[arg-type]
    assert dropped["subscription_events"] == 23
    assert customers[b"a"]["subscriptions"] == [history[-1]]  # the state from then on
    assert [(partition, key) for partition, key, _ in customers.sent] == [(3, b"a")]
    assert customers[b"b"]["subscriptions"] == history  # not this instance's partition


def test_price_book_file_reloads_and_keeps_the_last_good_book(tmp_path: Path) -> None:
    import os

    from streams.apps.usage_view.price_book import FilePriceBook, PublishedPriceBook
    from streams.core.domain.rating import PriceBookError

    book_file = tmp_path / "book.yaml"
    book_file.write_text((ROOT / "examples" / "pricing" / "price-book.yaml").read_text())
    source = FilePriceBook(book_file, check_every_s=0)
    book, label = source.current()
    assert book.plan("growth") is not None and label == "file book.yaml"
    book_file.write_text("schema_version: 1\nmetrics: []\nplans: []\n")
    os.utime(book_file, ns=(1, 1))
    assert source.current()[0].plans == ()
    book_file.write_text("plans: [{code: 1}]\n")  # invalid: logged, the last good book kept
    os.utime(book_file, ns=(2, 2))
    assert source.current()[0].plans == ()
    bad = tmp_path / "bad.yaml"
    bad.write_text("plans: nope\n")
    with pytest.raises(PriceBookError):
        FilePriceBook(bad)
    published = PublishedPriceBook(fallback=source)  # nothing published: the file answers
    assert published.current() == (source.current()[0], "file book.yaml")


def test_published_price_book_assembles_entries_and_syncs_on_refresh() -> None:
    from datetime import UTC, datetime

    from streams.apps.usage_view.price_book import EMPTY_LABEL, PublishedPriceBook
    from streams.core.domain.rating import load_price_book
    from streams.core.domain.rating.published import assemble, entries_of

    relay = load_price_book((ROOT / "examples" / "pricing" / "price-book.yaml").read_text())
    entries = entries_of(relay, published_at=datetime(2024, 9, 1, tzinfo=UTC))
    syncs: list[float] = []
    pending = list(entries)

    def sync(timeout_s: float) -> bool:  # the reader catching up with the topic's end
        syncs.append(timeout_s)
        while pending:
            book.take(pending.pop())
        return True

    book = PublishedPriceBook(sync=sync, sync_every_s=3600)
    assert book.current()[1] == EMPTY_LABEL and syncs == []  # no entry yet: the fallback
    found, label = book.current(refresh=True)  # a metered event of an unknown metric
    assert found == assemble(entries) and found.plan("growth") is not None
    assert label.startswith(f"published ({len(relay.metrics)} metric(s)")
    assert book.current(refresh=True)[0] is found and len(syncs) == 1  # once per sync_every_s
    book.take(entries[0])  # the same entry again (compaction keeps one per key)
    assert book.current()[0] == found


def test_a_refresh_for_an_unknown_metric_leaves_the_event_loop_running() -> None:
    """The published book syncs with the topic in a thread: while it waits (here 0.3 s),
    other coroutines of the loop (the HTTP answers, faust's timers) go on; a batch
    whose metrics the book defines syncs nothing."""
    import asyncio
    import time as clock
    from datetime import UTC, datetime

    from streams.apps.usage_view.price_book import PublishedPriceBook, refresh_for_metrics
    from streams.core.domain.rating import load_price_book
    from streams.core.domain.rating.published import entries_of

    relay = load_price_book((ROOT / "examples" / "pricing" / "price-book.yaml").read_text())
    known = relay.metrics[0].code
    syncs: list[float] = []

    def sync(timeout_s: float) -> bool:  # a broker that takes its time to answer
        syncs.append(timeout_s)
        clock.sleep(0.3)
        return True

    book = PublishedPriceBook(sync=sync, sync_every_s=0)
    for entry in entries_of(relay, published_at=datetime(2024, 9, 1, tzinfo=UTC)):
        book.take(entry)

    async def main() -> tuple[bool, bool, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        looked_known = await refresh_for_metrics(book, {known})
        looked_new = await refresh_for_metrics(book, {known, "metric-published-a-moment-ago"})
        task.cancel()
        return looked_known, looked_new, ticks

    looked_known, looked_new, ticks = asyncio.run(main())
    assert looked_known is False and looked_new is True
    assert len(syncs) == 1
    assert ticks >= 10  # about 30 in 0.3 s; a sync on the loop itself would leave 0-1


def test_changelogs_are_produced_in_large_lz4_batches(tmp_path: Path) -> None:
    conf = create_app(
        config(tmp_path), StaticPriceBook(), keys=ApiKeyFile(tmp_path / "keys.json")
    ).conf
    assert conf.producer_compression_type == "lz4"
    assert conf.producer_linger == 0.010
    # a batch fits in one request, and one request in the broker's 1 MB default
    assert 16384 < conf.producer_max_batch_size <= conf.producer_max_request_size <= 1_000_000


def test_each_rocksdb_table_opens_with_the_configured_memory_bounds(tmp_path: Path) -> None:
    """faust's defaults are a 2 GiB block cache and 3 x 64 MiB memtables per database (one
    database per table partition): every table of the view opens its databases with the
    configured bounds instead, read back from a real RocksDB database (its block cache
    capacity, and the OPTIONS file RocksDB writes)."""
    bounds = RocksDBBounds(
        block_cache_bytes=3 * 1024 * 1024, write_buffer_bytes=1024 * 1024, max_write_buffers=2
    )
    cfg = replace(config(tmp_path), store="rocksdb://", rocksdb=bounds)
    app = create_app(cfg, StaticPriceBook(), keys=ApiKeyFile(tmp_path / "keys.json"))
    assert bounds.per_database_bytes() == 5 * 1024 * 1024
    for table in tables_of(app):
        store: Any = table.data
        db = store.rocksdb_options.open(tmp_path / f"{table.name}-probe")
        try:
            assert db.property_int_value("rocksdb.block-cache-capacity") == 3 * 1024 * 1024
        finally:
            db.close()
        (options_file,) = (tmp_path / f"{table.name}-probe").glob("OPTIONS-*")
        text = options_file.read_text()
        assert "write_buffer_size=1048576" in text, table.name
        assert "max_write_buffer_number=2" in text, table.name


def test_the_memory_store_takes_no_rocksdb_options(tmp_path: Path) -> None:
    app = create_app(config(tmp_path), StaticPriceBook(), keys=ApiKeyFile(tmp_path / "keys.json"))
    assert all(not table.options for table in tables_of(app))
