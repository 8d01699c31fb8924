"""The usage view (faust app), its price books, the HTTP ingest edge and its key
store, and the usage API client.

Part of the composition root (:mod:`streams.bootstrap`): only entry points import it.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from streams.adapters.kafka import ensure_topics, faust_credentials, make_reader
from streams.bootstrap.clients import (
    producer,
    redis_client,
    require_profile,
)
from streams.bootstrap.runtime import tune_gc
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS

if TYPE_CHECKING:  # imported when called: the demo and the drill pull in the fake services
    from streams.apps.ingest.keys import ApiKeyFile
    from streams.apps.usage_view.app import ViewConfig
    from streams.apps.usage_view.price_book import PriceBookSource

log = logging.getLogger("streams.bootstrap")


def view_price_books(
    settings: Settings, price_book: Path | None = None, *, wait_s: float = 10.0
) -> PriceBookSource:
    """The view's price book source: ``price_book`` (or ``settings.view.price_book``), a
    file reloaded when it changes; neither: the published book, read from the
    price-book topic (under ``kafka.topic_prefix``) by a daemon thread on a reader
    consumer, after waiting up to ``wait_s`` for it to reach the topic's end (so the
    first records are rated under the book the invoice job will use).

    Raises:
        PriceBookError: the file does not validate.
        OSError: the file cannot be read.
    """
    from streams.apps.usage_view.price_book import (
        FilePriceBook,
        PriceBookTopicReader,
        PublishedPriceBook,
    )
    from streams.topics import PRICE_BOOK

    path = price_book or settings.view.price_book
    if path is not None:
        return FilePriceBook(path)
    spec = PRICE_BOOK.with_prefix(settings.kafka.topic_prefix)
    readers: list[PriceBookTopicReader] = []
    book = PublishedPriceBook(sync=lambda timeout_s: readers[0].caught_up(timeout_s))
    reader = PriceBookTopicReader(
        make_reader(settings.kafka, f"{settings.view.group}-price-book"),
        spec.name,
        spec.partitions,
        book,
    )
    readers.append(reader)
    if not reader.caught_up(wait_s):
        log.warning("usage view: the price book topic %s not read to its end yet", spec.name)
    return book


def view_config(settings: Settings, *, port: int | None = None) -> ViewConfig:
    """One view instance's :class:`~streams.apps.usage_view.app.ViewConfig` from settings:
    the group and topic (under ``kafka.topic_prefix``), ``port`` (default
    ``settings.view.port``), its own data folder per port."""
    from streams.apps.usage_view.app import RocksDBBounds, ViewConfig

    view = settings.view
    web_port = port if port is not None else view.port
    base = view.data_dir or settings.stack.local_dir / "data" / "usage-view"
    source = ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix)
    replication = settings.kafka.replication(ACCOUNT_EVENTS.name)
    return ViewConfig(
        app_id=view.group,
        brokers=settings.kafka.bootstrap_servers,
        source_topic=source.name,
        partitions=source.partitions,
        host=view.host,
        port=web_port,
        store=f"{view.store}://",
        datadir=base / f"{view.group}-{web_port}",
        standby_replicas=view.standby_replicas,
        retain_closed=timedelta(days=view.retain_closed_days),
        retain_open=timedelta(days=view.retain_open_days),
        cleanup_interval_s=view.cleanup_interval_s,
        advertised_host=view.advertised_host,
        replication_factor=replication.replication_factor,
        min_insync_replicas=replication.min_insync_replicas,
        broker_credentials=faust_credentials(settings.kafka),
        forward_timeout_s=view.forward_timeout_s,
        changelog_linger_s=view.changelog_linger_s,
        changelog_batch_bytes=view.changelog_batch_bytes,
        batch_max_records=view.batch_max_records,
        batch_wait_s=view.batch_wait_s,
        rocksdb=RocksDBBounds(
            block_cache_bytes=view.rocksdb_block_cache_bytes,
            write_buffer_bytes=view.rocksdb_write_buffer_bytes,
            max_write_buffers=view.rocksdb_max_write_buffers,
        ),
    )


def run_usage_view(
    settings: Settings,
    *,
    port: int | None = None,
    price_book: Path | None = None,
    loglevel: str = "INFO",
) -> None:
    """Build and run one usage view instance until SIGTERM/SIGINT; its API checks bearer
    keys against :func:`api_key_store` (the edge's file). Same errors as
    :func:`view_price_books`."""
    from streams.apps.usage_view.app import changelog_topics, create_app, run_view

    require_profile(settings)
    books = view_price_books(settings, price_book)
    config = view_config(settings, port=port)
    ensure_topics(settings.kafka, changelog_topics(config))
    app = create_app(config, books, keys=api_key_store(settings))
    tune_gc(settings.worker.gc_threshold)
    run_view(app, loglevel=loglevel)


def api_keys_path(settings: Settings) -> Path:
    """The file of hashed API keys (``settings.ingest.api_keys_file``, default under ``.local/data``)."""
    return settings.ingest.api_keys_file or settings.stack.local_dir / "data" / "api-keys.json"


def api_key_store(settings: Settings) -> ApiKeyFile:
    """The hashed API keys the edge checks and ``invoicing api-keys`` writes."""
    from streams.apps.ingest.keys import ApiKeyFile

    return ApiKeyFile(api_keys_path(settings))


def run_ingest_edge(settings: Settings, *, port: int | None = None) -> None:
    """Build the edge's clients (producer, Redis, API keys) and serve until SIGTERM/SIGINT."""
    from streams.apps.ingest.idempotency import RedisIdempotency
    from streams.apps.ingest.server import EdgeConfig, serve

    require_profile(settings)
    ingest = settings.ingest
    config = EdgeConfig(
        host=ingest.host,
        port=port if port is not None else ingest.port,
        topic=ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name,
        max_body_bytes=ingest.max_body_bytes,
        max_batch_events=ingest.max_batch_events,
        delivery_timeout_s=ingest.delivery_timeout_s,
        max_in_flight=ingest.max_in_flight,
        max_in_flight_per_key=ingest.max_in_flight_per_key,
        default_rate_limit=ingest.key_rate_limit,
    )
    with contextlib.closing(redis_client(settings)) as redis_conn:
        serve(
            config,
            producer=producer(settings, **{"linger.ms": 5}),
            keys=api_key_store(settings),
            idempotency=RedisIdempotency(
                redis_conn,
                ttl_s=ingest.idempotency_ttl_s,
                # v2: claims hold source + content (claim_digest); a claim of the
                # content alone, from before, would read as a conflict, so it is ignored
                # (a resend it covered is produced once more and deduplicated downstream)
                prefix=f"ingest:v2:{settings.kafka.topic_prefix}",
            ),
        )


def usage_client(
    settings: Settings, *, url: str | None = None, timeout_s: float = 10.0
) -> httpx.Client:
    """An HTTP client based at a view instance (``url`` or ``settings.view.url``), sending
    ``settings.view.api_key`` as its bearer key when set."""
    key = settings.view.api_key
    headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key is not None else None
    return httpx.Client(base_url=url or settings.view.url, timeout=timeout_s, headers=headers)
