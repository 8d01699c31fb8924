"""The HTTP API's contract: the bodies' JSON Schemas and the OpenAPI 3.1 document.

The usage view's ``GET /v1/customers/{id}/usage`` and the ingest edge's
``POST /v1/events`` (docs/usage-api.md); bodies are the models of
:mod:`streams.core.domain.http`, each rendered to ``schemas/http/<name>.schema.json``,
which the OpenAPI document (``schemas/http/openapi.yaml``) references.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from streams.core.domain.periods import PERIOD_PATTERN
from streams.devtools.schemas.files import API_VERSION, DRAFT, HTTP_FOLDER, ID_BASE


def http_models() -> dict[str, type[BaseModel]]:
    from streams.core.domain.http import CloudEventIn, IngestResponse, Problem, UsageResponse

    return {
        "usage-response": UsageResponse,
        "problem": Problem,
        "ingest-response": IngestResponse,
        "cloudevent": CloudEventIn,
    }


def http_schema(name: str, model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="serialization")
    return {
        **schema,
        "$schema": DRAFT,
        "$id": f"{ID_BASE}{HTTP_FOLDER}/{name}.schema.json",
        "title": schema.get("title", name),
    }


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.1 of the view's and the edge's HTTP API; bodies by reference to the
    JSON Schema files beside it."""

    def ref(name: str) -> dict[str, str]:
        return {"$ref": f"./{name}.schema.json"}

    problem = {"application/problem+json": {"schema": ref("problem")}}

    def problem_response(text: str) -> dict[str, Any]:
        return {"description": text, "content": problem}

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Invoicing pipeline: usage view and ingest edge",
            "version": API_VERSION,
            "description": "Usage to date and the upcoming invoice (provisional, before tax), "
            "and CloudEvents ingest to billing.account-events.v1. Guide: docs/usage-api.md.",
        },
        "paths": {
            "/v1/customers/{customer_id}/usage": {
                "get": {
                    "summary": "Usage to date and the upcoming invoice of a customer's period",
                    "description": "Any view instance answers; it forwards to the owner of the "
                    "customer's partition. Needs a key with the usage:read scope.",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "customer_id",
                            "in": "path",
                            "required": True,
                            "description": "Percent-encoded customer id ('/' as %2F).",
                            "schema": {"type": "string"},
                        },
                        {
                            "name": "period",
                            "in": "query",
                            "required": False,
                            "description": "YYYY-MM (default: the current UTC month).",
                            "schema": {"type": "string", "pattern": PERIOD_PATTERN},
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "The usage and the rated preview",
                            "content": {"application/json": {"schema": ref("usage-response")}},
                        },
                        "400": problem_response("Bad period"),
                        "401": problem_response("No valid bearer API key"),
                        "403": problem_response("The key has no usage:read scope"),
                        "404": problem_response("No event of this customer reached the view"),
                        "502": problem_response("The named owner is not an instance of the group"),
                        "503": problem_response(
                            "The view is rebalancing or the owner is unreachable"
                        ),
                        "504": problem_response("The owner did not answer in time"),
                        "508": problem_response("A forwarded request met a stale assignment"),
                    },
                }
            },
            "/v1/events": {
                "post": {
                    "summary": "CloudEvents (structured JSON), one or a batch",
                    "security": [{"bearer": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/cloudevents+json": {"schema": ref("cloudevent")},
                            "application/cloudevents-batch+json": {
                                "schema": {"type": "array", "items": ref("cloudevent")}
                            },
                        },
                    },
                    "responses": {
                        "200": {
                            "description": "Every event accepted (delivered) or a duplicate",
                            "content": {"application/json": {"schema": ref("ingest-response")}},
                        },
                        "207": {
                            "description": "Some events rejected, each with its error",
                            "content": {"application/json": {"schema": ref("ingest-response")}},
                        },
                        "400": problem_response("Malformed body or event"),
                        "401": problem_response("No valid bearer API key"),
                        "403": problem_response(
                            "Event type not accepted at the edge, or the event is outside its "
                            "API key's scope (type .../problems/out-of-scope)"
                        ),
                        "409": problem_response("Event id reused with other content"),
                        "413": problem_response("Body or batch too large"),
                        "415": problem_response("Another media type"),
                        "422": problem_response("Event data invalid"),
                        "429": problem_response(
                            "The key is over its rate limit or its requests in flight (Retry-After)"
                        ),
                        "503": problem_response(
                            "The edge is over its requests in flight, or the producer's "
                            "queue is full: not produced (Retry-After)"
                        ),
                        "504": problem_response(
                            "The broker did not confirm delivery in time: outcome unknown "
                            "(type .../problems/outcome-unknown, Retry-After)"
                        ),
                    },
                }
            },
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
