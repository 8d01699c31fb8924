"""Redis leases for singleton jobs, with fencing numbers the database checks.

docs/design.md "The incident" and "Redis leases": a lock with an expiry is a **lease**. It can end
while its holder still works (a GC pause, a slow call, CPU starvation), and the holder cannot tell
from inside. So exclusivity here is an optimisation; the safety guarantee is the **fencing token**
the database checks on every write of the job (Martin Kleppmann, "How to do distributed locking",
2016, https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html: "every time the
lock server grants a lock … it also returns a fencing token, which is a number that increases every
time a client acquires the lock … the storage server remembers that it has already processed a write
with a higher token number, and so it rejects" the stale one).

Use::

    from streams.core.billing.fencing import LeaseFence, lease_fence_floor

    floor = lease_fence_floor(conn, "close-period:2024-09")    # see "Redis lost its data"
    with Lease.acquire(redis_conn, "close-period:2024-09", ttl_s=30, holder="host:pid",
                       floor=floor) as lease:
        for item in work:
            lease.ensure_held()                                 # raises LeaseLost
            with conn.transaction():
                LeaseFence.of(lease).check(conn)                 # the database's fence
                ...                                              # the job's writes

Redis keys (``key_prefix`` defaults to ``"lease:"``)::

    <key_prefix><name>            the lease: "<uuid4 hex>:<holder>", PX = TTL
    <key_prefix><name>:fencing    the fencing counter (INCR), never expires

Mechanics, on redis-py's :class:`redis.lock.Lock` (https://redis.readthedocs.io/
en/stable/lock.html; it ships the compare-and-delete release and
compare-and-extend renewal Lua scripts, so this module writes no Lua):

* **Acquire**: ``MULTI; SET key token NX PX ttl; INCR key:fencing; EXEC``, one
  atomic transaction, so fencing numbers follow the order in which holders got
  the lease: a holder's number is greater than that of every earlier holder and
  smaller than that of every later one. (An INCR of an attempt that found the
  key taken is wasted; gaps are harmless, only the order matters.) The lock is
  built with ``thread_local=False`` because the renewal thread must see the
  token the acquiring thread stored.
* **Token**: ``"<uuid4 hex>:<holder>"``, unique per acquisition, and it names
  the holder, so :class:`LeaseBusy` can say who holds the lease.
* **Renewal**: a daemon thread resets the TTL (``Lock.reacquire``, compare-and-
  ``PEXPIRE``) every ``ttl_s / 3``. It stops and declares the lease lost when
  the key is gone or holds another token (``LockNotOwnedError``), or when Redis
  has been unreachable for a whole TTL since the last successful renewal
  (measured from the moment that renewal was *sent*, the conservative end; a
  watchdog thread enforces this deadline even while a renewal call is still
  blocked in the client's timeouts and retries). Errors in between are logged
  and retried.
* **Lost**: :attr:`Lease.lost` (a ``threading.Event``) is set, the optional
  ``on_lost(lease, reason)`` callback runs (on the renewal thread), an ERROR is
  logged and ``invoicing_lease_lost_while_running_total{lease}`` is incremented,
  once per lease. :meth:`Lease.ensure_held` raises :class:`LeaseLost` from then
  on; it also declares the lease lost by itself when no renewal succeeded for a
  whole TTL (a paused process wakes up and learns it before its next write).
* **Release**: compare-and-delete (``Lock.release``). A lease that is no longer
  ours is an incident: ERROR log, ``invoicing_lease_release_not_owned_total
  {lease}``, and :class:`LeaseLost` is raised. So is a lease found lost while
  held, however the delete went. A Redis error on release of a lease still
  held is logged as a WARNING and not raised: the key expires by itself within
  the TTL.
  Leaving the ``with`` block releases; when the block raised, a release failure
  is still reported (log, counters) but the block's own exception propagates.

Redis lost its data: ``INCR`` would start again at 1 and a new holder would get
a number below the one the database already recorded, and be refused forever.
So :meth:`Lease.acquire` takes ``floor``: before acquiring it raises the
counter to at least ``floor`` (an optimistic ``WATCH``/``MULTI`` transaction,
only upward). Pass :func:`streams.core.billing.fencing.lease_fence_floor`, the
highest number the database recorded for the lease; the new number is then
above it.

Database side (:mod:`streams.core.billing.fencing`, with the other two fences):
``check_lease_fence`` upserts ``lease_fences`` only upward inside the caller's
transaction and raises :class:`LeaseFenced` when a higher number is recorded.
The upsert locks the lease's row until the transaction ends, so a newer
holder's first write waits for an older holder's open transaction and then
refuses that holder everything after. This module never touches the database;
its error tree includes the fence's two errors so that a caller catches every
lease failure as a :class:`LeaseError`.

Exceptions::

    LeaseError                root
    ├── LeaseUnavailable      transient: Redis unreachable at acquire (retry later)
    ├── LeaseBusy             held by another holder (.holder, .ttl_ms); try later
    ├── LeaseLost             the lease ended while held (renewal failed, expired,
    │                         released by someone else); stop the job
    ├── LeaseFenced           the database recorded a higher fencing number: a newer
    │                         holder exists; this holder's writes are refused
    └── LeaseStoreError       a database error while checking the fence (.sqlstate)

Metrics (prometheus_client, default registry):
``invoicing_lease_lost_while_running_total{lease}``,
``invoicing_lease_release_not_owned_total{lease}``,
``invoicing_lease_acquired_total{lease}``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Self

import redis
from prometheus_client import Counter
from redis.exceptions import LockError, LockNotOwnedError, RedisError, WatchError
from redis.lock import Lock

from streams.core.billing.lease_errors import (
    LeaseBusy,
    LeaseError,
    LeaseFenced,
    LeaseLost,
    LeaseStoreError,
    LeaseUnavailable,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_KEY_PREFIX",
    "LEASE_ACQUIRED",
    "LEASE_LOST_WHILE_RUNNING",
    "LEASE_RELEASE_NOT_OWNED",
    "Lease",
    "LeaseBusy",
    "LeaseError",
    "LeaseFenced",
    "LeaseLost",
    "LeaseStoreError",
    "LeaseUnavailable",
]

#: Prefix of the Redis keys of leases (tests pass their own).
DEFAULT_KEY_PREFIX = "lease:"

LEASE_LOST_WHILE_RUNNING = Counter(
    "invoicing_lease_lost_while_running_total",
    "Leases that ended (renewal failed, expired, taken over) while their holder still ran.",
    ["lease"],
)
LEASE_RELEASE_NOT_OWNED = Counter(
    "invoicing_lease_release_not_owned_total",
    "Releases that found the lease no longer ours (expired or held by another token).",
    ["lease"],
)
LEASE_ACQUIRED = Counter(
    "invoicing_lease_acquired_total",
    "Leases acquired.",
    ["lease"],
)


# --------------------------------------------------------------------------- Redis side


class _FencedLock(Lock):
    """redis-py's Lock whose acquire also takes a fencing number, atomically.

    Only :meth:`do_acquire` is replaced (the documented extension point: it is
    what ``Lock.acquire`` calls with the token); release, extend and reacquire
    are redis-py's compare-and-act Lua scripts.
    """

    def __init__(self, redis_conn: redis.Redis, name: str, *, ttl_s: float) -> None:
        super().__init__(redis_conn, name, timeout=ttl_s, blocking=False, thread_local=False)
        self.fencing_key = f"{name}:fencing"
        self.fencing_token: int | None = None

    def do_acquire(self, token: str) -> bool:
        ttl_ms = max(1, int(float(self.timeout or 0) * 1000))
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.name, token, nx=True, px=ttl_ms)
            pipe.incr(self.fencing_key)
            won, number = pipe.execute()
        if won:
            self.fencing_token = int(number)
            return True
        return False


def _raise_counter(redis_conn: redis.Redis, key: str, floor: int) -> None:
    """Set the fencing counter ``key`` to ``floor`` if it is lower (only upward, atomic)."""

    def transaction(pipe: redis.client.Pipeline) -> None:
        raw = pipe.get(key)
        current = int(raw) if raw is not None else 0
        if current < floor:
            pipe.multi()
            pipe.set(key, floor)

    for _ in range(100):
        try:
            redis_conn.transaction(transaction, key)
            return
        except WatchError:  # pragma: no cover - another acquire moved the counter meanwhile
            continue
    raise WatchError(f"fencing counter {key} kept changing; could not raise it to {floor}")


def _holder_of(raw: object) -> str | None:
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    _, sep, holder = text.partition(":")
    return holder if sep else None


class Lease:
    """A held lease: its fencing number, a renewal thread, and the ``lost`` signal.

    Obtain one with :meth:`acquire` (it is held on return); use it as a context
    manager, or call :meth:`release`.

    Attributes:
        name: lease name (also the ``lease_fences.lease_name`` row), e.g. ``close-period:2024-09``.
        key: the Redis key, ``key_prefix + name``.
        holder: who holds it (free text, e.g. ``host:pid:job``).
        ttl_s: time to live in seconds; renewed every ``ttl_s / 3``.
        fencing_token: the number from ``INCR <key>:fencing`` taken with the lease.
        lost: set once the lease is known to have ended while held.
    """

    def __init__(
        self,
        lock: _FencedLock,
        *,
        name: str,
        holder: str,
        ttl_s: float,
        fencing_token: int,
        acquired_at: float,
        on_lost: Callable[[Lease, str], None] | None,
    ) -> None:
        self._lock = lock
        self.name = name
        self.key = lock.name
        self.holder = holder
        self.ttl_s = ttl_s
        self.fencing_token = fencing_token
        self.lost = threading.Event()
        self._on_lost = on_lost
        self._lost_reason: str | None = None
        self._state_lock = threading.Lock()
        self._released = False
        self._last_renewed = acquired_at
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self.renewals = 0

    # ------------------------------------------------------------------ acquire

    @classmethod
    def acquire(
        cls,
        redis_conn: redis.Redis,
        name: str,
        *,
        ttl_s: float,
        holder: str,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        floor: int = 0,
        renew: bool = True,
        on_lost: Callable[[Lease, str], None] | None = None,
        wait_s: float = 0.0,
    ) -> Lease:
        """Acquire the lease ``name`` for ``ttl_s`` seconds, or fail at once.

        Args:
            redis_conn: the Redis client (its socket timeouts bound every call).
            name: lease name, e.g. ``close-period:2024-09``.
            ttl_s: time to live in seconds (> 0; millisecond resolution). Default
                of callers: 30 s.
            holder: who holds it, stored in the token and in ``lease_fences``.
            key_prefix: prefix of the Redis key (default ``"lease:"``).
            floor: the fencing number is made greater than this (pass
                :func:`streams.core.billing.fencing.lease_fence_floor`; protects against a Redis that lost its data).
            renew: start the renewal thread (default). ``False`` is for tests
                that simulate a paused holder.
            on_lost: called once, with the lease and a reason, when the lease is
                found lost (on the renewal thread, or the thread calling
                :meth:`ensure_held`/:meth:`release`); keep it short.
            wait_s: how long to keep retrying while the lease is held by
                another holder (default 0: fail at once).

        Raises:
            ValueError: ``ttl_s`` not positive, empty ``name`` or ``holder``.
            LeaseBusy: another holder has it; the message names that holder.
            LeaseUnavailable: Redis unreachable or failing.
        """
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s!r}")
        if not name or not holder:
            raise ValueError("a lease needs a name and a holder")
        key = key_prefix + name
        lock = _FencedLock(redis_conn, key, ttl_s=ttl_s)
        token = f"{uuid.uuid4().hex}:{holder}"
        started = time.monotonic()
        raw: object = None
        ttl_ms: object = None
        try:
            if floor > 0:
                _raise_counter(redis_conn, lock.fencing_key, floor)
            got = lock.acquire(
                token=token,
                blocking=wait_s > 0,
                blocking_timeout=wait_s if wait_s > 0 else None,
                sleep=min(0.1, ttl_s / 10),
            )
            if not got:
                raw = redis_conn.get(key)
                ttl_ms = redis_conn.pttl(key)
        except RedisError as exc:
            raise LeaseUnavailable(
                f"cannot acquire lease {name!r}: Redis unreachable or failing "
                f"({type(exc).__name__}: {exc}); nothing was done",
                lease=name,
            ) from exc
        if not got:
            current = _holder_of(raw)
            remaining = int(ttl_ms) if isinstance(ttl_ms, int) and ttl_ms >= 0 else None
            who = f"held by {current!r}" if current else "held by another holder"
            left = f", expires in {remaining} ms unless renewed" if remaining is not None else ""
            raise LeaseBusy(
                f"lease {name!r} is {who}{left}", lease=name, holder=current, ttl_ms=remaining
            )
        assert lock.fencing_token is not None  # set by do_acquire on success
        lease = cls(
            lock,
            name=name,
            holder=holder,
            ttl_s=ttl_s,
            fencing_token=lock.fencing_token,
            acquired_at=started,
            on_lost=on_lost,
        )
        LEASE_ACQUIRED.labels(lease=name).inc()
        logger.info(
            "lease %s acquired by %s (fencing token %d, ttl %.3fs)",
            name,
            holder,
            lease.fencing_token,
            ttl_s,
        )
        if renew:
            lease.start_renewal()
        return lease

    # ------------------------------------------------------------------ renewal

    def start_renewal(self) -> None:
        """Start the renewal thread (idempotent; :meth:`acquire` does it unless ``renew=False``)."""
        if self._thread is not None or self._released or self.lost.is_set():
            return
        self._thread = threading.Thread(
            target=self._renew_loop, name=f"lease-renewal:{self.name}", daemon=True
        )
        self._watchdog = threading.Thread(
            target=self._watch_loop, name=f"lease-watchdog:{self.name}", daemon=True
        )
        self._thread.start()
        self._watchdog.start()

    def stop_renewal(self, timeout_s: float | None = None) -> None:
        """Stop renewing without releasing (a test's "paused holder"; also release's first step).

        Waits up to ``timeout_s`` for a renewal call in flight to finish.
        """
        self._stop.set()
        for thread in (self._thread, self._watchdog):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout_s)

    def _watch_loop(self) -> None:
        # A renewal call can block longer than the TTL (socket timeouts, the client's
        # own retries with backoff); this deadline keeps `lost` on time regardless.
        while True:
            remaining = self._last_renewed + self.ttl_s - time.monotonic()
            if remaining <= 0:
                self._mark_lost(
                    f"no successful renewal for the whole TTL of {self.ttl_s}s "
                    "(Redis unreachable or too slow)"
                )
                return
            if self._stop.wait(remaining):
                return

    def _renew_loop(self) -> None:
        interval = self.ttl_s / 3
        wait = interval
        while not self._stop.wait(wait):
            sent = time.monotonic()
            try:
                self._lock.reacquire()
            except LockNotOwnedError:
                self._mark_lost("renewal found the key gone or holding another token")
                return
            except LockError:
                return  # released meanwhile: the token is gone
            except RedisError as exc:
                silent = time.monotonic() - self._last_renewed
                if silent >= self.ttl_s:
                    self._mark_lost(
                        f"Redis unreachable for {silent:.2f}s, at least the TTL of "
                        f"{self.ttl_s}s since the last renewal ({type(exc).__name__}: {exc})"
                    )
                    return
                logger.warning(
                    "lease %s: renewal failed (%s: %s), %.2fs left before it counts as lost",
                    self.name,
                    type(exc).__name__,
                    exc,
                    self.ttl_s - silent,
                )
                wait = max(0.01, min(interval / 3, self.ttl_s - silent))
                continue
            self._last_renewed = sent
            self.renewals += 1
            wait = interval

    # ------------------------------------------------------------------ lost

    def _mark_lost(self, reason: str) -> bool:
        """Record that the lease ended while held; once. Returns whether this call did it.

        Order: the metric, the log line and the ``on_lost`` callback run first and
        :attr:`lost` is set last, so whoever wakes on :attr:`lost` sees all of them.
        """
        with self._state_lock:
            if self.lost.is_set() or self._lost_reason is not None:
                return False
            self._lost_reason = reason
        self._stop.set()
        LEASE_LOST_WHILE_RUNNING.labels(lease=self.name).inc()
        logger.error(
            "lease %s (fencing token %d) LOST while holder %s still runs: %s",
            self.name,
            self.fencing_token,
            self.holder,
            reason,
        )
        if self._on_lost is not None:
            try:
                self._on_lost(self, reason)
            except Exception:  # a broken callback must not hide the loss
                logger.exception("lease %s: on_lost callback failed", self.name)
        self.lost.set()
        return True

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, once :attr:`lost` is set."""
        return self._lost_reason

    def ensure_held(self) -> None:
        """Raise unless the lease is still believed held; call between units of work.

        "Believed": no renewal failure was seen and a renewal succeeded less
        than a TTL ago. It cannot prove the lease is held (only the fence can);
        it makes a holder stop early instead of at its next fenced write.

        Raises:
            LeaseLost: the lease was lost, released, or not renewed for a whole TTL.
        """
        if self._released:
            raise LeaseLost(f"lease {self.name!r} was released", lease=self.name, reason="released")
        silent = time.monotonic() - self._last_renewed
        if not self.lost.is_set() and silent >= self.ttl_s:
            self._mark_lost(f"no successful renewal for {silent:.2f}s (TTL {self.ttl_s}s)")
        if self.lost.is_set() or self._lost_reason is not None:
            reason = self._lost_reason or "lost"
            raise LeaseLost(
                f"lease {self.name!r} (fencing token {self.fencing_token}) was lost: {reason}",
                lease=self.name,
                reason=reason,
            )

    @property
    def held(self) -> bool:
        """Whether :meth:`ensure_held` would pass now."""
        try:
            self.ensure_held()
        except LeaseLost:
            return False
        return True

    # ------------------------------------------------------------------ release

    def release(self) -> None:
        """Stop renewing, then compare-and-delete the key. A no-op when already released.

        Raises:
            LeaseLost: the key was gone or held by another token (reported as an
                incident first: ERROR log, ``invoicing_lease_release_not_owned_total``),
                or the lease had been found lost while held (see :attr:`lost`), even
                when the delete itself went through or Redis was unreachable.
        """
        if self._released:
            return
        self.stop_renewal(timeout_s=max(5.0, self.ttl_s))
        self._released = True
        try:
            self._lock.release()
        except LockNotOwnedError as exc:
            reason = "release found the lease no longer ours (expired or taken over)"
            self._mark_lost(reason)
            LEASE_RELEASE_NOT_OWNED.labels(lease=self.name).inc()
            logger.error(
                "lease %s (fencing token %d) of %s was not owned at release: %s",
                self.name,
                self.fencing_token,
                self.holder,
                self._lost_reason,
            )
            raise LeaseLost(
                f"lease {self.name!r} (fencing token {self.fencing_token}) was no longer "
                f"held at release: {self._lost_reason}",
                lease=self.name,
                reason=self._lost_reason or reason,
            ) from exc
        except LockError as exc:  # pragma: no cover - no token: cannot happen after acquire
            raise LeaseLost(
                f"lease {self.name!r}: {exc}", lease=self.name, reason=str(exc)
            ) from exc
        except RedisError as exc:
            logger.warning(
                "lease %s: release failed (%s: %s); the key expires within %.3fs by itself",
                self.name,
                type(exc).__name__,
                exc,
                self.ttl_s,
            )
        else:
            logger.info("lease %s released by %s", self.name, self.holder)
        if self.lost.is_set():
            raise LeaseLost(
                f"lease {self.name!r} (fencing token {self.fencing_token}) was lost while "
                f"held: {self._lost_reason}",
                lease=self.name,
                reason=self._lost_reason or "lost",
            )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.release()
            return
        # A LeaseLost here was reported by release(); the block's own exception is the one to see.
        with contextlib.suppress(LeaseLost):
            self.release()

    def __repr__(self) -> str:
        return (
            f"Lease(name={self.name!r}, holder={self.holder!r}, "
            f"fencing_token={self.fencing_token}, ttl_s={self.ttl_s})"
        )
