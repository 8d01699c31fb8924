"""Idempotency of the ingest edge by event id: what a resend gets.

Per event id the edge records the digest of its content (type + data,
:func:`streams.usage_view.state.digest`) and whether its record was delivered:

* a **new** id is claimed (``pending``), produced, and marked ``done`` once the
  broker confirmed delivery (a failed delivery releases the claim, so the
  client's retry produces it);
* the same id with the **same content** is a duplicate: ``done`` → answered
  ``duplicate`` without producing; still ``pending`` (a concurrent or crashed
  first attempt) → produced again, because only a delivery report proves the
  first landed, and the consumers deduplicate by id anyway;
* the same id with **other content** is refused (409): the invoicing workers
  would dead-letter it as a conflict and hold the customer's invoice.

Redis holds the claims (``SET NX EX``, TTL ``settings.ingest.idempotency_ttl_s``,
7 days by default). Redis down must slow the system, never make it wrong: a
failed claim is treated as new and produced (the workers' deduplication by event
id and their conflict check stay the guarantee), and counted. Past the TTL the
same holds: a very late resend reaches the topic and is deduplicated there.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum
from typing import Protocol

import redis

log = logging.getLogger(__name__)


class Claim(StrEnum):
    NEW = "new"
    PENDING = "pending"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"


class Idempotency(Protocol):
    """Claims of event ids (a batch at a time: one round trip per step)."""

    def claim(self, items: Sequence[tuple[str, str]]) -> list[Claim]:
        """Per ``(event id, digest)``, what the edge does with it (see the module)."""
        ...

    def done(self, items: Sequence[tuple[str, str]]) -> None:
        """The records of these ids were delivered."""
        ...

    def release(self, items: Sequence[tuple[str, str]]) -> None:
        """These claims' deliveries failed: forget them (a retry produces again)."""
        ...


class MemoryIdempotency:
    """The in-memory twin (tests, and an edge run without Redis)."""

    def __init__(self) -> None:
        self.claims: dict[str, tuple[str, bool]] = {}

    def claim(self, items: Sequence[tuple[str, str]]) -> list[Claim]:
        result = []
        for event_id, digest in items:
            held = self.claims.get(event_id)
            if held is None:
                self.claims[event_id] = (digest, False)
                result.append(Claim.NEW)
            elif held[0] != digest:
                result.append(Claim.CONFLICT)
            else:
                result.append(Claim.DUPLICATE if held[1] else Claim.PENDING)
        return result

    def done(self, items: Sequence[tuple[str, str]]) -> None:
        for event_id, digest in items:
            self.claims[event_id] = (digest, True)

    def release(self, items: Sequence[tuple[str, str]]) -> None:
        for event_id, digest in items:
            if self.claims.get(event_id, ("", False))[0] == digest:
                del self.claims[event_id]


# compare-and-delete: release only our own pending claim
_RELEASE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


class RedisIdempotency:
    """Claims in Redis: ``<prefix><event id>`` → ``<digest>:p`` (pending) or ``:d`` (done)."""

    def __init__(self, conn: redis.Redis, *, ttl_s: int, prefix: str = "ingest:") -> None:
        self.conn = conn
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.failures = 0

    def _key(self, event_id: str) -> str:
        return f"{self.prefix}{event_id}"

    def claim(self, items: Sequence[tuple[str, str]]) -> list[Claim]:
        try:
            pipe = self.conn.pipeline(transaction=False)
            for event_id, digest in items:
                pipe.set(self._key(event_id), f"{digest}:p", nx=True, ex=self.ttl_s)
            claimed = pipe.execute()
            taken = [i for i, ok in enumerate(claimed) if not ok]
            held: list[bytes | None] = []
            if taken:
                pipe = self.conn.pipeline(transaction=False)
                for i in taken:
                    pipe.get(self._key(items[i][0]))
                held = pipe.execute()
        except redis.RedisError as exc:
            self.failures += 1
            log.warning("ingest idempotency: Redis unavailable, producing without a claim: %s", exc)
            return [Claim.NEW] * len(items)
        result = [Claim.NEW] * len(items)
        for i, value in zip(taken, held, strict=True):
            text = (value or b"").decode()
            digest, _, status = text.rpartition(":")
            if not text:  # expired between the two round trips: produce
                result[i] = Claim.PENDING
            elif digest != items[i][1]:
                result[i] = Claim.CONFLICT
            else:
                result[i] = Claim.DUPLICATE if status == "d" else Claim.PENDING
        return result

    def done(self, items: Sequence[tuple[str, str]]) -> None:
        try:
            pipe = self.conn.pipeline(transaction=False)
            for event_id, digest in items:
                pipe.set(self._key(event_id), f"{digest}:d", ex=self.ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            self.failures += 1
            log.warning("ingest idempotency: could not mark %d id(s) done: %s", len(items), exc)

    def release(self, items: Sequence[tuple[str, str]]) -> None:
        try:
            script = self.conn.register_script(_RELEASE)
            for event_id, digest in items:
                script(keys=[self._key(event_id)], args=[f"{digest}:p"])
        except redis.RedisError as exc:
            self.failures += 1
            log.warning("ingest idempotency: could not release %d claim(s): %s", len(items), exc)
