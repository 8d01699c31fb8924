"""The tax cache's contract (tests/contracts/tax_cache.py) on
:class:`~streams.adapters.tax.cache.RedisTaxCache` against the stack's real Redis
(a key prefix of its own per test), and against a client pointed at a closed port
for "Redis down"."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams.adapters.tax.cache import RedisTaxCache
from streams.settings import Settings
from tests.contracts.tax_cache import TTL_S, CacheHarness, TaxCacheContract


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TestRedisTaxCache(TaxCacheContract):
    @pytest.fixture
    def harness(self, settings: Settings) -> Iterator[CacheHarness]:
        prefix = f"test:contract:{uuid.uuid4().hex}:"
        live = redis.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=5)
        dead = redis.Redis(
            host="127.0.0.1",
            port=free_port(),
            socket_connect_timeout=0.2,
            socket_timeout=0.2,
            retry=Retry(NoBackoff(), 0),
        )
        yield CacheHarness(
            cache=RedisTaxCache(live, ttl_s=TTL_S, prefix=prefix),
            advance=time.sleep,
            down=RedisTaxCache(dead, ttl_s=TTL_S, prefix=prefix),
        )
        leftovers = list(live.scan_iter(match=f"{prefix}*"))
        if leftovers:
            live.delete(*leftovers)
        live.close()
        dead.close()
