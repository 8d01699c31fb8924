"""Idempotency of the ingest edge by event id: what a resend gets.

Per event id the edge records the digest of its source and content (type + data,
:func:`streams.apps.ingest.edge.claim_digest`) and whether its record was delivered:

* a **new** id is claimed (``pending``), produced, and marked ``done`` once the
  broker confirmed delivery (a failed delivery releases the claim, so the
  client's retry produces it);
* the same id with the **same content** is a duplicate: ``done`` → answered
  ``duplicate`` without producing; still ``pending`` (a concurrent or crashed
  first attempt) → produced again, because only a delivery report proves the
  first landed, and the consumers deduplicate by id anyway;
* the same id with **other content**, or from **another source**, is refused (409): the
  invoicing workers, which deduplicate by id alone, would dead-letter it as a conflict
  (or drop it as a duplicate) and hold the customer's invoice. CloudEvents identifies an
  event by ``source`` + ``id``: the claim holds both, so a resend is recognised by both.

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
from typing import Any, Protocol

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


# One script call per request and step (a batch of 500 ids is one round trip and one
# command, not 500: the edge's cost per event stays small). KEYS: the ids' keys;
# ARGV: their digests, then the TTL. A single Redis (no cluster: keys of a batch span slots).
_CLAIM = """
local ttl = ARGV[#ARGV]
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[i] .. ':p', 'NX', 'EX', ttl) then
    out[i] = ''
  else
    out[i] = redis.call('GET', key) or ''
  end
end
return out
"""
_DONE = """
local ttl = ARGV[#ARGV]
for i, key in ipairs(KEYS) do redis.call('SET', key, ARGV[i] .. ':d', 'EX', ttl) end
return #KEYS
"""
# compare-and-delete: release only our own pending claims
_RELEASE = """
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] .. ':p' then n = n + redis.call('DEL', key) end
end
return n
"""


class RedisIdempotency:
    """Claims in Redis: ``<prefix><event id>`` → ``<digest>:p`` (pending) or ``:d`` (done)."""

    def __init__(self, conn: redis.Redis, *, ttl_s: int, prefix: str = "ingest:") -> None:
        self.conn = conn
        self.ttl_s = ttl_s
        self.prefix = prefix
        self.failures = 0
        self._scripts: dict[str, Any] = {}

    def _key(self, event_id: str) -> str:
        return f"{self.prefix}{event_id}"

    def _script(self, name: str, body: str) -> Any:
        script = self._scripts.get(name)
        if script is None:
            script = self._scripts[name] = self.conn.register_script(body)
        return script

    def claim(self, items: Sequence[tuple[str, str]]) -> list[Claim]:
        if not items:
            return []
        try:
            held = self._script("claim", _CLAIM)(
                keys=[self._key(event_id) for event_id, _ in items],
                args=[digest for _, digest in items] + [self.ttl_s],
            )
        except redis.RedisError as exc:
            self.failures += 1
            log.warning("ingest idempotency: Redis unavailable, producing without a claim: %s", exc)
            return [Claim.NEW] * len(items)
        result = []
        for (_, wanted), value in zip(items, held, strict=True):
            text = value.decode() if isinstance(value, bytes) else str(value or "")
            if not text:
                result.append(Claim.NEW)
                continue
            digest, _, status = text.rpartition(":")
            if digest != wanted:
                result.append(Claim.CONFLICT)
            else:
                result.append(Claim.DUPLICATE if status == "d" else Claim.PENDING)
        return result

    def done(self, items: Sequence[tuple[str, str]]) -> None:
        self._run("done", _DONE, items, with_ttl=True)

    def release(self, items: Sequence[tuple[str, str]]) -> None:
        self._run("release", _RELEASE, items, with_ttl=False)

    def _run(
        self, name: str, body: str, items: Sequence[tuple[str, str]], *, with_ttl: bool
    ) -> None:
        if not items:
            return
        try:
            self._script(name, body)(
                keys=[self._key(event_id) for event_id, _ in items],
                args=[digest for _, digest in items] + ([self.ttl_s] if with_ttl else []),
            )
        except redis.RedisError as exc:
            self.failures += 1
            log.warning("ingest idempotency: %s of %d id(s) failed: %s", name, len(items), exc)
