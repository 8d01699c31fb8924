"""The tax client's Redis cache against a real redis-server (started here from
/usr/bin/redis-server on a free port, in a temporary folder) and the real fake tax
server: a cached committed result avoids a second request, quotes come from cached
rates, and Redis going away mid-run slows things down without changing a result."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams.adapters.memory.tax import InMemoryTaxService
from streams.adapters.tax.cache import RedisTaxCache
from streams.adapters.tax.client import HttpTaxService
from streams.core.billing.ports import Rate, TaxRejected
from streams.core.domain.invoice import TaxLine
from streams.devtools.stack.fake_tax import (
    FakeTaxConfig,
    FakeTaxProcess,
    RequestRecord,
    running_fake_tax,
)
from streams.settings import TaxSettings

pytestmark = pytest.mark.integration

REDIS_SERVER = "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def client_for(port: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_connect_timeout=0.5,
        socket_timeout=0.5,
        retry=Retry(NoBackoff(), 0),
    )


class RedisServer:
    """A throw-away redis-server process (no persistence) on 127.0.0.1."""

    def __init__(self, workdir: Path) -> None:
        executable = shutil.which("redis-server") or REDIS_SERVER
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        self.log = workdir / "redis.log"
        argv = [
            executable,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(workdir),
            "--save", "",
            "--appendonly", "no",
            "--logfile", str(self.log),
        ]  # fmt: skip
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        probe = client_for(self.port)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    if probe.ping():
                        return
                except redis.ConnectionError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"redis-server did not start: {self.log}") from None
                    time.sleep(0.05)
        finally:
            probe.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tax_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeTaxProcess]:
    config = FakeTaxConfig(base_latency_s=0.0)
    with running_fake_tax(tmp_path_factory.mktemp("fake_tax"), config=config) as proc:
        yield proc


@pytest.fixture
def cache(redis_server: RedisServer) -> Iterator[RedisTaxCache]:
    client = client_for(redis_server.port)
    yield RedisTaxCache(client, ttl_s=600, prefix=f"test:{uuid.uuid4().hex}:")
    client.close()


def service(server: FakeTaxProcess, cache: RedisTaxCache) -> HttpTaxService:
    settings = TaxSettings(
        url=server.url, max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05
    )
    return HttpTaxService(settings, cache=cache)


def records(server: FakeTaxProcess, key: str) -> list[RequestRecord]:
    return server.admin.requests(key_prefix=f"{key}:")


def metric(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def new_key() -> str:
    return f"inv-{uuid.uuid4().hex}"


LINES = [
    TaxLine("a", Decimal("10.00"), "us-east-1", None),
    TaxLine("b", Decimal("-4.25"), "eu-west-3", None),
    TaxLine("c", Decimal("3"), "ap-southeast-2", "EXEMPT"),
]


def calc(tax: HttpTaxService, key: str, **kw: Any) -> Any:
    return tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=LINES, **kw)


def test_second_attempt_after_a_crash_is_answered_from_the_cache(
    tax_server: FakeTaxProcess, cache: RedisTaxCache
) -> None:
    key = new_key()
    with service(tax_server, cache) as first_process:
        first = calc(first_process, key)
    with service(tax_server, cache) as restarted:  # a new process after a crash
        second = calc(restarted, key)
    assert second == first
    assert [r.outcome for r in records(tax_server, key)] == ["ok"]


def test_other_content_under_a_cached_key_still_reaches_the_service(
    tax_server: FakeTaxProcess, cache: RedisTaxCache
) -> None:
    key = new_key()
    with service(tax_server, cache) as tax:
        calc(tax, key)
        with pytest.raises(TaxRejected) as caught:
            tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=LINES[:2])
    assert caught.value.status == 409
    assert [r.outcome for r in records(tax_server, key)] == ["ok", "conflict"]


def test_quote_with_every_rate_cached_makes_no_call(
    tax_server: FakeTaxProcess, cache: RedisTaxCache
) -> None:
    with service(tax_server, cache) as tax:
        calc(tax, new_key())  # learns the three (region, code) rates
        quote_key = new_key()
        quote = calc(tax, quote_key, commit=False)
        unseen_key = new_key()
        tax.calculate(
            idempotency_key=unseen_key,
            customer_id="c1",
            currency="USD",
            lines=[TaxLine("z", Decimal("1"), "sa-east-1", None)],
            commit=False,
        )
    assert records(tax_server, quote_key) == []
    assert [r.outcome for r in records(tax_server, unseen_key)] == ["ok"]
    expected = InMemoryTaxService().calculate(
        idempotency_key="q", customer_id="c1", currency="USD", lines=LINES, commit=False
    )
    assert quote == expected


def test_rate_lookups_are_cached(tax_server: FakeTaxProcess, cache: RedisTaxCache) -> None:
    before = len(tax_server.admin.requests(kind="rate"))
    with service(tax_server, cache) as tax:
        first = tax.rate("me-south-1")
        second = tax.rate("me-south-1")
    assert first == second == Rate("BH-STD", Decimal("0.10"))
    assert len(tax_server.admin.requests(kind="rate")) == before + 1


def test_unreadable_cache_entry_is_counted_and_ignored(
    tax_server: FakeTaxProcess, redis_server: RedisServer
) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    client = client_for(redis_server.port)
    cache = RedisTaxCache(client, ttl_s=600, prefix=prefix)
    key = new_key()
    with service(tax_server, cache) as tax:
        first = calc(tax, key)
        client.set(f"{prefix}doc:{key}", b"\xff not json")
        before = metric("invoicing_tax_cache_errors_total", {"operation": "decode_document"})
        second = calc(tax, key)
    client.close()
    assert second == first
    assert (
        metric("invoicing_tax_cache_errors_total", {"operation": "decode_document"}) == before + 1
    )
    assert [r.outcome for r in records(tax_server, key)] == ["ok", "replay"]


def test_redis_stopping_mid_run_slows_down_but_changes_nothing(
    tax_server: FakeTaxProcess, redis_server: RedisServer, cache: RedisTaxCache
) -> None:
    key = new_key()
    with service(tax_server, cache) as tax:
        first = calc(tax, key)
        quote_before = calc(tax, new_key(), commit=False)  # from cached rates
        redis_server.stop()
        before = metric("invoicing_tax_cache_errors_total", {"operation": "get_document"})
        second = calc(tax, key)
        quote_key = new_key()
        quote_after = calc(tax, quote_key, commit=False)
    assert second == first
    assert quote_after == quote_before
    assert metric("invoicing_tax_cache_errors_total", {"operation": "get_document"}) == before + 1
    # without the cache both went to the service: the commit as a replay, the quote as a call
    assert [r.outcome for r in records(tax_server, key)] == ["ok", "replay"]
    assert [r.outcome for r in records(tax_server, quote_key)] == ["ok"]
