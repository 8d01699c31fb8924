"""The tax service's HTTP API as both ends see it: shapes, limits and the rules both apply.

Shared by the client (:mod:`streams.adapters.tax.client`), the fake service
(:mod:`streams.devtools.stack.fake_tax`) and the in-memory twin
(:mod:`streams.adapters.memory.tax`), so that none of them imports another.
Standard library plus :mod:`streams.core.domain` and :mod:`streams.core.billing.ports` only.

API (JSON bodies; money and rates are decimal **strings**, JSON numbers are refused)::

    POST /v1/documents            header Idempotency-Key: <key>
    request  {"idempotency_key": str, "customer_id": str, "currency": "USD", "commit": bool,
              "lines": [{"line_id": str, "amount": "12.50", "region_id": str|null,
                         "tax_code": str|null}]}                      (1..1000 lines)
    200      {"document_id": str, "idempotency_key": str,
              "lines": [{"line_id", "tax_code": "US-WA-STD", "rate": "0.065", "tax": "0.8125"}]}
             header Idempotent-Replayed: true when it is a stored answer
    409 key committed with other content   413 too many lines   422 invalid request
    408/429/5xx transient (Retry-After honoured)

    GET /v1/rates?region_id=..&tax_code=..   200 {"region_id", "tax_code", "rate"}

    errors   {"error": {"code": str, "message": str}}

Chunking: a document of more than :data:`MAX_LINES_PER_REQUEST` lines is sent as
several requests; request ``i`` (0-based) carries the key :func:`chunk_key`
``f"{key}:{i}"``.
"""

from __future__ import annotations

import decimal
import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from streams.core.billing.ports import Rate, TaxRejected
from streams.core.domain.invoice import TaxedLine, TaxLine
from streams.core.domain.money import InvalidAmount, parse_decimal
from streams.errors import InvoicingError

__all__ = [
    "DOCUMENTS_PATH",
    "IDEMPOTENCY_KEY_HEADER",
    "MAX_LINES_PER_REQUEST",
    "RATES_PATH",
    "REPLAYED_HEADER",
    "DocumentRequest",
    "InvalidAnswer",
    "InvalidRequest",
    "check_document",
    "chunk_key",
    "chunks",
    "decimal_text",
    "document_answer_body",
    "document_fingerprint",
    "error_body",
    "error_message",
    "parse_document_answer",
    "parse_document_request",
    "parse_rate_answer",
    "rate_answer_body",
    "tax_of",
]

#: The service's limit on lines per document request (docs/design.md "Tax service").
MAX_LINES_PER_REQUEST = 1000

DOCUMENTS_PATH = "/v1/documents"
RATES_PATH = "/v1/rates"
#: Request header carrying the request's idempotency key (also in the body).
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
#: Answer header set to ``true`` when the answer is a stored one (a replay).
REPLAYED_HEADER = "Idempotent-Replayed"


# --------------------------------------------------------------------------- rules both ends apply


def chunk_key(idempotency_key: str, index: int) -> str:
    """Idempotency key of request ``index`` (0-based) of a document: ``f"{key}:{index}"``."""
    return f"{idempotency_key}:{index}"


def chunks(lines: Sequence[TaxLine], size: int) -> Iterator[Sequence[TaxLine]]:
    """``lines`` in consecutive slices of at most ``size`` (nothing for no lines)."""
    for start in range(0, len(lines), size):
        yield lines[start : start + size]


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


def _canonical_amount(amount: Decimal) -> str:
    """A context-free canonical text of a Decimal's value: ``1.50`` and ``1.5`` agree."""
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def document_fingerprint(customer_id: str, currency: str, lines: Sequence[TaxLine]) -> str:
    """SHA-256 (hex) of a document's content: customer, currency and every line
    (id, amount by value, region, product code), in order. Same content → same
    fingerprint; the service compares it on a replay, the client's cache on a hit."""
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


def decimal_text(value: object, what: str) -> Decimal:
    """A finite Decimal from a JSON *string*; numbers and anything else are refused.

    Raises:
        InvalidAmount: not a string, or not a finite decimal.
    """
    if not isinstance(value, str):
        raise InvalidAmount(f"{what} must be a decimal string, not {type(value).__name__}")
    return parse_decimal(value, what=what)


# --------------------------------------------------------------------------- document request


@dataclass(frozen=True)
class DocumentRequest:
    """One ``POST /v1/documents`` request: at most :data:`MAX_LINES_PER_REQUEST` lines."""

    idempotency_key: str
    customer_id: str
    currency: str
    commit: bool
    lines: Sequence[TaxLine]

    def body(self) -> bytes:
        """The JSON body (UTF-8): amounts as plain decimal strings (``1E-12`` →
        ``"0.000000000001"``)."""
        return json.dumps(
            {
                "idempotency_key": self.idempotency_key,
                "customer_id": self.customer_id,
                "currency": self.currency,
                "commit": self.commit,
                "lines": [
                    {
                        "line_id": ln.line_id,
                        "amount": format(ln.amount, "f"),
                        "region_id": ln.region_id,
                        "tax_code": ln.tax_code,
                    }
                    for ln in self.lines
                ],
            },
            ensure_ascii=False,
        ).encode("utf-8")


class InvalidRequest(InvoicingError):
    """A request body the service refuses: ``status`` 422 (or 413 for too many lines),
    an error ``code`` and ``message`` for the error body, and what could be read of
    the request (for the service's records)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.idempotency_key: str | None = None
        self.customer_id: str | None = None
        self.line_count = 0


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | Decimal):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _optional_text(item: dict[str, Any], name: str, where: str) -> str | None:
    value = item.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(422, "invalid_request", f"{where}.{name} must be a string or null")
    return value


def parse_document_request(raw: bytes, max_lines: int) -> DocumentRequest:
    """Parse and check a document request body (the service's side).

    Raises:
        InvalidRequest: 422 for malformed JSON or fields (a JSON number as amount
            included), 413 for more than ``max_lines`` lines.
    """
    try:
        body = json.loads(raw, parse_float=Decimal)
    except ValueError as exc:
        raise InvalidRequest(422, "invalid_json", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest(422, "invalid_request", "body must be a JSON object")
    try:
        return _check_request(body, max_lines)
    except InvalidRequest as exc:
        key, customer, lines = (
            body.get("idempotency_key"),
            body.get("customer_id"),
            body.get("lines"),
        )
        exc.idempotency_key = key if isinstance(key, str) else None
        exc.customer_id = customer if isinstance(customer, str) else None
        exc.line_count = len(lines) if isinstance(lines, list) else 0
        raise


def _check_request(body: dict[str, Any], max_lines: int) -> DocumentRequest:
    key = body.get("idempotency_key")
    customer = body.get("customer_id")
    currency = body.get("currency")
    commit = body.get("commit")
    lines = body.get("lines")
    if not isinstance(key, str) or not key or len(key) > 512:
        raise InvalidRequest(422, "invalid_request", "idempotency_key must be a non-empty string")
    if not isinstance(customer, str) or not customer:
        raise InvalidRequest(422, "invalid_request", "customer_id must be a non-empty string")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise InvalidRequest(422, "invalid_request", "currency must be a 3-letter code")
    if not isinstance(commit, bool):
        raise InvalidRequest(422, "invalid_request", "commit must be true or false")
    if not isinstance(lines, list):
        raise InvalidRequest(422, "invalid_request", "lines must be a list")
    if len(lines) > max_lines:
        raise InvalidRequest(
            413, "too_many_lines", f"{len(lines)} lines in one document, at most {max_lines}"
        )
    parsed: list[TaxLine] = []
    for index, item in enumerate(lines):
        where = f"lines[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(422, "invalid_request", f"{where} must be an object")
        line_id = item.get("line_id")
        amount = item.get("amount")
        if not isinstance(line_id, str) or not line_id:
            raise InvalidRequest(
                422, "invalid_request", f"{where}.line_id must be a non-empty string"
            )
        if not isinstance(amount, str):
            raise InvalidRequest(
                422,
                "invalid_amount",
                f"{where}.amount must be a decimal string, not a JSON {_json_type(amount)}",
            )
        try:
            value = Decimal(amount.strip())
        except InvalidOperation:
            raise InvalidRequest(
                422, "invalid_amount", f"{where}.amount {amount!r} is not a decimal"
            ) from None
        if not value.is_finite():
            raise InvalidRequest(422, "invalid_amount", f"{where}.amount {amount!r} is not finite")
        parsed.append(
            TaxLine(
                line_id=line_id,
                amount=value,
                region_id=_optional_text(item, "region_id", where),
                tax_code=_optional_text(item, "tax_code", where),
            )
        )
    return DocumentRequest(key, customer, currency.upper(), commit, parsed)


# --------------------------------------------------------------------------- answers


class InvalidAnswer(InvoicingError, ValueError):
    """An answer the client cannot use (the reason is the message)."""


def document_answer_body(
    document_id: str, idempotency_key: str, lines: Sequence[TaxedLine]
) -> dict[str, Any]:
    """The JSON object of a 200 answer to a document request (decimals as strings)."""
    return {
        "document_id": document_id,
        "idempotency_key": idempotency_key,
        "lines": [
            {"line_id": t.line_id, "tax_code": t.tax_code, "rate": str(t.rate), "tax": str(t.tax)}
            for t in lines
        ],
    }


def parse_document_answer(key: str, chunk: Sequence[TaxLine], data: Any) -> list[TaxedLine]:
    """Validate the decoded answer to request ``key`` of ``chunk`` (the client's side):
    every requested line answered exactly once, decimals as strings. Returns the
    lines in request order.

    Raises:
        InvalidAnswer: what is wrong.
    """
    if not isinstance(data, dict) or not isinstance(data.get("lines"), list):
        raise InvalidAnswer("not an object with a 'lines' list")
    if data.get("idempotency_key") != key:
        raise InvalidAnswer(f"answer is for key {data.get('idempotency_key')!r}")
    by_id: dict[str, TaxedLine] = {}
    for item in data["lines"]:
        if not isinstance(item, dict):
            raise InvalidAnswer("a line is not an object")
        line_id = item.get("line_id")
        tax_code = item.get("tax_code")
        if not isinstance(line_id, str) or not isinstance(tax_code, str) or not tax_code:
            raise InvalidAnswer(f"line {line_id!r} lacks a line_id or tax_code string")
        if line_id in by_id:
            raise InvalidAnswer(f"line {line_id!r} answered twice")
        try:
            by_id[line_id] = TaxedLine(
                line_id=line_id,
                tax_code=tax_code,
                rate=decimal_text(item.get("rate"), "rate"),
                tax=decimal_text(item.get("tax"), "tax"),
            )
        except InvalidAmount as exc:
            raise InvalidAnswer(f"line {line_id!r}: {exc}") from None
    requested = [ln.line_id for ln in chunk]
    if set(by_id) != set(requested):
        missing = sorted(set(requested) - set(by_id))[:5]
        extra = sorted(set(by_id) - set(requested))[:5]
        raise InvalidAnswer(f"lines missing {missing}, unexpected {extra}")
    return [by_id[line_id] for line_id in requested]


def rate_answer_body(region_id: str | None, rate: Rate) -> dict[str, Any]:
    """The JSON object of a 200 answer to ``GET /v1/rates``."""
    return {"region_id": region_id, "tax_code": rate.tax_code, "rate": str(rate.rate)}


def parse_rate_answer(data: Any) -> Rate:
    """The :class:`~streams.core.billing.ports.Rate` of a decoded rate answer.

    Raises:
        InvalidAnswer: not an object, a field missing, or the rate not a decimal string.
    """
    try:
        if not isinstance(data, dict):
            raise InvalidAmount("not a JSON object")
        return Rate(str(data["tax_code"]), decimal_text(data["rate"], "rate"))
    except (KeyError, InvalidAmount) as exc:
        raise InvalidAnswer(str(exc)) from None


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON object of an error answer."""
    return {"error": {"code": code, "message": message}}


def error_message(data: Any) -> str | None:
    """The message of a decoded error body, or ``None`` if it is not one."""
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return None
