"""Clients built from settings: PostgreSQL pools and connections (one login per
process, docs/roles.md), Redis, the tax service, Kafka producers, consumers and
readers, the Kafka Connect REST client, and the status view's sources.

Part of the composition root (:mod:`streams.bootstrap`): only entry points import it.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
import redis
from confluent_kafka import Consumer, Producer
from psycopg.rows import TupleRow
from psycopg_pool import ConnectionPool

from streams.adapters.connect import connector_status
from streams.adapters.kafka import make_consumer, make_producer, make_reader
from streams.settings import RoleName, Settings
from streams.settings.credentials import refuse_default_credentials

if TYPE_CHECKING:
    # Imported when called, not at import: a command that needs no tax service and no
    # status view (close-period, import) starts without them (docs/benchmarks.md "The
    # end of a command").
    from streams.adapters.tax.client import HttpTaxService
    from streams.apps.ops.status import StatusSources


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
        DefaultCredentialsRefused: ``role`` keeps its shipped password while a service
            address is not loopback (:mod:`streams.settings.credentials`).
    """
    refuse_default_credentials(settings, (role,))
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
    """A Redis client with the configured timeouts, TLS (``rediss://``, the CA) and ACL
    login (:meth:`~streams.settings.RedisSettings.client_kwargs`); no connection is made
    until used.

    redis-py 8 retries 3 times with backoff by default; we retry once, at once, so
    that a dead Redis costs one timeout per call (Redis down must slow the system
    down, not stall it: callers treat a failure as a cache miss or a refused lease).

    Raises:
        DefaultCredentialsRefused: the URL has no password while a service address is
            not loopback (:mod:`streams.settings.credentials`).
    """
    refuse_default_credentials(settings, redis=True)
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        settings.redis.url.get_secret_value(),
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1),
        **settings.redis.client_kwargs(),
    )


def tax_service(
    settings: Settings,
    redis_conn: redis.Redis | None = None,
    *,
    quotes_from_cached_rates: bool = True,
    quotes_from_learned_rates: bool = False,
) -> HttpTaxService:
    """The HTTP tax client, with the Redis result/rate cache when ``redis_conn`` is given
    (``quotes_from_cached_rates``, ``quotes_from_learned_rates``: see
    :class:`~streams.adapters.tax.client.HttpTaxService`)."""
    from streams.adapters.tax.cache import RedisTaxCache
    from streams.adapters.tax.client import HttpTaxService

    cache = (
        RedisTaxCache(redis_conn, ttl_s=settings.tax.cache_ttl_s)
        if redis_conn is not None
        else None
    )
    return HttpTaxService(
        settings.tax,
        cache=cache,
        quotes_from_cached_rates=quotes_from_cached_rates,
        quotes_from_learned_rates=quotes_from_learned_rates,
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
# The logic in streams.apps.importers, streams.apps.ops, streams.devtools.drill and streams.devtools.demo receives what it
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
        DefaultCredentialsRefused: ``role`` keeps its shipped password while a service
            address is not loopback (:mod:`streams.settings.credentials`).
    """
    refuse_default_credentials(settings, (role,))
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
    """What ``invoicing status`` reads through (:class:`streams.apps.ops.status.StatusSources`)."""
    from streams.apps.ops.status import StatusSources

    return StatusSources(
        database=lambda: connection(settings, role="operator", connect_timeout_s=5),
        consumer=lambda group_id: reader(settings, group_id),
        connector=lambda: outbox_connector_status(settings),
    )


def require_profile(settings: Settings) -> None:
    """Under ``profile = "production"``, refuse to go on unless every registry topic has
    the replication the settings require (a no-op under "local"). Called first by every
    long-running process.

    Raises:
        streams.adapters.kafka_replication.TopicsBelowRequirement: a topic falls short.
        streams.adapters.kafka.KafkaAdapterError: the broker did not answer.
    """
    if settings.profile != "production":
        return
    from streams.adapters.kafka_replication import require_replication

    require_replication(settings.kafka)
