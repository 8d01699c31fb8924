"""The tax service client: :class:`HttpTaxService`, the :class:`~streams.core.billing.ports.TaxService` over HTTP.

docs/design.md "Tax service": a third-party HTTP service, slow and sometimes failing,
that takes a whole document (up to 1,000 lines and an idempotency key) and
answers the tax of each line. An invoice is never issued without its tax, and
tax is never applied twice. The port's contract (shapes, idempotency, errors) is
:class:`streams.core.billing.ports.TaxService`; the wire format is
:mod:`streams.adapters.tax.wire`.

Rules of this client:

* Splits a document into requests of at most ``max_lines_per_request`` lines;
  request ``i`` carries the idempotency key ``f"{key}:{i}"`` (one request →
  ``key:0``). Requests of one document run one after another.
* Each request has connect/read timeouts and at most ``max_attempts`` attempts,
  with exponential backoff plus jitter (``Retry-After`` honoured up to
  ``backoff_max_s``), all with the **same** key, so a retry after a lost answer
  is a replay, never a second tax. Retried: timeouts, connection errors, 408,
  429 and 5xx. Never retried: any other 4xx and invalid answers.
* At most ``max_concurrency`` requests are in flight per client object, across
  threads.
* Optional cache (a :class:`~streams.core.billing.ports.TaxCache`, in production
  :class:`streams.adapters.tax.cache.RedisTaxCache`): committed results by
  idempotency key (a second attempt after a crash answers from the cache without
  calling the service), and rates by (region, product tax code), learned from
  every answer (and from :meth:`HttpTaxService.rate`), so a quote whose every
  line's rate is cached is computed locally without a call. A cache failure is a
  miss (the cache's contract), so the call goes to the service.

Exceptions: :class:`~streams.core.billing.ports.TaxUnavailable` (transient: retries
exhausted) and :class:`~streams.core.billing.ports.TaxRejected` (permanent: 4xx other
than 408/429, an invalid answer, an invalid document).

Metrics (prometheus_client, default registry): ``invoicing_tax_requests_total{outcome}``,
``invoicing_tax_retries_total``, ``invoicing_tax_request_duration_seconds``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from prometheus_client import Counter, Histogram
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from streams.adapters.tax import wire
from streams.core.billing.ports import (
    Rate,
    RateKey,
    TaxCache,
    TaxError,
    TaxRejected,
    TaxUnavailable,
)
from streams.core.domain.invoice import TaxedLine, TaxLine
from streams.settings import TaxSettings

logger = logging.getLogger(__name__)

__all__ = ["TAX_REQUESTS", "TAX_REQUEST_SECONDS", "TAX_RETRIES", "HttpTaxService"]

_T = TypeVar("_T")

TAX_REQUESTS = Counter(
    "invoicing_tax_requests_total",
    "HTTP requests (attempts) to the tax service, by outcome: ok, replay, timeout, "
    "transport_error, retryable_status, rejected, invalid_answer.",
    ["outcome"],
)
TAX_RETRIES = Counter(
    "invoicing_tax_retries_total",
    "Retries of a tax request after a transient failure (same idempotency key).",
)
TAX_REQUEST_SECONDS = Histogram(
    "invoicing_tax_request_duration_seconds",
    "Duration of one HTTP attempt to the tax service, in seconds.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

_RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))


class HttpTaxService:
    """:class:`~streams.core.billing.ports.TaxService` over HTTP (see the module docstring).

    Args:
        settings: url, timeouts (seconds), ``max_attempts`` (first included),
            backoff ``backoff_initial_s`` doubling up to ``backoff_max_s`` plus
            up to ``backoff_initial_s`` of jitter, ``max_concurrency``,
            ``max_lines_per_request``.
        cache: optional :class:`~streams.core.billing.ports.TaxCache`.
        client: an ``httpx.Client`` to use instead of one built from settings
            (tests pass one with ``httpx.MockTransport``); closed by :meth:`close`
            only when built here.
        sleep: how retries wait (tests may pass a no-op); default ``time.sleep``.
        quotes_from_cached_rates: compute a quote (``commit=False``) from cached rates
            when every line's rate is cached (default). The replay passes False: it must
            price with the rates the service applies *now* — a rate cached for up to
            ``cache_ttl_s`` (7 days) would hide a rate change from its comparison
            (docs/decisions/0092-replay-and-released-holds.md). Its answers still refresh
            the cache.
        quotes_from_learned_rates: compute a quote from the rates **this object** learned
            from the service's own answers (documents and :meth:`rate` calls that reached
            the service, never the cache) when every line's rate is among them. Default
            False. The replay passes True with ``quotes_from_cached_rates=False``: it makes
            one client per run, so its quotes use rates no older than the run, the
            service's answer for the first document of each (region, tax code) and the same
            per-line arithmetic as a quote from cached rates (``wire.tax_of``)
            (docs/decisions/0100-replay-quotes-from-the-runs-rates.md).

    Thread-safe: one object serves every worker thread of a process.
    """

    def __init__(
        self,
        settings: TaxSettings,
        *,
        cache: TaxCache | None = None,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        quotes_from_cached_rates: bool = True,
        quotes_from_learned_rates: bool = False,
    ) -> None:
        self._settings = settings
        self._cache = cache
        self._quotes_from_cached_rates = quotes_from_cached_rates
        #: Rates from this object's own answers (``quotes_from_learned_rates``), else None.
        self._learned: dict[RateKey, Rate] | None = {} if quotes_from_learned_rates else None
        self._learned_lock = threading.Lock()
        self._owns_client = client is None
        self._client = client or httpx.Client(
            base_url=settings.url,
            timeout=httpx.Timeout(settings.read_timeout_s, connect=settings.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=settings.max_concurrency,
                max_keepalive_connections=settings.max_concurrency,
            ),
            headers={"user-agent": "invoicing-tax-client/1"},
            trust_env=False,
        )
        self._slots = threading.BoundedSemaphore(settings.max_concurrency)
        self._sleep = sleep
        self._backoff = wait_exponential_jitter(
            multiplier=settings.backoff_initial_s,
            max=settings.backoff_max_s,
            jitter=settings.backoff_initial_s,
        )

    def close(self) -> None:
        """Close the HTTP client if this object built it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ----------------------------------------------------------------- public API

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        """See :class:`~streams.core.billing.ports.TaxService`.

        Raises:
            TaxUnavailable: a request still failed transiently after ``max_attempts``.
            TaxRejected: 4xx other than 408/429, an invalid answer, or an invalid
                document (status ``None``, nothing sent).
        """
        wire.check_document(idempotency_key, customer_id, lines)
        if not lines:
            return []
        if not commit and self._learned is not None:
            with self._learned_lock:
                known = dict(self._learned)
            quoted = _quote_from_rates(known, lines)
            if quoted is not None:
                logger.debug("tax quote of %d lines computed from this run's rates", len(lines))
                return quoted
        fingerprint = wire.document_fingerprint(customer_id, currency, lines)
        if self._cache is not None:
            if commit:
                cached = self._cache.get_document(idempotency_key, fingerprint)
                if cached is not None and [t.line_id for t in cached] == [
                    ln.line_id for ln in lines
                ]:
                    logger.debug("tax document %s answered from the cache", idempotency_key)
                    return cached
            elif self._quotes_from_cached_rates:
                quoted = self._quote_from_cached_rates(self._cache, lines)
                if quoted is not None:
                    return quoted
        results: list[TaxedLine] = []
        for index, chunk in enumerate(wire.chunks(lines, self._settings.max_lines_per_request)):
            request = wire.DocumentRequest(
                wire.chunk_key(idempotency_key, index), customer_id, currency, commit, chunk
            )
            results.extend(self._send(request))
        answered: dict[RateKey, Rate] = {
            (ln.region_id, ln.tax_code): Rate(t.tax_code, t.rate)
            for ln, t in zip(lines, results, strict=True)
        }
        self._learn(answered)
        if self._cache is not None:
            self._cache.put_rates(answered)
            if commit:
                self._cache.put_document(idempotency_key, fingerprint, results)
        return results

    def rate(self, region_id: str | None, tax_code: str | None = None) -> Rate:
        """The rate the service applies to lines of ``region_id`` with product code
        ``tax_code`` (``GET /v1/rates``), from the cache when it is there; the answer
        is cached. Same retries and errors as :meth:`calculate`."""
        key: RateKey = (region_id, tax_code)
        if self._cache is not None:
            cached = self._cache.get_rates([key])
            if key in cached:
                return cached[key]
        params = {
            k: v for k, v in (("region_id", region_id), ("tax_code", tax_code)) if v is not None
        }
        what = f"rate lookup {params}"

        def attempt() -> Rate:
            data, _ = self._exchange(None, lambda: self._client.get(wire.RATES_PATH, params=params))
            try:
                found = wire.parse_rate_answer(data)
            except wire.InvalidAnswer as exc:
                TAX_REQUESTS.labels(outcome="invalid_answer").inc()
                raise TaxRejected(f"invalid answer to the {what}: {exc}", status=200) from None
            TAX_REQUESTS.labels(outcome="ok").inc()
            return found

        found = self._with_retries(what, None, attempt)
        self._learn({key: found})
        if self._cache is not None:
            self._cache.put_rates({key: found})
        return found

    # ----------------------------------------------------------------- internals

    def _learn(self, rates: dict[RateKey, Rate]) -> None:
        """Keep the service's answered rates (``quotes_from_learned_rates`` only)."""
        if self._learned is not None:
            with self._learned_lock:
                self._learned.update(rates)

    @staticmethod
    def _quote_from_cached_rates(
        cache: TaxCache, lines: Sequence[TaxLine]
    ) -> list[TaxedLine] | None:
        rates = cache.get_rates({(ln.region_id, ln.tax_code) for ln in lines})
        quoted = _quote_from_rates(rates, lines)
        if quoted is not None:
            logger.debug("tax quote of %d lines computed from cached rates", len(lines))
        return quoted

    def _send(self, request: wire.DocumentRequest) -> list[TaxedLine]:
        key = request.idempotency_key
        body = request.body()
        headers = {"content-type": "application/json", wire.IDEMPOTENCY_KEY_HEADER: key}

        def attempt() -> list[TaxedLine]:
            data, replay = self._exchange(
                key, lambda: self._client.post(wire.DOCUMENTS_PATH, content=body, headers=headers)
            )
            try:
                taxed = wire.parse_document_answer(key, request.lines, data)
            except wire.InvalidAnswer as exc:
                TAX_REQUESTS.labels(outcome="invalid_answer").inc()
                raise TaxRejected(
                    f"invalid answer to {key}: {exc}", status=200, idempotency_key=key
                ) from None
            TAX_REQUESTS.labels(outcome="replay" if replay else "ok").inc()
            return taxed

        return self._with_retries(f"tax request {key}", key, attempt)

    def _with_retries(self, what: str, key: str | None, attempt: Callable[[], _T]) -> _T:
        """Run ``attempt`` with tenacity: retry :class:`TaxUnavailable`, then raise it
        with the number of attempts; :class:`TaxRejected` passes at once. ``what``
        names the request in messages; ``key`` is its idempotency key, if any."""
        attempts = 0

        def counted() -> _T:
            nonlocal attempts
            attempts += 1
            return attempt()

        retrying = Retrying(
            stop=stop_after_attempt(self._settings.max_attempts),
            wait=self._wait,
            retry=retry_if_exception_type(TaxUnavailable),
            before_sleep=self._before_sleep,
            sleep=self._sleep,
            reraise=True,
        )
        try:
            return retrying(counted)
        except TaxError as exc:
            exc.idempotency_key = exc.idempotency_key or key
            exc.attempts = attempts
            if isinstance(exc, TaxUnavailable):
                raise TaxUnavailable(
                    f"{what} failed after {attempts} attempts: {exc}",
                    status=exc.status,
                    idempotency_key=key,
                    attempts=attempts,
                ) from exc
            raise

    def _wait(self, state: RetryCallState) -> float:
        wait = float(self._backoff(state))
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, TaxError) and exc.retry_after_s is not None:
            wait = max(wait, min(exc.retry_after_s, self._settings.backoff_max_s))
        return wait

    @staticmethod
    def _before_sleep(state: RetryCallState) -> None:
        TAX_RETRIES.inc()
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        logger.info(
            "tax request attempt %d failed (%s); retrying in %.2fs with the same key",
            state.attempt_number,
            exc,
            wait,
        )

    def _exchange(self, key: str | None, send: Callable[[], httpx.Response]) -> tuple[Any, bool]:
        """One HTTP attempt under the concurrency bound → the decoded JSON of a 200 and
        whether the service said it replayed a stored answer (``Idempotent-Replayed``).

        Raises:
            TaxUnavailable: timeout, connection error, 408/429/5xx.
            TaxRejected: another status, or a body that is not JSON.
        """
        with self._slots:
            started = time.perf_counter()
            try:
                response: httpx.Response = send()
            except httpx.TimeoutException as exc:
                TAX_REQUESTS.labels(outcome="timeout").inc()
                raise TaxUnavailable(f"timeout: {exc!r}", idempotency_key=key) from exc
            except httpx.TransportError as exc:
                TAX_REQUESTS.labels(outcome="transport_error").inc()
                raise TaxUnavailable(f"transport error: {exc!r}", idempotency_key=key) from exc
            finally:
                TAX_REQUEST_SECONDS.observe(time.perf_counter() - started)
        status = response.status_code
        if status in _RETRYABLE_STATUS:
            TAX_REQUESTS.labels(outcome="retryable_status").inc()
            raise TaxUnavailable(
                f"HTTP {status}: {_error_text(response)}",
                status=status,
                idempotency_key=key,
                retry_after_s=_retry_after(response),
            )
        if status != 200:
            TAX_REQUESTS.labels(outcome="rejected").inc()
            raise TaxRejected(
                f"HTTP {status}: {_error_text(response)}", status=status, idempotency_key=key
            )
        try:
            data = json.loads(response.content, parse_float=Decimal)
        except ValueError as exc:
            TAX_REQUESTS.labels(outcome="invalid_answer").inc()
            raise TaxRejected(
                f"answer is not JSON: {exc}", status=status, idempotency_key=key
            ) from None
        replay = response.headers.get(wire.REPLAYED_HEADER, "").lower() == "true"
        return data, replay


def _quote_from_rates(
    rates: dict[RateKey, Rate], lines: Sequence[TaxLine]
) -> list[TaxedLine] | None:
    """The quote of ``lines`` from ``rates`` (each line's tax ``wire.tax_of(amount,
    rate)``, in the currency's units), or None when a line's (region, tax code) is not in
    ``rates``."""
    taxed: list[TaxedLine] = []
    for ln in lines:
        found = rates.get((ln.region_id, ln.tax_code))
        if found is None:
            return None
        taxed.append(
            TaxedLine(ln.line_id, found.tax_code, found.rate, wire.tax_of(ln.amount, found.rate))
        )
    return taxed


def _error_text(response: httpx.Response) -> str:
    try:
        message = wire.error_message(response.json())
        if message is not None:
            return message[:500]
    except ValueError:
        pass
    return response.text[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
