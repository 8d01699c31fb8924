"""The composition root: the one module that builds pools, clients and workers from settings.

Everything else receives what it needs as arguments (CONVENTIONS §6). Nothing is
built at import time; each factory builds on call, and the caller owns (and
closes) what it gets.
"""

from __future__ import annotations

from typing import Any

import redis
from confluent_kafka import Consumer, Producer
from psycopg_pool import ConnectionPool

from streams.adapters.kafka import make_consumer, make_producer
from streams.adapters.tax.cache import RedisTaxCache
from streams.adapters.tax.client import HttpTaxService
from streams.settings import Settings


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
