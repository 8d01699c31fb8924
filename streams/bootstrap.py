"""The composition root: the one module that builds pools, clients and workers from settings.

Everything else receives what it needs as arguments (CONVENTIONS §6). Nothing is
built at import time; each factory builds on call, and the caller owns (and
closes) what it gets. Clients: :func:`postgres_pool`, :func:`redis_client`,
:func:`tax_service`, :func:`producer`, :func:`consumer`. Processes:
:func:`invoicing_worker` / :func:`run_invoicing_worker` (the invoicing worker),
:func:`email_sender` / :func:`run_email_sender` (the email sender),
:func:`replay_clients` / :func:`replay_period` (a replay run). The worker, the
email sender and the replay import nothing from here; only entrypoints do.

Database roles (docs/roles.md): every pool and connection names the login it uses —
the invoicing worker ``worker``, the email sender ``email``, close-period ``close``, a
replay run ``replay``, the status view and the read-only commands ``operator``, the
operator commands that write ``admin``. Nothing here connects as the owner (migrations,
:mod:`streams.adapters.migrate`) or the provisioner (sandbox databases).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from pathlib import Path
from types import FrameType
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
from streams.billing.ports import TaxService
from streams.importers.close_period import DEFAULT_SCAN_MARGIN, CloseSummary, close_period
from streams.importers.events_import import EventsImportSummary, import_events
from streams.importers.focus_import import (
    FLUSH_TIMEOUT_S,
    IMPORT_PRODUCER_OVERRIDES,
    ImportSummary,
    import_focus,
)
from streams.ops.status import StatusSources
from streams.settings import RoleName, Settings
from streams.topics import ACCOUNT_EVENTS

if TYPE_CHECKING:  # imported when called: the demo and the drill pull in the fake services
    from streams.demo.pricing.run import PricingDemoClients
    from streams.demo.run import DemoClients
    from streams.drill.run import DrillClients
    from streams.email.sender import EmailSender
    from streams.importers.price_book import PublishSummary
    from streams.ingest.keys import ApiKeyFile
    from streams.invoicing.worker import InvoicingWorker
    from streams.replay.report import ReplayReport
    from streams.replay.run import ReplayClients
    from streams.usage_view.app import ViewConfig
    from streams.usage_view.price_book import PriceBookSource

log = logging.getLogger("streams.bootstrap")


def postgres_pool(
    settings: Settings, *, role: RoleName, name: str = "invoicing", **kwargs: Any
) -> ConnectionPool:
    """A psycopg connection pool whose connections log in as ``role`` (one of
    :class:`streams.settings.PostgresSettings`' logins: ``"worker"``, ``"email"``,
    ``"close"``, ``"replay"``, ...; docs/roles.md says what each may do); opened, waits
    until usable. The connection string is built by
    :meth:`~streams.settings.PostgresSettings.dsn` (every value quoted by libpq's rules).

    Raises:
        psycopg_pool.PoolTimeout: the database did not answer within 30 s (the message
            names the pool, never the password).
    """
    pg = settings.postgres
    pool = ConnectionPool(
        pg.dsn(role),
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
        settings.redis.url.get_secret_value(),
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1),
    )


def tax_service(
    settings: Settings,
    redis_conn: redis.Redis | None = None,
    *,
    quotes_from_cached_rates: bool = True,
) -> HttpTaxService:
    """The HTTP tax client, with the Redis result/rate cache when ``redis_conn`` is given
    (``quotes_from_cached_rates``: see :class:`~streams.adapters.tax.client.HttpTaxService`)."""
    cache = (
        RedisTaxCache(redis_conn, ttl_s=settings.tax.cache_ttl_s)
        if redis_conn is not None
        else None
    )
    return HttpTaxService(
        settings.tax, cache=cache, quotes_from_cached_rates=quotes_from_cached_rates
    )


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
    settings: Settings,
    *,
    role: RoleName,
    autocommit: bool = True,
    connect_timeout_s: int | None = None,
) -> psycopg.Connection[TupleRow]:
    """A new connection logged in as ``role`` (autocommit unless told otherwise); the
    caller closes it (leaving its ``with`` block commits an open transaction). The
    operator commands use ``"operator"`` (read-only) or ``"admin"`` (the commands that
    write); docs/roles.md.

    Raises:
        psycopg.OperationalError: the database did not answer (within
            ``connect_timeout_s`` seconds when given).
    """
    dsn = settings.postgres.dsn(role, connect_timeout=connect_timeout_s)
    return psycopg.connect(dsn, autocommit=autocommit)


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
        database=lambda: connection(settings, role="operator", connect_timeout_s=5),
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
    (flushed by the import; a producer has nothing to close), batching for throughput
    (:data:`streams.importers.focus_import.IMPORT_PRODUCER_OVERRIDES`). Same errors."""
    return import_focus(
        path,
        settings,
        producer=producer(settings, **IMPORT_PRODUCER_OVERRIDES),
        progress=progress,
        flush_timeout_s=flush_timeout_s,
    )


def run_import_events(
    path: Path,
    settings: Settings,
    *,
    progress: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
) -> EventsImportSummary:
    """:func:`streams.importers.events_import.import_events` with a new :func:`producer`.
    Same errors."""
    return import_events(
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
            postgres_pool(settings, role="close", name="close-period", min_size=1, max_size=2)
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


def run_publish_price_book(path: Path, settings: Settings, *, published_by: str) -> PublishSummary:
    """:func:`streams.importers.price_book.publish_price_book` with a pool of 1 connection
    (``plans-publish``, closed after) and a new :func:`producer` (flushed by it). Same errors."""
    from streams.importers.price_book import publish_price_book

    with contextlib.closing(
        postgres_pool(settings, name="plans-publish", role="admin", min_size=1, max_size=1)
    ) as pool:
        return publish_price_book(
            path, settings, pool=pool, producer=producer(settings), published_by=published_by
        )


def naive_drill_redis(settings: Settings) -> redis.Redis:
    """The naive drill's Redis client: a plain one with a 10 s socket timeout, as the
    failed design's workers had (no retry policy of ours: it reproduces that design)."""
    return redis.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=10)


def drill_clients() -> DrillClients:
    """What ``invoicing drill`` runs through (:class:`streams.drill.run.DrillClients`)."""
    from streams.drill.run import DrillClients

    return DrillClients(redis=naive_drill_redis, producer=producer, close_period=run_close_period)


def demo_clients() -> DemoClients:
    """What ``invoicing demo`` runs through (:class:`streams.demo.run.DemoClients`)."""
    from streams.demo.run import DemoClients

    return DemoClients(
        import_focus=run_import_focus,
        close_period=run_close_period,
        database=lambda settings: connection(settings, role="operator"),
    )


def pricing_demo_clients() -> PricingDemoClients:
    """What ``invoicing demo --scenario pricing`` runs through
    (:class:`streams.demo.pricing.run.PricingDemoClients`; the price book is published by
    the ``invoicing plans publish`` command, run as a process)."""
    from streams.demo.pricing.run import PricingDemoClients

    return PricingDemoClients(
        import_events=run_import_events,
        close_period=run_close_period,
        database=lambda settings: connection(settings, role="operator"),
    )


# --------------------------------------------------------------------------- processes


@contextmanager
def _stop_on_signals(stop: threading.Event, *, what: str) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while the block runs (main thread only); the
    previous handlers are restored on exit."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping the %s", signum, what)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def invoicing_worker(
    settings: Settings,
    *,
    pool: ConnectionPool[Any],
    tax: TaxService,
    stop: threading.Event | None = None,
) -> InvoicingWorker:
    """An invoicing worker on ``pool`` and ``tax``, with its own consumer of group
    ``settings.worker.invoicing_group`` and producer (the worker closes the consumer
    and flushes the producer when :meth:`~streams.invoicing.worker.InvoicingWorker.run`
    ends)."""
    from streams.invoicing.worker import InvoicingWorker

    return InvoicingWorker(
        settings,
        pool=pool,
        tax=tax,
        consumer=consumer(settings, settings.worker.invoicing_group),
        producer=producer(settings),
        stop=stop,
    )


def run_invoicing_worker(
    settings: Settings, *, stop: threading.Event | None = None, install_signal_handlers: bool = True
) -> dict[str, int]:
    """Build a worker from settings, run it until stopped (``stop`` set, or SIGTERM/SIGINT
    when ``install_signal_handlers``), and return its counters by name (records stored,
    invoices written, fencing refusals, ...). Closes the pool, Redis and tax clients it built.

    Raises:
        KafkaException: a fatal consumer error (see :meth:`InvoicingWorker.run`).
        psycopg_pool.PoolTimeout: the database did not answer within 30 s at start.
    """
    stop = stop or threading.Event()
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    pool = postgres_pool(
        settings,
        role="worker",
        name="invoicing-worker",
        max_size=max(settings.postgres.pool_max_size, settings.worker.max_jobs + 2),
    )
    redis_conn = redis_client(settings)
    tax = tax_service(settings, redis_conn)
    try:
        worker = invoicing_worker(settings, pool=pool, tax=tax, stop=stop)
        worker.run()
        return dict(worker.stats)
    finally:
        tax.close()
        redis_conn.close()
        pool.close()


def email_sender(
    settings: Settings,
    *,
    pool: ConnectionPool[Any],
    consumer: Consumer,
    producer: Producer,
    stop: threading.Event | None = None,
) -> EmailSender:
    """An email sender on ``pool`` that commits ``consumer``'s offsets, sends through
    SMTP (``settings.smtp``) and dead-letters undecodable records with ``producer`` to
    ``billing.invoices.dlq.v1`` (prefixed).

    Raises:
        EmailConfigurationError: invalid ``settings.smtp.from_address``.
    """
    from streams.billing.dead_letters import DeadLetters
    from streams.email.sender import EmailSender, invoices_dlq_topic
    from streams.email.transport import SmtpTransport

    return EmailSender(
        settings,
        pool,
        consumer=consumer,
        transport=SmtpTransport(settings.smtp),
        stop=stop,
        dead_letters=DeadLetters(
            producer, invoices_dlq_topic(settings), settings.worker.email_group
        ),
    )


def run_email_sender(
    settings: Settings,
    *,
    stop: threading.Event | None = None,
    pool: ConnectionPool[Any] | None = None,
    consumer: Consumer | None = None,
) -> None:
    """Run the email sender until ``stop`` is set (or SIGTERM/SIGINT arrives).

    Builds what is not given from ``settings``: the pool, and a consumer of group
    ``settings.worker.email_group`` (manual commits); always a producer for its
    dead letters. Subscribes the consumer to the invoices topic and serves metrics
    (:func:`streams.email.sender.serve`).

    Shutdown: when ``stop`` is None, SIGTERM and SIGINT set an internal stop event
    (installed only when called from the main thread; the previous handlers are
    restored on return). The record in hand is finished and its offset committed
    (a record still failing transiently is left uncommitted, for redelivery); then
    the consumer and pool this function built are closed. A given consumer or pool
    is left open: its owner closes it.

    Raises:
        EmailConfigurationError: invalid ``settings.smtp.from_address``.
        KafkaException: a fatal consumer error.
        psycopg_pool.PoolTimeout: the database did not answer at start (30 s).
    """
    from streams.email.sender import serve

    stop_event = stop or threading.Event()
    with ExitStack() as owned:
        if stop is None:
            owned.enter_context(_stop_on_signals(stop_event, what="email sender"))
        owned.callback(log.info, "email sender stopped")
        the_pool = pool
        if the_pool is None:
            the_pool = postgres_pool(settings, role="email", name="email-sender")
            owned.callback(the_pool.close)
        the_consumer = consumer
        if the_consumer is None:
            the_consumer = make_consumer(settings.kafka, settings.worker.email_group)
            owned.callback(the_consumer.close)
        sender = email_sender(
            settings,
            pool=the_pool,
            consumer=the_consumer,
            producer=producer(settings),
            stop=stop_event,
        )
        serve(sender, the_consumer, settings)


@contextmanager
def replay_clients(
    settings: Settings,
    *,
    pool: ConnectionPool[Any] | None = None,
    redis_conn: redis.Redis | None = None,
    tax: TaxService | None = None,
) -> Iterator[ReplayClients]:
    """The clients of a replay run: the given ones, the others built from ``settings``
    (a 2-connection pool, Redis, the HTTP tax client with its Redis cache — whose
    quotes never come from cached rates: a replay prices with the rates the service
    applies now, or a rate change would not show as a difference) and closed when the
    block ends; consumers are made per group by the run (and closed by it)."""
    from streams.replay.run import ReplayClients

    with ExitStack() as owned:
        if pool is None:
            pool = postgres_pool(settings, role="replay", name="replay", min_size=1, max_size=2)
            owned.callback(pool.close)
        if redis_conn is None:
            redis_conn = redis_client(settings)
            owned.callback(redis_conn.close)
        if tax is None:
            http_tax = tax_service(settings, redis_conn, quotes_from_cached_rates=False)
            owned.callback(http_tax.close)
            tax = http_tax

        def new_consumer(group_id: str, **overrides: Any) -> Consumer:
            return consumer(settings, group_id, **overrides)

        yield ReplayClients(pool=pool, redis=redis_conn, tax=tax, new_consumer=new_consumer)


def replay_period(
    period: str,
    settings: Settings,
    *,
    pool: ConnectionPool[Any] | None = None,
    redis_conn: redis.Redis | None = None,
    tax: TaxService | None = None,
    **options: Any,
) -> ReplayReport:
    """:func:`streams.replay.run.replay_period` with :func:`replay_clients` (the given
    clients, the others built from ``settings`` and closed at the end). ``options``:
    ``mode`` (required), ``margin``, ``progress``, ``holder``, ``lease_ttl_s``,
    ``lease_key_prefix``, ``on_step``.

    Raises:
        InvalidPeriod: ``period`` is not ``YYYY-MM`` (before any client is built); and
        everything :func:`streams.replay.run.replay_period` raises.
    """
    from streams.domain.periods import BillingPeriod
    from streams.replay.run import replay_period as run_replay

    BillingPeriod.parse(period)
    with replay_clients(settings, pool=pool, redis_conn=redis_conn, tax=tax) as clients:
        return run_replay(period, settings, clients, **options)


# ================================================================================================
# The usage view and the HTTP ingest edge (issue 13): their faust app, price book source,
# producer, Redis idempotency store and API keys, built from settings. Only
# streams.entrypoints.usage (and tests) call these.
# ================================================================================================


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
    from streams.topics import PRICE_BOOK
    from streams.usage_view.price_book import (
        FilePriceBook,
        PriceBookTopicReader,
        PublishedPriceBook,
    )

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
