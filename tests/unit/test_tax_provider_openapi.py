"""schemas/http/tax-provider.openapi.yaml (docs/tax-provider.md) names what the client
really sends and handles, so the hand-written contract cannot silently drift."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from streams.adapters.tax import client, wire
from streams.core.domain.invoice import TaxedLine, TaxLine

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "schemas" / "http" / "tax-provider.openapi.yaml"


def _document() -> dict[str, Any]:
    loaded = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def _schema(name: str) -> dict[str, Any]:
    """A component schema with its ``$ref``s resolvable (the document as root)."""
    document = _document()
    return {**document, "$ref": f"#/components/schemas/{name}"}


def test_parses_as_openapi_3_1_with_the_clients_routes() -> None:
    document = _document()
    assert document["openapi"] == "3.1.0"
    assert set(document["paths"]) == {wire.DOCUMENTS_PATH, wire.RATES_PATH}
    assert set(document["paths"][wire.DOCUMENTS_PATH]) == {"post"}
    assert set(document["paths"][wire.RATES_PATH]) == {"get"}


def test_names_every_status_the_client_handles() -> None:
    paths = _document()["paths"]
    documents = paths[wire.DOCUMENTS_PATH]["post"]["responses"]
    rates = paths[wire.RATES_PATH]["get"]["responses"]
    assert {"200", "409", "413", "422", "429", "503"} <= set(documents)
    assert {"200", "422", "429", "503"} <= set(rates)
    transient_ref = {"$ref": "#/components/responses/Transient"}
    for responses in (documents, rates):
        for status, response in responses.items():
            # A status documented as transient is one the client retries, and back.
            assert (response == transient_ref) == (int(status) in client._RETRYABLE_STATUS), status
    transient = _document()["components"]["responses"]["Transient"]
    assert "Retry-After" in transient["headers"]


def test_names_the_headers_the_client_sends_and_reads() -> None:
    post = _document()["paths"][wire.DOCUMENTS_PATH]["post"]
    assert [p["name"] for p in post["parameters"] if p["in"] == "header"] == [
        wire.IDEMPOTENCY_KEY_HEADER
    ]
    assert wire.REPLAYED_HEADER in post["responses"]["200"]["headers"]
    rate_params = _document()["paths"][wire.RATES_PATH]["get"]["parameters"]
    assert {p["name"] for p in rate_params} == {"region_id", "tax_code"}


def test_the_clients_request_body_is_valid_and_numbers_are_not() -> None:
    request = wire.DocumentRequest(
        "inv-1:0",
        "cust-1",
        "USD",
        True,
        [
            TaxLine("l1", Decimal("1E-12"), "US-WA", None),
            TaxLine("l2", Decimal("12.50"), None, "SW"),
        ],
    )
    body = json.loads(request.body())
    validator = Draft202012Validator(_schema("DocumentRequest"))
    assert list(validator.iter_errors(body)) == []
    body["lines"][0]["amount"] = 12.5
    assert list(validator.iter_errors(body)) != []


def test_the_fakes_answers_are_valid() -> None:
    answer = wire.document_answer_body(
        "doc_1", "inv-1:0", [TaxedLine("l1", "US-WA-STD", Decimal("0.065"), Decimal("0.8125"))]
    )
    assert list(Draft202012Validator(_schema("DocumentAnswer")).iter_errors(answer)) == []
    rate = wire.rate_answer_body("US-WA", wire.parse_rate_answer({"tax_code": "X", "rate": "0.1"}))
    assert list(Draft202012Validator(_schema("RateAnswer")).iter_errors(rate)) == []
    error = wire.error_body("conflict", "committed with other content")
    assert list(Draft202012Validator(_schema("Error")).iter_errors(error)) == []
