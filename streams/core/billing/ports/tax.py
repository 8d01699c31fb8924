"""The tax service's port and the tax cache's, with their errors (transient
:class:`TaxUnavailable`, permanent :class:`TaxRejected`) and the rate values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol

from streams.core.domain.invoice import TaxedLine, TaxLine
from streams.errors import InvoicingError


class TaxError(InvoicingError):
    """Root of the tax port's exceptions.

    Attributes:
        status: HTTP status of the last answer, ``None`` when there was none
            (timeout, connection error, refused before sending).
        idempotency_key: key of the request that failed (``key:i`` for chunk ``i``).
        attempts: attempts made for that request (0 = refused before sending).
        retry_after_s: seconds the service asked us to wait (``Retry-After``), if it did.

    Tree::

        TaxError
        ├── TaxUnavailable   transient: retries exhausted (timeouts, connection errors,
        │                    408/429/5xx) — retry the job later, do not dead-letter
        └── TaxRejected      permanent: 4xx (409 conflict, 413 too large, 422 invalid)
                             or an invalid answer — the same document fails again
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
        self.retry_after_s = retry_after_s


class TaxUnavailable(TaxError):
    """Transient: the service did not answer usably within the attempts allowed.
    The same document may succeed later (same idempotency key)."""


class TaxRejected(TaxError):
    """Permanent: the service refused the document (4xx) or answered something
    invalid, or the document is invalid before sending. Retrying fails again."""


@dataclass(frozen=True)
class Rate:
    """The code and rate applied to a line: ``tax_code`` like ``US-WA-STD``, ``rate`` a
    fraction (``Decimal("0.065")`` = 6.5 %)."""

    tax_code: str
    rate: Decimal


#: What a rate depends on: ``(region_id, product tax code)``, either ``None``.
RateKey = tuple[str | None, str | None]


class TaxService(Protocol):
    """The tax service: the tax of each line of one document (docs/design.md "Tax service").

    ``calculate(idempotency_key=…, customer_id=…, currency=…, lines=…, commit=True)``
    returns one :class:`~streams.core.domain.invoice.TaxedLine` per input line, in input
    order; ``tax`` is ``amount * rate`` exactly (``Decimal`` in the currency's units,
    never rounded: rounding is the invoice's, :mod:`streams.core.domain.invoice`), the
    ``rate`` a fraction. No lines → ``[]`` without a call.

    Idempotency: ``commit=True`` records the document under its key, so the same key
    with the same content (amounts compared by value) answers the same lines again and
    taxes nothing twice; the same key with other content is refused (409,
    :class:`TaxRejected`). ``commit=False`` is a quote: nothing is stored, nothing
    conflicts. The key is the invoice id and revision.

    Size: a document of more than 1,000 lines goes out as requests of at most 1,000
    lines (``max_lines_per_request``); request ``i`` carries the key ``f"{key}:{i}"``
    (:func:`streams.adapters.tax.wire.chunk_key`), so a retried document replays the
    requests that were already committed.

    Synchronous and thread-safe: called from the workers' job threads.

    Raises:
        TaxUnavailable: transient (timeouts, connection errors, 408/429/5xx after the
            allowed attempts): retry the job later with the same key.
        TaxRejected: permanent: the document is invalid (``status`` ``None`` when
            refused before sending; 422 for an unknown product tax code), too large
            (413), conflicts with what the key committed (409), or the answer was
            invalid (200).
    """

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        """Tax of each line, in input order (see the class docstring)."""
        ...


class TaxCache(Protocol):
    """The tax client's cache: committed answers by idempotency key, and rates by
    :data:`RateKey`, each kept ``ttl_s`` seconds after it was written.

    A cache is an optimisation only: an unavailable cache (Redis down, an entry that does not
    decode) **is a miss** — no method raises; a ``put`` that fails is forgotten. So the cache can
    slow the system down, never make it wrong (docs/design.md "Redis leases").

    ``fingerprint`` is :func:`streams.adapters.tax.wire.document_fingerprint` of the
    document: a stored answer is returned only for the same key *and* the same
    content, so a conflicting document still reaches the service (and gets its 409).
    """

    def get_document(self, idempotency_key: str, fingerprint: str) -> list[TaxedLine] | None:
        """The committed answer stored for this key and content, in stored order, or
        ``None`` (absent, expired, other fingerprint, cache unavailable)."""
        ...

    def put_document(
        self, idempotency_key: str, fingerprint: str, lines: Sequence[TaxedLine]
    ) -> None:
        """Store a committed answer under its key (replacing any entry; expires after
        ``ttl_s``). Decimals are kept exactly."""
        ...

    def get_rates(self, keys: Iterable[RateKey]) -> dict[RateKey, Rate]:
        """The cached rates among ``keys``; missing (or expired) ones are absent;
        ``{}`` when the cache is unavailable."""
        ...

    def put_rates(self, rates: Mapping[RateKey, Rate]) -> None:
        """Store rates (each replacing any entry, expiring after ``ttl_s``)."""
        ...
