"""The composition root: the one module that builds pools, clients and workers from settings.

Everything else receives what it needs as arguments (CONVENTIONS §6). Nothing is
built at import time; each factory builds on call, and the caller owns (and
closes) what it gets.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
import redis
from confluent_kafka import Consumer, Producer
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from streams.adapters.connect import connector_status
from streams.adapters.kafka import ensure_topics, make_consumer, make_producer, make_reader
from streams.adapters.lease import DEFAULT_KEY_PREFIX
from streams.adapters.tax.cache import RedisTaxCache
from streams.adapters.tax.client import HttpTaxService
from streams.importers.close_period import DEFAULT_SCAN_MARGIN, CloseSummary, close_period
from streams.importers.focus_import import FLUSH_TIMEOUT_S, ImportSummary, import_focus
from streams.ops.status import StatusSources
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS

if TYPE_CHECKING:  # imported when called: the demo and the drill pull in the fake services
    from streams.demo.run import DemoClients
    from streams.drill.run import DrillClients
    from streams.ingest.keys import ApiKeyFile
    from streams.usage_view.app import ViewConfig
    from streams.usage_view.price_book import PriceBookSource


def postgres_pool(settings: Settings, *, name: str = "invoicing", **kwargs: Any) -> ConnectionPool:
    """A psycopg connection pool for the application role; opened, waits until usable.

    Raises:
        psycopg_pool.PoolTimeout: the database did not answer within 30 s.
    """
    pg = settings.postgres
    pool = ConnectionPool(
        pg.dsn(),
        min_size=kwargs.pop("min_size", pg.pool_min_size),
        max_size=kwargs.pop("max_size", pg.pool_max_size),
        name=name,
        open=False,
        kwargs={"autocommit": False},
        **kwargs,
    )
    pool.open(wait=True, timeout=30.0)
    return pool


def redis_client(settings: Settings) -> redis.Redis:
    """A Redis client with the configured timeouts (no connection is made until used).

    redis-py 8 retries 3 times with backoff by default; we retry once, at once, so
    that a dead Redis costs one timeout per call (Redis down must slow the system
    down, not stall it: callers treat a failure as a cache miss or a refused lease).
    """
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1),
    )


def tax_service(settings: Settings, redis_conn: redis.Redis | None = None) -> HttpTaxService:
    """The HTTP tax client, with the Redis result/rate cache when ``redis_conn`` is given."""
    cache = (
        RedisTaxCache(redis_conn, ttl_s=settings.tax.cache_ttl_s)
        if redis_conn is not None
        else None
    )
    return HttpTaxService(settings.tax, cache=cache)


def producer(settings: Settings, **overrides: Any) -> Producer:
    """A Kafka producer with the project's guarantees (murmur2, idempotent, acks=all)."""
    return make_producer(settings.kafka, **overrides)


def consumer(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    """A Kafka consumer of ``group_id`` (manual commits, cooperative-sticky, no static membership)."""
    return make_consumer(settings.kafka, group_id, **overrides)


# ================================================================================================
# The commands' clients and wiring (streams.entrypoints): import, close-period, ops, drill, demo.
#
# The logic in streams.importers, streams.ops, streams.drill and streams.demo receives what it
# reads and writes through; these functions build it from settings. A client kept for the length
# of a run (producer, pool, Redis) is passed in and closed by whoever built it; a client needed
# for one step is passed as a factory, and the step closes what the factory built. The run_*
# functions build a run's clients, run it and close them: the commands, the demo and the drill
# (through DemoClients / DrillClients) and the tests call them.
# ================================================================================================


def connection(
    settings: Settings, *, autocommit: bool = True, connect_timeout_s: int | None = None
) -> psycopg.Connection[TupleRow]:
    """A new connection of the application role (autocommit unless told otherwise); the
    caller closes it (leaving its ``with`` block commits an open transaction).

    Raises:
        psycopg.OperationalError: the database did not answer (within
            ``connect_timeout_s`` seconds when given).
    """
    options: dict[str, Any] = {"autocommit": autocommit}
    if connect_timeout_s is not None:
        options["connect_timeout"] = connect_timeout_s
    return psycopg.connect(settings.postgres.dsn(), **options)


def reader(settings: Settings, group_id: str, **overrides: Any) -> Consumer:
    """A consumer that never joins ``group_id`` and commits nothing: it reads the group's
    committed offsets and the watermarks, or partitions it assigns itself."""
    return make_reader(settings.kafka, group_id, **overrides)


def topic_reader(settings: Settings) -> Consumer:
    """The consumer ``reconcile`` reads the invoices topic with: assign only, a group id of
    its own (``reconcile-<8 hex>``), ``read_committed``."""
    return reader(
        settings, f"reconcile-{uuid.uuid4().hex[:8]}", **{"isolation.level": "read_committed"}
    )


def scan_consumer(settings: Settings) -> Consumer:
    """The consumer of close-period's topic scan: the project's consumer configuration under
    a group id of its own (``close-period-scan-<32 hex>``) that assigns, never subscribes,
    commits nothing, and reports the end of each partition (``enable.partition.eof``)."""
    return consumer(
        settings,
        f"close-period-scan-{uuid.uuid4().hex}",
        **{"enable.partition.eof": True, "enable.auto.commit": False},
    )


def connect_client(settings: Settings, *, timeout_s: float = 10.0) -> httpx.Client:
    """An HTTP client based at Kafka Connect's REST URL; the caller closes it."""
    return httpx.Client(base_url=settings.connect.url, timeout=timeout_s)


def outbox_connector_status(settings: Settings) -> dict[str, Any] | None:
    """The outbox connector's status from Connect (None when it is not registered).

    Raises:
        httpx.HTTPError: Connect did not answer, or answered an error.
    """
    with connect_client(settings) as client:
        return connector_status(client, settings.connect.outbox_connector)


def status_sources(settings: Settings) -> StatusSources:
    """What ``invoicing status`` reads through (:class:`streams.ops.status.StatusSources`)."""
    return StatusSources(
        database=lambda: connection(settings, connect_timeout_s=5),
        consumer=lambda group_id: reader(settings, group_id),
        connector=lambda: outbox_connector_status(settings),
    )


def run_import_focus(
    path: Path,
    settings: Settings,
    *,
    progress: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
) -> ImportSummary:
    """:func:`streams.importers.focus_import.import_focus` with a new :func:`producer`
    (flushed by the import; a producer has nothing to close). Same errors."""
    return import_focus(
        path,
        settings,
        producer=producer(settings),
        progress=progress,
        flush_timeout_s=flush_timeout_s,
    )


def run_close_period(
    period: str,
    settings: Settings,
    *,
    lease_ttl_s: float = 30.0,
    progress: bool = True,
    holder: str | None = None,
    scan_margin: timedelta = DEFAULT_SCAN_MARGIN,
    lease_key_prefix: str = DEFAULT_KEY_PREFIX,
) -> CloseSummary:
    """:func:`streams.importers.close_period.close_period` with its clients: a pool of 1-2
    connections (``close-period``), a Redis client, a producer and :func:`scan_consumer`;
    the pool and the Redis client are closed after the run. Same errors."""
    with (
        contextlib.closing(
            postgres_pool(settings, name="close-period", min_size=1, max_size=2)
        ) as pool,
        contextlib.closing(redis_client(settings)) as redis_conn,
    ):
        return close_period(
            period,
            settings,
            producer=producer(settings),
            redis_conn=redis_conn,
            pool=pool,
            scan_consumer=lambda: scan_consumer(settings),
            lease_ttl_s=lease_ttl_s,
            progress=progress,
            holder=holder,
            scan_margin=scan_margin,
            lease_key_prefix=lease_key_prefix,
        )


def naive_drill_redis(settings: Settings) -> redis.Redis:
    """The naive drill's Redis client: a plain one with a 10 s socket timeout, as the
    failed design's workers had (no retry policy of ours: it reproduces that design)."""
    return redis.Redis.from_url(settings.redis.url, socket_timeout=10)


def drill_clients() -> DrillClients:
    """What ``invoicing drill`` runs through (:class:`streams.drill.run.DrillClients`)."""
    from streams.drill.run import DrillClients

    return DrillClients(redis=naive_drill_redis, producer=producer, close_period=run_close_period)


def demo_clients() -> DemoClients:
    """What ``invoicing demo`` runs through (:class:`streams.demo.run.DemoClients`)."""
    from streams.demo.run import DemoClients

    return DemoClients(
        import_focus=run_import_focus, close_period=run_close_period, database=connection
    )


# ================================================================================================
# The usage view and the HTTP ingest edge (issue 13): their faust app, price book source,
# producer, Redis idempotency store and API keys, built from settings. Only
# streams.entrypoints.usage (and tests) call these.
# ================================================================================================


def view_price_books(settings: Settings, price_book: Path | None = None) -> PriceBookSource:
    """The view's price book source: ``price_book`` (or ``settings.view.price_book``), a
    file reloaded when it changes; neither: the empty book (pass-through customers only).

    Raises:
        PriceBookError: the file does not validate.
        OSError: the file cannot be read.
    """
    from streams.usage_view.price_book import FilePriceBook, StaticPriceBook

    path = price_book or settings.view.price_book
    return FilePriceBook(path) if path is not None else StaticPriceBook()


def view_config(settings: Settings, *, port: int | None = None) -> ViewConfig:
    """One view instance's :class:`~streams.usage_view.app.ViewConfig` from settings:
    the group and topic (under ``kafka.topic_prefix``), ``port`` (default
    ``settings.view.port``), its own data folder per port."""
    from streams.usage_view.app import ViewConfig

    view = settings.view
    web_port = port if port is not None else view.port
    base = view.data_dir or settings.stack.local_dir / "data" / "usage-view"
    source = ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix)
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
    )


def run_usage_view(
    settings: Settings,
    *,
    port: int | None = None,
    price_book: Path | None = None,
    loglevel: str = "INFO",
) -> None:
    """Build and run one usage view instance until SIGTERM/SIGINT. Same errors as
    :func:`view_price_books`."""
    from streams.usage_view.app import changelog_topics, create_app, run_view

    books = view_price_books(settings, price_book)
    config = view_config(settings, port=port)
    ensure_topics(settings.kafka, changelog_topics(config))
    app = create_app(config, books)
    run_view(app, loglevel=loglevel)


def api_keys_path(settings: Settings) -> Path:
    """The file of hashed API keys (``settings.ingest.api_keys_file``, default under ``.local/data``)."""
    return settings.ingest.api_keys_file or settings.stack.local_dir / "data" / "api-keys.json"


def api_key_store(settings: Settings) -> ApiKeyFile:
    """The hashed API keys the edge checks and ``invoicing api-keys`` writes."""
    from streams.ingest.keys import ApiKeyFile

    return ApiKeyFile(api_keys_path(settings))


def run_ingest_edge(settings: Settings, *, port: int | None = None) -> None:
    """Build the edge's clients (producer, Redis, API keys) and serve until SIGTERM/SIGINT."""
    from streams.ingest.idempotency import RedisIdempotency
    from streams.ingest.server import EdgeConfig, serve

    ingest = settings.ingest
    config = EdgeConfig(
        host=ingest.host,
        port=port if port is not None else ingest.port,
        topic=ACCOUNT_EVENTS.with_prefix(settings.kafka.topic_prefix).name,
        max_body_bytes=ingest.max_body_bytes,
        max_batch_events=ingest.max_batch_events,
        delivery_timeout_s=ingest.delivery_timeout_s,
    )
    with contextlib.closing(redis_client(settings)) as redis_conn:
        serve(
            config,
            producer=producer(settings, **{"linger.ms": 5}),
            keys=api_key_store(settings),
            idempotency=RedisIdempotency(
                redis_conn,
                ttl_s=ingest.idempotency_ttl_s,
                prefix=f"ingest:{settings.kafka.topic_prefix}",
            ),
        )


def usage_client(
    settings: Settings, *, url: str | None = None, timeout_s: float = 10.0
) -> httpx.Client:
    """An HTTP client based at a view instance (``url`` or ``settings.view.url``)."""
    return httpx.Client(base_url=url or settings.view.url, timeout=timeout_s)
