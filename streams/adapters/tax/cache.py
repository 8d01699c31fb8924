"""The tax client's cache in Redis: :class:`RedisTaxCache`, the :class:`~streams.core.billing.ports.TaxCache`.

Committed tax results by idempotency key (a second attempt after a crash answers
from Redis without calling the service) and rates by (region, product tax code)
(a quote whose every line's rate is cached needs no call), so thousands of lines
do not mean thousands of calls (docs/design.md "Redis leases"). Redis being down slows the
system down, never makes it wrong: every Redis error is logged and counted, and
the method then behaves as a miss.

Metrics (prometheus_client, default registry):
``invoicing_tax_cache_lookups_total{kind,result}``,
``invoicing_tax_cache_errors_total{operation}``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import redis
from prometheus_client import Counter

from streams.adapters.tax.wire import decimal_text
from streams.core.billing.ports import Rate, RateKey
from streams.core.domain.invoice import TaxedLine
from streams.core.domain.money import InvalidAmount

logger = logging.getLogger(__name__)

__all__ = ["TAX_CACHE_ERRORS", "TAX_CACHE_LOOKUPS", "RedisTaxCache"]

TAX_CACHE_LOOKUPS = Counter(
    "invoicing_tax_cache_lookups_total",
    "Tax cache lookups by kind (document, rate) and result (hit, miss).",
    ["kind", "result"],
)
TAX_CACHE_ERRORS = Counter(
    "invoicing_tax_cache_errors_total",
    "Tax cache operations that failed (Redis down, timeout, unreadable entry); "
    "the call went to the tax service instead.",
    ["operation"],
)


class RedisTaxCache:
    """Committed tax results and rates in Redis. Every method swallows Redis errors
    (logged, counted in ``invoicing_tax_cache_errors_total``) and then behaves as a miss.

    Keys (``prefix`` default ``invoicing:tax:``)::

        {prefix}doc:{idempotency_key}          JSON {"fingerprint", "lines": [[id, code, rate, tax]]}
        {prefix}rate:["region"|null,"code"|null] JSON {"tax_code", "rate"}

    Both expire after ``ttl_s`` seconds (``SET … EX``: a put restarts the TTL). A
    document entry is used only when its fingerprint equals the request's, so a
    conflicting document still reaches the service (and gets its 409). Pass a
    client with a short ``socket_timeout`` (settings ``redis.socket_timeout_s``), so
    that a dead Redis costs little.
    """

    def __init__(self, client: redis.Redis, *, ttl_s: int, prefix: str = "invoicing:tax:") -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self._prefix = prefix

    def _doc_key(self, idempotency_key: str) -> str:
        return f"{self._prefix}doc:{idempotency_key}"

    def _rate_key(self, key: RateKey) -> str:
        return f"{self._prefix}rate:{json.dumps(list(key), separators=(',', ':'))}"

    @staticmethod
    def _failed(operation: str, exc: Exception) -> None:
        TAX_CACHE_ERRORS.labels(operation=operation).inc()
        logger.warning("tax cache %s failed, going to the tax service: %r", operation, exc)

    def get_document(self, idempotency_key: str, fingerprint: str) -> list[TaxedLine] | None:
        """The committed answer of a document with this key and content, or ``None``."""
        try:
            raw = self._redis.get(self._doc_key(idempotency_key))
        except redis.RedisError as exc:
            self._failed("get_document", exc)
            return None
        if raw is None:
            TAX_CACHE_LOOKUPS.labels(kind="document", result="miss").inc()
            return None
        try:
            entry = json.loads(raw)
            if entry["fingerprint"] != fingerprint:
                TAX_CACHE_LOOKUPS.labels(kind="document", result="miss").inc()
                return None
            lines = [
                TaxedLine(
                    line_id=str(line_id),
                    tax_code=str(code),
                    rate=decimal_text(rate, "rate"),
                    tax=decimal_text(tax, "tax"),
                )
                for line_id, code, rate, tax in entry["lines"]
            ]
        except (ValueError, KeyError, TypeError, InvalidAmount) as exc:
            self._failed("decode_document", exc)
            return None
        TAX_CACHE_LOOKUPS.labels(kind="document", result="hit").inc()
        return lines

    def put_document(
        self, idempotency_key: str, fingerprint: str, lines: Sequence[TaxedLine]
    ) -> None:
        """Store a committed answer (expires after ``ttl_s``)."""
        entry = {
            "fingerprint": fingerprint,
            "lines": [[ln.line_id, ln.tax_code, str(ln.rate), str(ln.tax)] for ln in lines],
        }
        try:
            self._redis.set(self._doc_key(idempotency_key), json.dumps(entry), ex=self._ttl_s)
        except redis.RedisError as exc:
            self._failed("put_document", exc)

    def get_rates(self, keys: Iterable[RateKey]) -> dict[RateKey, Rate]:
        """The cached rates among ``keys`` (missing ones are absent); ``{}`` if Redis fails."""
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        try:
            raws: list[Any] = self._redis.mget([self._rate_key(k) for k in wanted])
        except redis.RedisError as exc:
            self._failed("get_rates", exc)
            return {}
        found: dict[RateKey, Rate] = {}
        for key, raw in zip(wanted, raws, strict=True):
            if raw is None:
                TAX_CACHE_LOOKUPS.labels(kind="rate", result="miss").inc()
                continue
            try:
                entry = json.loads(raw)
                found[key] = Rate(str(entry["tax_code"]), decimal_text(entry["rate"], "rate"))
            except (ValueError, KeyError, TypeError, InvalidAmount) as exc:
                self._failed("decode_rate", exc)
                continue
            TAX_CACHE_LOOKUPS.labels(kind="rate", result="hit").inc()
        return found

    def put_rates(self, rates: Mapping[RateKey, Rate]) -> None:
        """Store rates (each expires after ``ttl_s``) in one round trip."""
        if not rates:
            return
        try:
            pipe = self._redis.pipeline(transaction=False)
            for key, rate in rates.items():
                value = json.dumps({"tax_code": rate.tax_code, "rate": str(rate.rate)})
                pipe.set(self._rate_key(key), value, ex=self._ttl_s)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed("put_rates", exc)
