"""The Redis lease library against the real Redis and PostgreSQL (docs/design.md "The incident",
"Redis leases").

Every test uses its own lease name and Redis key prefix, so tests never collide
and can run again and again.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlparse

import psycopg
import pytest
import redis
from prometheus_client import REGISTRY
from psycopg.rows import TupleRow

from streams.adapters.lease import (
    Lease,
    LeaseBusy,
    LeaseFenced,
    LeaseLost,
    LeaseUnavailable,
)
from streams.core.billing.fencing import check_lease_fence as check_fence
from streams.core.billing.fencing import lease_fence_floor as fence_floor
from streams.settings import Settings

pytestmark = pytest.mark.integration


def metric(name: str, lease: str) -> float:
    return REGISTRY.get_sample_value(name, {"lease": lease}) or 0.0


def closed_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
def prefix(unique: str) -> str:
    return f"test-lease-{unique}:"


def fenced_write(conn: psycopg.Connection[TupleRow], lease: Lease) -> None:
    with conn.transaction():
        check_fence(conn, lease.name, lease.fencing_token, lease.holder)


def test_acquire_takes_an_increasing_fencing_number_and_stores_the_holder(
    redis_conn: redis.Redis, prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    first = Lease.acquire(redis_conn, name, ttl_s=5, holder="alpha", key_prefix=prefix)
    assert redis_conn.get(prefix + name).decode().endswith(":alpha")  # type: ignore[union-attr]
    first.release()
    assert redis_conn.get(prefix + name) is None
    second = Lease.acquire(redis_conn, name, ttl_s=5, holder="beta", key_prefix=prefix)
    try:
        assert second.fencing_token > first.fencing_token
    finally:
        second.release()


def test_busy_lease_names_its_holder(redis_conn: redis.Redis, prefix: str, unique: str) -> None:
    name = f"job-{unique}"
    with Lease.acquire(redis_conn, name, ttl_s=5, holder="host-a:123", key_prefix=prefix):
        with pytest.raises(LeaseBusy) as busy:
            Lease.acquire(redis_conn, name, ttl_s=5, holder="host-b:456", key_prefix=prefix)
        assert busy.value.holder == "host-a:123"
        assert busy.value.ttl_ms is not None and 0 < busy.value.ttl_ms <= 5000
        assert "host-a:123" in str(busy.value)


def test_a_holder_cannot_release_another_holders_lease(
    redis_conn: redis.Redis, prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    before = metric("invoicing_lease_release_not_owned_total", name)
    lost_before = metric("invoicing_lease_lost_while_running_total", name)
    a = Lease.acquire(redis_conn, name, ttl_s=0.3, holder="A", key_prefix=prefix, renew=False)
    time.sleep(0.5)  # A's lease expires (A is "paused": no renewal)
    b = Lease.acquire(redis_conn, name, ttl_s=10, holder="B", key_prefix=prefix)
    try:
        with pytest.raises(LeaseLost):
            a.release()
        # B's lease is untouched by A's compare-and-delete.
        stored = redis_conn.get(prefix + name)
        assert isinstance(stored, bytes) and stored.decode().endswith(":B")
        b.ensure_held()
        assert metric("invoicing_lease_release_not_owned_total", name) == before + 1
        assert metric("invoicing_lease_lost_while_running_total", name) == lost_before + 1
    finally:
        b.release()
    assert redis_conn.get(prefix + name) is None


def test_a_paused_holders_writes_are_refused_once_a_new_holder_has_the_lease(
    redis_conn: redis.Redis, pg: psycopg.Connection[TupleRow], prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    a = Lease.acquire(redis_conn, name, ttl_s=0.3, holder="A", key_prefix=prefix, renew=False)
    fenced_write(pg, a)  # A writes while it holds the lease
    time.sleep(0.5)  # A pauses past its TTL
    b = Lease.acquire(redis_conn, name, ttl_s=10, holder="B", key_prefix=prefix)
    try:
        assert b.fencing_token > a.fencing_token
        fenced_write(pg, b)  # B writes
        with pytest.raises(LeaseFenced) as fenced:
            fenced_write(pg, a)  # A wakes up and tries to write
        assert fenced.value.token == a.fencing_token
        assert fenced.value.current_token == b.fencing_token
        assert fenced.value.current_holder == "B"
        assert fence_floor(pg, name) == b.fencing_token
        with pytest.raises(LeaseLost):
            a.ensure_held()  # A also learns it locally: no renewal for a whole TTL
        fenced_write(pg, b)  # B keeps writing
    finally:
        b.release()


def test_refused_write_rolls_back_with_the_callers_transaction(
    redis_conn: redis.Redis, pg: psycopg.Connection[TupleRow], prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    pg.execute(f'CREATE TEMP TABLE "writes_{unique}" (holder text)')
    a = Lease.acquire(redis_conn, name, ttl_s=0.3, holder="A", key_prefix=prefix, renew=False)
    time.sleep(0.5)
    with Lease.acquire(redis_conn, name, ttl_s=10, holder="B", key_prefix=prefix) as b:
        fenced_write(pg, b)
        with pytest.raises(LeaseFenced), pg.transaction():
            check_fence(pg, a.name, a.fencing_token, a.holder)
            pg.execute(f"INSERT INTO \"writes_{unique}\" VALUES ('A')")
    row = pg.execute(f'SELECT count(*) FROM "writes_{unique}"').fetchone()
    assert row is not None and row[0] == 0


def test_floor_keeps_numbers_above_the_database_after_redis_lost_its_counter(
    redis_conn: redis.Redis, pg: psycopg.Connection[TupleRow], prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    for _ in range(3):
        with Lease.acquire(redis_conn, name, ttl_s=5, holder="old", key_prefix=prefix) as lease:
            fenced_write(pg, lease)
    recorded = fence_floor(pg, name)
    assert recorded == 3
    redis_conn.delete(f"{prefix}{name}:fencing")  # Redis lost its data

    # Without the floor, INCR starts again at 1 and the database refuses the holder.
    with Lease.acquire(redis_conn, name, ttl_s=5, holder="naive", key_prefix=prefix) as naive:
        assert naive.fencing_token == 1
        with pytest.raises(LeaseFenced):
            fenced_write(pg, naive)
    # With the floor, the new number is above every recorded one.
    with Lease.acquire(
        redis_conn, name, ttl_s=5, holder="new", key_prefix=prefix, floor=fence_floor(pg, name)
    ) as lease:
        assert lease.fencing_token > recorded
        fenced_write(pg, lease)


def test_renewal_failure_cancels_the_job(redis_conn: redis.Redis, prefix: str, unique: str) -> None:
    name = f"job-{unique}"
    ttl = 1.5
    lost_before = metric("invoicing_lease_lost_while_running_total", name)
    reasons: list[str] = []
    with (
        pytest.raises(LeaseLost),
        Lease.acquire(
            redis_conn,
            name,
            ttl_s=ttl,
            holder="job",
            key_prefix=prefix,
            on_lost=lambda _lease, reason: reasons.append(reason),
        ) as lease,
    ):
        lease.ensure_held()
        deleted_at = time.monotonic()
        renewals = lease.renewals
        redis_conn.delete(prefix + name)  # behind its back
        # A deadline that only fails a lease that never notices; the property is in
        # renewals: the first renewal after the delete found the key gone (none succeeded).
        assert lease.lost.wait(10 * ttl), "renewal did not notice the lost key"
        noticed_after = time.monotonic() - deleted_at
        assert lease.renewals == renewals, "a renewal succeeded after the key was deleted"
        print(f"lost noticed {noticed_after:.3f}s after the key was deleted (TTL {ttl}s)")
        assert len(reasons) == 1 and "gone" in reasons[0]
        assert metric("invoicing_lease_lost_while_running_total", name) == lost_before + 1
        lease.ensure_held()  # raises LeaseLost: the job stops here
        pytest.fail("ensure_held did not raise")  # pragma: no cover


def test_renewal_from_a_helper_thread_keeps_the_lease_over_several_ttls(
    redis_conn: redis.Redis, prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    ttl = 0.6
    with Lease.acquire(redis_conn, name, ttl_s=ttl, holder="long-job", key_prefix=prefix) as lease:
        token = redis_conn.get(prefix + name)
        deadline = time.monotonic() + 5 * ttl
        while time.monotonic() < deadline:
            time.sleep(ttl / 4)
            assert redis_conn.get(prefix + name) == token
            assert redis_conn.pttl(prefix + name) > 0
            lease.ensure_held()
        assert lease.renewals >= 10
        assert not lease.lost.is_set()
    assert redis_conn.get(prefix + name) is None


class _TcpProxy:
    """A TCP forwarder to Redis that the test can cut, to make Redis unreachable."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)

    def cut(self) -> None:
        # shutdown() wakes the thread blocked in accept(); close() alone would not,
        # and the port would keep accepting.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for sock in self.sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@pytest.fixture
def proxy(settings: Settings) -> Iterator[_TcpProxy]:
    url = urlparse(
        settings.redis.url.get_secret_value()
    )  # as the stack reads it (streams.devtools.stack.services)
    p = _TcpProxy((url.hostname or "127.0.0.1", url.port or 6379))
    yield p
    p.cut()


def test_redis_unreachable_past_the_ttl_cancels_the_job(
    proxy: _TcpProxy, redis_conn: redis.Redis, prefix: str, unique: str
) -> None:
    name = f"job-{unique}"
    ttl = 1.0
    client = redis.Redis(port=proxy.port, socket_timeout=0.3, socket_connect_timeout=0.3)
    lease = Lease.acquire(client, name, ttl_s=ttl, holder="job", key_prefix=prefix)
    time.sleep(ttl / 2)
    assert lease.renewals >= 1
    cut_at = time.monotonic()
    proxy.cut()
    renewals = lease.renewals
    assert lease.lost.wait(10 * ttl), "the lease was not declared lost"
    elapsed = time.monotonic() - cut_at
    print(f"lost declared {elapsed:.3f}s after Redis became unreachable (TTL {ttl}s)")
    # Declared by the TTL rule (one TTL after the last successful renewal: the reason says
    # so), with no renewal succeeding after the cut; the wall-time bound is generous (it
    # was 0.2 s over the TTL, which a loaded machine's scheduling alone can exceed).
    assert "TTL" in (lease.lost_reason or "")
    assert lease.renewals == renewals
    assert elapsed < 2 * ttl
    with pytest.raises(LeaseLost):
        lease.ensure_held()
    with pytest.raises(LeaseLost):
        lease.release()  # Redis unreachable: logged; the key expires by itself
    client.close()
    time.sleep(ttl)
    assert redis_conn.get(prefix + name) is None


def test_redis_down_at_acquire_is_unavailable(prefix: str, unique: str) -> None:
    client = redis.Redis(port=closed_port(), socket_timeout=0.5, socket_connect_timeout=0.5)
    with pytest.raises(LeaseUnavailable) as unavailable:
        Lease.acquire(client, f"job-{unique}", ttl_s=5, holder="h", key_prefix=prefix)
    assert "Redis unreachable" in str(unavailable.value)
    assert unavailable.value.transient
