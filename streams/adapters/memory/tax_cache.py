"""In-memory twin of the :class:`~streams.core.billing.ports.TaxCache` port.

:class:`InMemoryTaxCache` keeps documents and rates in dicts with Redis's expiry
semantics as far as the contract needs them: every put (re)starts the entry's TTL
(``SET … EX ttl_s``), an entry is gone once ``ttl_s`` seconds have passed, and an
unavailable cache (``down = True``) is a miss that raises nothing, as
:class:`~streams.adapters.tax.cache.RedisTaxCache` is with Redis down.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from streams.core.billing.ports import Rate, RateKey
from streams.core.domain.invoice import TaxedLine

__all__ = ["InMemoryTaxCache"]


@dataclass(frozen=True)
class _Document:
    fingerprint: str
    lines: tuple[TaxedLine, ...]
    expires_at: float


class InMemoryTaxCache:
    """:class:`~streams.core.billing.ports.TaxCache` in memory. Thread-safe.

    Args:
        ttl_s: seconds an entry lives after its put (Redis ``EX``).
        clock: monotonic seconds; tests pass a fake one to expire entries without
            sleeping. Default ``time.monotonic``.

    Attributes:
        down: when true, every get is a miss and every put is dropped (Redis down).
        errors: how many operations failed because the cache was down, by operation
            name (``get_document``, ``put_document``, ``get_rates``, ``put_rates``), as
            ``invoicing_tax_cache_errors_total`` counts them for the Redis cache.
    """

    def __init__(self, *, ttl_s: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._documents: dict[str, _Document] = {}
        self._rates: dict[RateKey, tuple[Rate, float]] = {}
        self.down = False
        self.errors: dict[str, int] = {}

    def _unavailable(self, operation: str) -> bool:
        if self.down:
            self.errors[operation] = self.errors.get(operation, 0) + 1
        return self.down

    def get_document(self, idempotency_key: str, fingerprint: str) -> list[TaxedLine] | None:
        """The stored answer for this key and fingerprint, or ``None``."""
        with self._lock:
            if self._unavailable("get_document"):
                return None
            entry = self._documents.get(idempotency_key)
            if entry is None or entry.expires_at <= self._clock():
                return None
            return list(entry.lines) if entry.fingerprint == fingerprint else None

    def put_document(
        self, idempotency_key: str, fingerprint: str, lines: Sequence[TaxedLine]
    ) -> None:
        """Store a committed answer (replaces any entry; expires after ``ttl_s``)."""
        with self._lock:
            if self._unavailable("put_document"):
                return
            self._documents[idempotency_key] = _Document(
                fingerprint, tuple(lines), self._clock() + self._ttl_s
            )

    def get_rates(self, keys: Iterable[RateKey]) -> dict[RateKey, Rate]:
        """The stored, unexpired rates among ``keys``."""
        with self._lock:
            if self._unavailable("get_rates"):
                return {}
            now = self._clock()
            found: dict[RateKey, Rate] = {}
            for key in keys:
                entry = self._rates.get(key)
                if entry is not None and entry[1] > now:
                    found[key] = entry[0]
            return found

    def put_rates(self, rates: Mapping[RateKey, Rate]) -> None:
        """Store rates (each replaces any entry and expires after ``ttl_s``)."""
        with self._lock:
            if self._unavailable("put_rates"):
                return
            expires_at = self._clock() + self._ttl_s
            for key, rate in rates.items():
                self._rates[key] = (rate, expires_at)
