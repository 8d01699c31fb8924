"""Finding 8 on the running stack (docs/security.md "Redis"): the local stack's Redis has a
memory limit and refuses writes at it rather than evict a key (a lease or the fencing
counter evicted would let two holders run). Before the fix: ``maxmemory`` 0 (no limit) and
the default policy."""

from __future__ import annotations

import redis


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def test_the_stacks_redis_never_evicts(redis_conn: redis.Redis) -> None:
    raw: dict[str | bytes, str | bytes] = redis_conn.config_get("maxmemory*")  # type: ignore[assignment]
    config = {_text(k): _text(v) for k, v in raw.items()}
    assert config.get("maxmemory-policy") == "noeviction", config
    assert int(config.get("maxmemory") or "0") > 0, config
