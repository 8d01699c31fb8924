"""In-memory twin of the :class:`~streams.core.billing.ports.TaxService` port.

:class:`InMemoryTaxService` runs the fake tax service's own engine
(:class:`streams.adapters.memory.tax_engine.TaxLedger`: the same rate table and
idempotency rules), with the same chunking (``key:i``, at most 1,000 lines per
request) as the HTTP client, so the twin, the fake HTTP service and the client
against it give the same answers (``tests/contracts/tax.py`` checks both).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from streams.adapters.memory.tax_engine import TaxLedger, rate_for
from streams.adapters.tax.wire import MAX_LINES_PER_REQUEST, check_document, chunk_key, chunks
from streams.core.billing.ports import Rate, TaxError, TaxRejected, TaxUnavailable
from streams.core.domain.invoice import TaxedLine, TaxLine

__all__ = ["InMemoryTaxService", "RecordedCall"]


@dataclass(frozen=True)
class RecordedCall:
    """One request :class:`InMemoryTaxService` handled; ``outcome`` is one of
    ``ok``, ``replay``, ``conflict``, ``invalid``, ``error`` (an injected failure)."""

    idempotency_key: str
    customer_id: str
    line_count: int
    commit: bool
    outcome: str


class InMemoryTaxService:
    """:class:`~streams.core.billing.ports.TaxService` in memory, for unit tests of other components.

    Same rate table, chunking (``key:i``) and idempotency rules as the fake HTTP
    service (both run :class:`~streams.adapters.memory.tax_engine.TaxLedger`). ``calls``
    lists every request in order; :meth:`fail_next` makes the next requests raise,
    and ``down = True`` makes every request fail as an unreachable service does, to
    test callers' error paths. Thread-safe.

    Args:
        max_lines_per_request: lines per request (default 1,000, the service's limit).
        ledger: the engine to use (share one between twins to share committed documents).
    """

    def __init__(
        self,
        *,
        max_lines_per_request: int = MAX_LINES_PER_REQUEST,
        ledger: TaxLedger | None = None,
    ) -> None:
        self.max_lines_per_request = max_lines_per_request
        # not ``ledger or …``: an empty ledger has len 0, so it is falsy
        self.ledger = ledger if ledger is not None else TaxLedger(max_lines=max_lines_per_request)
        self.calls: list[RecordedCall] = []
        #: When true, every request raises :class:`TaxUnavailable` (status ``None``),
        #: as the HTTP client does when the service cannot be reached.
        self.down = False
        self._lock = threading.Lock()
        self._failures: list[TaxError] = []

    def fail_next(self, count: int = 1, error: TaxError | None = None) -> None:
        """Make the next ``count`` requests raise ``error`` (default: :class:`TaxUnavailable`
        with status 503), before the ledger sees them."""
        with self._lock:
            for _ in range(count):
                self._failures.append(
                    error or TaxUnavailable("injected failure", status=503, attempts=1)
                )

    def outcomes(self, idempotency_key: str) -> list[str]:
        """Outcomes of the requests of one document (its chunks ``key:i``), in order."""
        prefix = f"{idempotency_key}:"
        with self._lock:
            return [c.outcome for c in self.calls if c.idempotency_key.startswith(prefix)]

    def rate(self, region_id: str | None, tax_code: str | None = None) -> Rate:
        """The rate the service applies to ``(region_id, tax_code)``; see
        :func:`~streams.adapters.memory.tax_engine.rate_for`.

        Raises:
            TaxRejected: unknown product tax code (422).
        """
        return rate_for(region_id, tax_code)

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        """See :class:`~streams.core.billing.ports.TaxService`. Raises :class:`TaxRejected`
        (409/413/422, or ``None`` for a document refused before sending), injected
        errors, and :class:`TaxUnavailable` when ``down``."""
        check_document(idempotency_key, customer_id, lines)
        results: list[TaxedLine] = []
        for index, chunk in enumerate(chunks(lines, self.max_lines_per_request)):
            key = chunk_key(idempotency_key, index)
            with self._lock:
                failure = self._failures.pop(0) if self._failures else None
            if failure is None and self.down:
                failure = TaxUnavailable(
                    f"tax request {key}: the service cannot be reached (twin is down)",
                    idempotency_key=key,
                    attempts=1,
                )
            if failure is not None:
                self._record(key, customer_id, len(chunk), commit, "error")
                failure.idempotency_key = failure.idempotency_key or key
                raise failure
            try:
                answer = self.ledger.process(
                    idempotency_key=key,
                    customer_id=customer_id,
                    currency=currency,
                    lines=chunk,
                    commit=commit,
                )
            except TaxRejected as exc:
                outcome = "conflict" if exc.status == 409 else "invalid"
                self._record(key, customer_id, len(chunk), commit, outcome)
                exc.attempts = 1
                raise
            self._record(key, customer_id, len(chunk), commit, "replay" if answer.replay else "ok")
            results.extend(answer.lines)
        return results

    def _record(self, key: str, customer_id: str, count: int, commit: bool, outcome: str) -> None:
        with self._lock:
            self.calls.append(RecordedCall(key, customer_id, count, commit, outcome))
