"""The fake tax service's engine: its rate table and its store of committed documents.

Used by the fake HTTP server (:mod:`streams.devtools.stack.fake_tax.server`) and by the
in-memory twin of the tax port (:mod:`streams.adapters.memory.tax`), so both
compute the same answers and follow the same idempotency rules. Production code
does not import it: the real client learns rates from the service's answers.

The rate table (:data:`JURISDICTIONS`) is illustrative, not tax advice: a cloud
region id (AWS and Azure names of the FOCUS sample) maps to a jurisdiction and
its standard rate; unknown ``us-*``/``eu-*``/``ap-*`` regions by prefix;
``None``, ``"global"`` and anything else to ``GLOBAL`` at 5 %. Product tax codes:
``STD`` (the default) and ``EXEMPT`` (zero).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from streams.adapters.tax.wire import (
    MAX_LINES_PER_REQUEST,
    check_document,
    document_fingerprint,
    tax_of,
)
from streams.core.billing.ports import Rate, TaxRejected
from streams.core.domain.invoice import TaxedLine, TaxLine

__all__ = [
    "DEFAULT_JURISDICTION",
    "JURISDICTIONS",
    "PRODUCT_TAX_CODES",
    "DocumentAnswer",
    "Jurisdiction",
    "TaxLedger",
    "jurisdiction_of",
    "rate_for",
]


@dataclass(frozen=True)
class Jurisdiction:
    """A tax jurisdiction of the fake service: code prefix (``US-WA``) and standard rate."""

    code: str
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

    Thread-safe. Used by the in-memory twin and by the fake HTTP server, so both
    follow exactly the same rules:

    * ``commit=True``: a new key computes and stores the answer; the same key
      with the same content (:func:`~streams.adapters.tax.wire.document_fingerprint`)
      returns the stored answer (``replay=True``); the same key with other content
      is refused (409).
    * ``commit=False``: computes, stores nothing, never conflicts.
    """

    def __init__(self, *, max_lines: int = MAX_LINES_PER_REQUEST) -> None:
        self.max_lines = max_lines
        self._lock = threading.Lock()
        self._documents: dict[str, _Stored] = {}
        #: jurisdiction code → standard rate replacing the table's (a rate change)
        self.rate_overrides: dict[str, Decimal] = {}

    def set_overrides(self, overrides: dict[str, str]) -> None:
        """Apply rate changes: jurisdiction code → standard rate (decimal text).

        Raises:
            ValueError: a rate that is not a decimal number between 0 and 1.
        """
        parsed: dict[str, Decimal] = {}
        for code, text in overrides.items():
            try:
                value = Decimal(text)
            except ArithmeticError:
                raise ValueError(f"rate override {code}={text!r} is not a decimal") from None
            if not value.is_finite() or not Decimal(0) <= value <= Decimal(1):
                raise ValueError(f"rate override {code}={text!r} is not between 0 and 1")
            parsed[code] = value
        self.rate_overrides = parsed

    def rate(self, region_id: str | None, tax_code: str | None = None) -> Rate:
        """:func:`rate_for`, with the standard rate of an overridden jurisdiction changed."""
        applied = rate_for(region_id, tax_code)
        jurisdiction = jurisdiction_of(region_id)
        override = self.rate_overrides.get(jurisdiction.code)
        if override is not None and applied.tax_code.endswith("-STD"):
            return Rate(tax_code=applied.tax_code, rate=override)
        return applied

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

    def _tax_line(self, line: TaxLine) -> TaxedLine:
        applied = self.rate(line.region_id, line.tax_code)
        return TaxedLine(
            line_id=line.line_id,
            tax_code=applied.tax_code,
            rate=applied.rate,
            tax=tax_of(line.amount, applied.rate),
        )
