"""Tax service client: the :class:`TaxService` port, its HTTP and in-memory implementations.

DESIGN "Tax service": a third-party HTTP service, slow and sometimes failing,
that takes a whole document (up to 1,000 lines and an idempotency key) and
answers the tax of each line. An invoice is never issued without its tax, and
tax is never applied twice.

Port::

    TaxService.calculate(*, idempotency_key: str, customer_id: str, currency: str,
                         lines: Sequence[TaxLine], commit: bool = True) -> list[TaxedLine]

One :class:`~streams.domain.invoice.TaxedLine` per input line, in input order;
``tax`` is ``amount * rate`` at full precision (rounding is the invoice's job,
:mod:`streams.domain.invoice`). ``commit=True`` records the document at the
service (a replay with the same key and lines answers the stored result; the
same key with other lines is refused, 409); ``commit=False`` is a quote and
stores nothing. No lines → ``[]`` without a call. Synchronous: it is called from
worker threads.

Implementations:

* :class:`HttpTaxService` — the real client (httpx + tenacity + a Redis cache).
  Splits a document into requests of at most ``max_lines_per_request`` lines;
  request ``i`` carries the idempotency key ``f"{key}:{i}"`` (one request →
  ``key:0``). Each request has connect/read timeouts and at most
  ``max_attempts`` attempts, with exponential backoff plus jitter, all with the
  **same** key, so a retry after a lost answer is a replay, never a second tax.
  Retried: timeouts, connection errors, 408, 429 and 5xx. Never retried: any
  other 4xx and invalid answers. At most ``max_concurrency`` requests are in
  flight per client object, across threads. Requests of one document run one
  after another.
* :class:`InMemoryTaxService` — a fake with the same rate table, chunking and
  idempotency rules, for unit tests of other components; it records its calls
  and can be told to fail.

Both run the rules of :class:`TaxLedger`, which is also the engine of the fake
HTTP server (:mod:`streams.stack.fake_tax`); one contract test suite
(``tests/unit/test_tax_contract.py``) runs against both implementations.

Cache (:class:`RedisTaxCache`, optional): committed results by idempotency key
(a second attempt after a crash answers from Redis without calling the
service), and rates by (region, product tax code), learned from every answer
(and from :meth:`HttpTaxService.rate`), so a quote whose every line's rate is
cached is computed locally without a call. Redis being down slows the system
down, never makes it wrong: every cache error is logged and counted
(``invoicing_tax_cache_errors_total``) and the call goes to the service.

Exceptions::

    TaxError                root; .status (HTTP status or None), .idempotency_key, .attempts
    ├── TaxUnavailable      transient: retries exhausted (timeouts, connection errors,
    │                       408/429/5xx) — retry the job later, do not dead-letter
    └── TaxRejected         permanent: 4xx (409 conflict, 413 too large, 422 invalid)
                            or an invalid answer — the same document fails again

Metrics (prometheus_client, default registry): ``invoicing_tax_requests_total{outcome}``,
``invoicing_tax_retries_total``, ``invoicing_tax_request_duration_seconds``,
``invoicing_tax_cache_lookups_total{kind,result}``,
``invoicing_tax_cache_errors_total{operation}``.

The fake rate table (:data:`JURISDICTIONS`) is illustrative, not tax advice:
a cloud region id maps to a jurisdiction and its standard rate.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import httpx
import redis
from prometheus_client import Counter, Histogram
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from streams.domain.invoice import TaxedLine, TaxLine
from streams.domain.money import InvalidAmount, parse_decimal
from streams.settings import TaxSettings

logger = logging.getLogger(__name__)

__all__ = [
    "JURISDICTIONS",
    "DocumentAnswer",
    "HttpTaxService",
    "InMemoryTaxService",
    "Jurisdiction",
    "Rate",
    "RecordedCall",
    "RedisTaxCache",
    "TaxError",
    "TaxLedger",
    "TaxRejected",
    "TaxService",
    "TaxUnavailable",
    "chunk_key",
    "document_fingerprint",
    "rate_for",
    "tax_of",
]

_T = TypeVar("_T")

#: The service's limit on lines per document request (DESIGN "Tax service").
MAX_LINES_PER_REQUEST = 1000


# --------------------------------------------------------------------------- exceptions


class TaxError(Exception):
    """Root of the tax client's exceptions.

    Attributes:
        status: HTTP status of the last answer, ``None`` when there was none
            (timeout, connection error, refused before sending).
        idempotency_key: key of the request that failed (``key:i`` for chunk ``i``).
        attempts: attempts made for that request (0 = refused before sending).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        idempotency_key: str | None = None,
        attempts: int = 0,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.idempotency_key = idempotency_key
        self.attempts = attempts
        #: Seconds the service asked us to wait (``Retry-After``), if it did.
        self.retry_after_s = retry_after_s


class TaxUnavailable(TaxError):
    """Transient: the service did not answer usably within the attempts allowed.
    The same document may succeed later (same idempotency key)."""


class TaxRejected(TaxError):
    """Permanent: the service refused the document (4xx) or answered something
    invalid, or the document is invalid before sending. Retrying fails again."""


# --------------------------------------------------------------------------- port


class TaxService(Protocol):
    """The tax service port (see the module docstring for the contract)."""

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        """Tax of each line, in input order.

        Raises:
            TaxUnavailable: transient failure after the allowed attempts.
            TaxRejected: the document is refused (invalid, conflicting key, …).
        """
        ...


# --------------------------------------------------------------------------- rules of the fake service


@dataclass(frozen=True)
class Jurisdiction:
    """A tax jurisdiction of the fake service: code prefix (``US-WA``) and standard rate."""

    code: str
    rate: Decimal


@dataclass(frozen=True)
class Rate:
    """The code and rate applied to a line: ``tax_code`` like ``US-WA-STD``, ``rate`` a
    fraction (``0.065`` = 6.5 %)."""

    tax_code: str
    rate: Decimal


#: Region id (lower case) → jurisdiction. AWS and Azure region names of the FOCUS sample.
JURISDICTIONS: Mapping[str, Jurisdiction] = {
    # United States: state sales tax (base rates)
    "us-east-1": Jurisdiction("US-VA", Decimal("0.053")),
    "us-east-2": Jurisdiction("US-OH", Decimal("0.0575")),
    "us-west-1": Jurisdiction("US-CA", Decimal("0.0725")),
    "us-west-2": Jurisdiction("US-WA", Decimal("0.065")),
    "eastus": Jurisdiction("US-VA", Decimal("0.053")),
    "eastus2": Jurisdiction("US-VA", Decimal("0.053")),
    "westus": Jurisdiction("US-CA", Decimal("0.0725")),
    "westus2": Jurisdiction("US-WA", Decimal("0.065")),
    "centralus": Jurisdiction("US-IA", Decimal("0.06")),
    "ca-central-1": Jurisdiction("CA-ON", Decimal("0.13")),
    "sa-east-1": Jurisdiction("BR", Decimal("0.17")),
    # Europe: standard VAT
    "eu-central-1": Jurisdiction("DE", Decimal("0.19")),
    "eu-west-1": Jurisdiction("IE", Decimal("0.23")),
    "northeurope": Jurisdiction("IE", Decimal("0.23")),
    "westeurope": Jurisdiction("NL", Decimal("0.21")),
    "eu-west-2": Jurisdiction("GB", Decimal("0.20")),
    "eu-west-3": Jurisdiction("FR", Decimal("0.20")),
    "eu-north-1": Jurisdiction("SE", Decimal("0.25")),
    "eu-south-1": Jurisdiction("IT", Decimal("0.22")),
    # Asia-Pacific, Middle East, Africa: GST / VAT / consumption tax
    "ap-south-1": Jurisdiction("IN", Decimal("0.18")),
    "ap-south-2": Jurisdiction("IN", Decimal("0.18")),
    "ap-northeast-1": Jurisdiction("JP", Decimal("0.10")),
    "ap-northeast-2": Jurisdiction("KR", Decimal("0.10")),
    "ap-southeast-1": Jurisdiction("SG", Decimal("0.09")),
    "ap-southeast-2": Jurisdiction("AU", Decimal("0.10")),
    "me-south-1": Jurisdiction("BH", Decimal("0.10")),
    "af-south-1": Jurisdiction("ZA", Decimal("0.15")),
}

#: Unknown regions by prefix, then :data:`DEFAULT_JURISDICTION`.
_PREFIX_JURISDICTIONS: tuple[tuple[str, Jurisdiction], ...] = (
    ("us-", Jurisdiction("US", Decimal("0.06"))),
    ("eu-", Jurisdiction("EU", Decimal("0.20"))),
    ("ap-", Jurisdiction("APAC", Decimal("0.10"))),
)

#: ``None``, ``"global"`` and any unknown region.
DEFAULT_JURISDICTION = Jurisdiction("GLOBAL", Decimal("0.05"))

#: Product tax codes a line may carry: ``None``/``"STD"`` standard rate, ``"EXEMPT"`` zero.
PRODUCT_TAX_CODES = frozenset({"STD", "EXEMPT"})


def jurisdiction_of(region_id: str | None) -> Jurisdiction:
    """The fake service's jurisdiction of a region id (case-insensitive); never fails."""
    region = (region_id or "").strip().lower()
    if region in JURISDICTIONS:
        return JURISDICTIONS[region]
    for prefix, jurisdiction in _PREFIX_JURISDICTIONS:
        if region.startswith(prefix):
            return jurisdiction
    return DEFAULT_JURISDICTION


def rate_for(region_id: str | None, tax_code: str | None = None) -> Rate:
    """The code and rate the fake service applies to a line of ``region_id`` with product
    code ``tax_code`` (``None``/``"STD"`` → ``<JUR>-STD`` at the standard rate,
    ``"EXEMPT"`` → ``<JUR>-EXEMPT`` at 0).

    Raises:
        TaxRejected: ``tax_code`` is not a known product code (status 422).
    """
    product = "STD" if tax_code is None else tax_code.strip().upper()
    if product not in PRODUCT_TAX_CODES:
        raise TaxRejected(
            f"unknown product tax code {tax_code!r} (known: {sorted(PRODUCT_TAX_CODES)})",
            status=422,
        )
    jurisdiction = jurisdiction_of(region_id)
    rate = jurisdiction.rate if product == "STD" else Decimal("0")
    return Rate(tax_code=f"{jurisdiction.code}-{product}", rate=rate)


def tax_of(amount: Decimal, rate: Decimal) -> Decimal:
    """``amount * rate`` exactly: a context wide enough for every digit, ``Inexact`` trapped.

    Negative amounts give negative tax. Nothing is rounded.
    """
    digits = len(amount.as_tuple().digits) + len(rate.as_tuple().digits)
    ctx = decimal.Context(
        prec=max(digits, 1),
        traps=[decimal.InvalidOperation, decimal.Inexact, decimal.Overflow],
    )
    return ctx.multiply(amount, rate)


def chunk_key(idempotency_key: str, index: int) -> str:
    """Idempotency key of request ``index`` (0-based) of a document: ``f"{key}:{index}"``."""
    return f"{idempotency_key}:{index}"


def _chunks(lines: Sequence[TaxLine], size: int) -> Iterator[Sequence[TaxLine]]:
    for start in range(0, len(lines), size):
        yield lines[start : start + size]


def _canonical_amount(amount: Decimal) -> str:
    """A context-free canonical text of a Decimal's value: ``1.50`` and ``1.5`` agree."""
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def document_fingerprint(customer_id: str, currency: str, lines: Sequence[TaxLine]) -> str:
    """SHA-256 (hex) of a document's content: customer, currency and every line
    (id, amount by value, region, product code), in order. Same content → same
    fingerprint; the service compares it on a replay."""
    content = [
        customer_id,
        currency,
        [[ln.line_id, _canonical_amount(ln.amount), ln.region_id, ln.tax_code] for ln in lines],
    ]
    data = json.dumps(content, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()


def check_document(idempotency_key: str, customer_id: str, lines: Sequence[TaxLine]) -> None:
    """Refuse a document no service could answer, before sending it.

    Raises:
        TaxRejected: empty key or customer, an empty or repeated line id, or an
            amount that is not a finite ``Decimal`` (status ``None``).
    """
    if not idempotency_key:
        raise TaxRejected("empty idempotency key")
    if not customer_id:
        raise TaxRejected("empty customer id", idempotency_key=idempotency_key)
    seen: set[str] = set()
    for line in lines:
        if not line.line_id:
            raise TaxRejected("a line has an empty line_id", idempotency_key=idempotency_key)
        if line.line_id in seen:
            raise TaxRejected(
                f"line_id {line.line_id!r} appears twice", idempotency_key=idempotency_key
            )
        seen.add(line.line_id)
        if not isinstance(line.amount, Decimal) or not line.amount.is_finite():
            raise TaxRejected(
                f"amount of line {line.line_id!r} is not a finite Decimal: {line.amount!r}",
                idempotency_key=idempotency_key,
            )


# --------------------------------------------------------------------------- the fake engine


@dataclass(frozen=True)
class DocumentAnswer:
    """The answer to one document request: ``replay`` is true when it was a stored one."""

    document_id: str
    idempotency_key: str
    lines: tuple[TaxedLine, ...]
    replay: bool


@dataclass(frozen=True)
class _Stored:
    fingerprint: str
    answer: DocumentAnswer


class TaxLedger:
    """The fake service's engine: the rate table plus its store of committed documents.

    Thread-safe. Used by :class:`InMemoryTaxService` and by the fake HTTP server,
    so both follow exactly the same rules:

    * ``commit=True``: a new key computes and stores the answer; the same key
      with the same content (:func:`document_fingerprint`) returns the stored
      answer (``replay=True``); the same key with other content is refused (409).
    * ``commit=False``: computes, stores nothing, never conflicts.
    """

    def __init__(self, *, max_lines: int = MAX_LINES_PER_REQUEST) -> None:
        self.max_lines = max_lines
        self._lock = threading.Lock()
        self._documents: dict[str, _Stored] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self._documents)

    def process(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool,
    ) -> DocumentAnswer:
        """Answer one document request (at most ``max_lines`` lines).

        Raises:
            TaxRejected: status 422 (no lines, invalid line, unknown product code),
                413 (too many lines) or 409 (same key, other content).
        """
        if not lines:
            raise TaxRejected("a document needs at least one line", status=422)
        if len(lines) > self.max_lines:
            raise TaxRejected(
                f"{len(lines)} lines in one document, at most {self.max_lines} allowed",
                status=413,
                idempotency_key=idempotency_key,
            )
        try:
            check_document(idempotency_key, customer_id, lines)
        except TaxRejected as exc:
            raise TaxRejected(str(exc), status=422, idempotency_key=idempotency_key) from None
        fingerprint = document_fingerprint(customer_id, currency, lines)
        taxed = tuple(self._tax_line(line) for line in lines)
        with self._lock:
            stored = self._documents.get(idempotency_key) if commit else None
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    raise TaxRejected(
                        f"idempotency key {idempotency_key!r} was committed with other content",
                        status=409,
                        idempotency_key=idempotency_key,
                    )
                return DocumentAnswer(
                    stored.answer.document_id, idempotency_key, stored.answer.lines, True
                )
            answer = DocumentAnswer(f"doc_{uuid.uuid4().hex}", idempotency_key, taxed, False)
            if commit:
                self._documents[idempotency_key] = _Stored(fingerprint, answer)
            return answer

    @staticmethod
    def _tax_line(line: TaxLine) -> TaxedLine:
        applied = rate_for(line.region_id, line.tax_code)
        return TaxedLine(
            line_id=line.line_id,
            tax_code=applied.tax_code,
            rate=applied.rate,
            tax=tax_of(line.amount, applied.rate),
        )


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
    """:class:`TaxService` in memory, for unit tests of other components.

    Same rate table, chunking (``key:i``) and idempotency rules as the fake HTTP
    service (both run :class:`TaxLedger`). ``calls`` lists every request in order;
    :meth:`fail_next` makes the next requests raise, to test callers' error paths.
    """

    def __init__(
        self,
        *,
        max_lines_per_request: int = MAX_LINES_PER_REQUEST,
        ledger: TaxLedger | None = None,
    ) -> None:
        self.max_lines_per_request = max_lines_per_request
        self.ledger = ledger or TaxLedger(max_lines=max_lines_per_request)
        self.calls: list[RecordedCall] = []
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
        """The rate the service applies to ``(region_id, tax_code)``; see :func:`rate_for`."""
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
        """See :class:`TaxService`. Raises :class:`TaxRejected` (409/413/422, or ``None``
        for a document refused before sending) and injected errors."""
        check_document(idempotency_key, customer_id, lines)
        results: list[TaxedLine] = []
        for index, chunk in enumerate(_chunks(lines, self.max_lines_per_request)):
            key = chunk_key(idempotency_key, index)
            with self._lock:
                failure = self._failures.pop(0) if self._failures else None
            if failure is not None:
                self._record(key, customer_id, len(chunk), commit, "error")
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


# --------------------------------------------------------------------------- metrics

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


# --------------------------------------------------------------------------- cache


RateKey = tuple[str | None, str | None]


class RedisTaxCache:
    """Committed tax results and rates in Redis. Every method swallows Redis errors
    (logged, counted in ``invoicing_tax_cache_errors_total``) and then behaves as a miss.

    Keys (``prefix`` default ``invoicing:tax:``)::

        {prefix}doc:{idempotency_key}          JSON {"fingerprint", "lines": [[id, code, rate, tax]]}
        {prefix}rate:["region"|null,"code"|null] JSON {"tax_code", "rate"}

    Both expire after ``ttl_s`` seconds. A document entry is used only when its
    fingerprint equals the request's, so a conflicting document still reaches the
    service (and gets its 409). Pass a client with a short ``socket_timeout``
    (settings ``redis.socket_timeout_s``), so that a dead Redis costs little.
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
                    rate=_decimal_text(rate, "rate"),
                    tax=_decimal_text(tax, "tax"),
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
                found[key] = Rate(str(entry["tax_code"]), _decimal_text(entry["rate"], "rate"))
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


def _decimal_text(value: object, what: str) -> Decimal:
    """A finite Decimal from a JSON *string*; numbers and anything else are refused."""
    if not isinstance(value, str):
        raise InvalidAmount(f"{what} must be a decimal string, not {type(value).__name__}")
    return parse_decimal(value, what=what)


# --------------------------------------------------------------------------- HTTP client

_RETRYABLE_STATUS = frozenset({408, 429}) | frozenset(range(500, 600))


class HttpTaxService:
    """:class:`TaxService` over HTTP (see the module docstring for the rules).

    Args:
        settings: url, timeouts (seconds), ``max_attempts`` (first included),
            backoff ``backoff_initial_s`` doubling up to ``backoff_max_s`` plus
            up to ``backoff_initial_s`` of jitter, ``max_concurrency``,
            ``max_lines_per_request``, ``cache_ttl_s``.
        cache: optional :class:`RedisTaxCache`.
        client: an ``httpx.Client`` to use instead of one built from settings
            (tests pass one with ``httpx.MockTransport``); closed by :meth:`close`
            only when built here.
        sleep: how retries wait (tests may pass a no-op); default ``time.sleep``.

    Thread-safe: one object serves every worker thread of a process.
    """

    def __init__(
        self,
        settings: TaxSettings,
        *,
        cache: RedisTaxCache | None = None,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._settings = settings
        self._cache = cache
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
        """See :class:`TaxService`.

        Raises:
            TaxUnavailable: a request still failed transiently after ``max_attempts``.
            TaxRejected: 4xx other than 408/429, an invalid answer, or an invalid
                document (status ``None``, nothing sent).
        """
        check_document(idempotency_key, customer_id, lines)
        if not lines:
            return []
        fingerprint = document_fingerprint(customer_id, currency, lines)
        if self._cache is not None:
            if commit:
                cached = self._cache.get_document(idempotency_key, fingerprint)
                if cached is not None and [t.line_id for t in cached] == [
                    ln.line_id for ln in lines
                ]:
                    logger.debug("tax document %s answered from the cache", idempotency_key)
                    return cached
            else:
                quoted = self._quote_from_cached_rates(lines)
                if quoted is not None:
                    return quoted
        results: list[TaxedLine] = []
        for index, chunk in enumerate(_chunks(lines, self._settings.max_lines_per_request)):
            results.extend(
                self._send(chunk_key(idempotency_key, index), customer_id, currency, chunk, commit)
            )
        if self._cache is not None:
            self._cache.put_rates(
                {
                    (ln.region_id, ln.tax_code): Rate(t.tax_code, t.rate)
                    for ln, t in zip(lines, results, strict=True)
                }
            )
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
            data, _ = self._exchange(None, lambda: self._client.get("/v1/rates", params=params))
            try:
                if not isinstance(data, dict):
                    raise InvalidAmount("not a JSON object")
                found = Rate(str(data["tax_code"]), _decimal_text(data["rate"], "rate"))
            except (KeyError, InvalidAmount) as exc:
                TAX_REQUESTS.labels(outcome="invalid_answer").inc()
                raise TaxRejected(f"invalid answer to the {what}: {exc}", status=200) from None
            TAX_REQUESTS.labels(outcome="ok").inc()
            return found

        found = self._with_retries(what, None, attempt)
        if self._cache is not None:
            self._cache.put_rates({key: found})
        return found

    # ----------------------------------------------------------------- internals

    def _quote_from_cached_rates(self, lines: Sequence[TaxLine]) -> list[TaxedLine] | None:
        assert self._cache is not None
        keys = [(ln.region_id, ln.tax_code) for ln in lines]
        rates = self._cache.get_rates(keys)
        if len(rates) < len(set(keys)):
            return None
        logger.debug("tax quote of %d lines computed from cached rates", len(lines))
        return [
            TaxedLine(
                ln.line_id, rates[k].tax_code, rates[k].rate, tax_of(ln.amount, rates[k].rate)
            )
            for ln, k in zip(lines, keys, strict=True)
        ]

    def _send(
        self,
        key: str,
        customer_id: str,
        currency: str,
        chunk: Sequence[TaxLine],
        commit: bool,
    ) -> list[TaxedLine]:
        body = json.dumps(
            {
                "idempotency_key": key,
                "customer_id": customer_id,
                "currency": currency,
                "commit": commit,
                "lines": [
                    {
                        "line_id": ln.line_id,
                        "amount": format(ln.amount, "f"),
                        "region_id": ln.region_id,
                        "tax_code": ln.tax_code,
                    }
                    for ln in chunk
                ],
            },
            ensure_ascii=False,
        ).encode("utf-8")
        headers = {"content-type": "application/json", "idempotency-key": key}

        def attempt() -> list[TaxedLine]:
            data, replay = self._exchange(
                key, lambda: self._client.post("/v1/documents", content=body, headers=headers)
            )
            taxed = _parse_answer(key, chunk, data)
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
        replay = response.headers.get("idempotent-replayed", "").lower() == "true"
        return data, replay


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
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


def _parse_answer(key: str, chunk: Sequence[TaxLine], data: Any) -> list[TaxedLine]:
    """Validate a document answer: every requested line answered exactly once, decimals
    as strings. Returns the lines in request order.

    Raises:
        TaxRejected: status 200 and what is wrong.
    """

    def invalid(reason: str) -> TaxRejected:
        TAX_REQUESTS.labels(outcome="invalid_answer").inc()
        return TaxRejected(f"invalid answer to {key}: {reason}", status=200, idempotency_key=key)

    if not isinstance(data, dict) or not isinstance(data.get("lines"), list):
        raise invalid("not an object with a 'lines' list")
    if data.get("idempotency_key") != key:
        raise invalid(f"answer is for key {data.get('idempotency_key')!r}")
    by_id: dict[str, TaxedLine] = {}
    for item in data["lines"]:
        if not isinstance(item, dict):
            raise invalid("a line is not an object")
        line_id = item.get("line_id")
        tax_code = item.get("tax_code")
        if not isinstance(line_id, str) or not isinstance(tax_code, str) or not tax_code:
            raise invalid(f"line {line_id!r} lacks a line_id or tax_code string")
        if line_id in by_id:
            raise invalid(f"line {line_id!r} answered twice")
        try:
            by_id[line_id] = TaxedLine(
                line_id=line_id,
                tax_code=tax_code,
                rate=_decimal_text(item.get("rate"), "rate"),
                tax=_decimal_text(item.get("tax"), "tax"),
            )
        except InvalidAmount as exc:
            raise invalid(f"line {line_id!r}: {exc}") from None
    requested = [ln.line_id for ln in chunk]
    if set(by_id) != set(requested):
        missing = sorted(set(requested) - set(by_id))[:5]
        extra = sorted(set(by_id) - set(requested))[:5]
        raise invalid(f"lines missing {missing}, unexpected {extra}")
    return [by_id[line_id] for line_id in requested]
