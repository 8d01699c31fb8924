"""JSON Schema files of every topic's key and value, generated from the event models.

One place per contract (CONVENTIONS §3): the pydantic models in
:mod:`streams.domain.events` are the source; ``schemas/`` holds what they render
to, committed so that other teams can read the contracts without Python.
``tests/unit/test_schemas.py`` fails when a committed file differs.

Layout (paths relative to the ``schemas/`` folder)::

    asyncapi.yaml                      AsyncAPI 3.0 document: channels (topics), messages
                                       (one per event type), keys, headers, Kafka bindings;
                                       it ``$ref``s the files below
    <topic>/key.schema.json            the record key: the customer id (a string)
    <topic>/headers.schema.json        the record headers (UTF-8 text values)
    <topic>/<event type>.schema.json   the record value of one event type
    <dlq topic>/README.md              a dead-letter topic has no value schema
    price-book/price-book.schema.json  a price book document (YAML), from the models of
                                       streams.domain.rating.book (not a topic)

The value of an account or invoice event is the event's ``data`` as JSON
(CloudEvents binary content mode); the CloudEvents attributes travel as
``ce_*`` headers (:mod:`streams.domain.codec`). Files are JSON Schema draft
2020-12, serialization mode (money and quantities are decimal *strings*),
rendered with sorted keys, 2-space indent and a trailing newline, so the same
models always give the same bytes.

Regenerate: ``python -m streams.schemas [schemas-folder]`` (default ``./schemas``), or
``invoicing schemas export``. Compatibility of a change against an earlier commit:
``invoicing schemas check-compat`` (:mod:`streams.schemas.compat`).
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter

from streams.domain.events import CODE_PATTERN, CustomerId, Envelope, EventData, event_models
from streams.domain.periods import PERIOD_PATTERN
from streams.domain.rating.book import price_book_json_schema
from streams.settings import KafkaSettings
from streams.topics import (
    ACCOUNT_EVENTS_DLQ,
    DEAD_LETTER_TOPICS,
    INVOICES,
    INVOICES_DLQ,
    PRICE_BOOK,
    REGISTRY,
    TopicSpec,
)

#: Dialect of every generated schema.
DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: Base of the schemas' ``$id``: an identifier, not a download location (``.invalid``
#: never resolves, RFC 2606); a schema's ``$id`` is this base + its relative path.
ID_BASE = "https://invoicing-pipeline.invalid/schemas/"

KEY_FILE = "key.schema.json"
HEADERS_FILE = "headers.schema.json"
ASYNCAPI_FILE = "asyncapi.yaml"
PRICE_BOOK_FILE = "price-book/price-book.schema.json"

#: Version of the AsyncAPI specification the document follows.
ASYNCAPI_VERSION = "3.0.0"
#: Version of the document's API (``info.version``). Contracts are versioned per
#: topic (the ``.vN`` suffix); this changes only when the document's shape does.
API_VERSION = "1.0.0"
#: AsyncAPI Kafka bindings version (channel, message and operation bindings). Not
#: 0.5.0: the official AsyncAPI 3.0.0 JSON Schema (@asyncapi/specs 6.11.1) checks a
#: 0.5.0 message key with ``oneOf`` [Reference, Schema], so a ``$ref`` key matches
#: both and fails (the bug fixed for 0.4.0 in asyncapi/spec-json-schemas#466);
#: 0.4.0 has every field used here and validates with standard tooling.
KAFKA_BINDING_VERSION = "0.4.0"


def _dump(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _price_book_schema() -> dict[str, Any]:
    return {
        **price_book_json_schema(),
        "$schema": DRAFT,
        "$id": f"{ID_BASE}{PRICE_BOOK_FILE}",
        "title": "Price book",
    }


#: Folder of the HTTP bodies' schemas (the usage view and the ingest edge, issue 13).
HTTP_FOLDER = "http"
OPENAPI_FILE = f"{HTTP_FOLDER}/openapi.yaml"


def _http_models() -> dict[str, type[BaseModel]]:
    from streams.usage_view.models import CloudEventIn, IngestResponse, Problem, UsageResponse

    return {
        "usage-response": UsageResponse,
        "problem": Problem,
        "ingest-response": IngestResponse,
        "cloudevent": CloudEventIn,
    }


def _http_schema(name: str, model: type[BaseModel]) -> dict[str, Any]:
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
                    "customer's partition.",
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
                        "404": problem_response("No event of this customer reached the view"),
                        "503": problem_response(
                            "The view is rebalancing or the owner is unreachable"
                        ),
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
                        "403": problem_response("Event type not accepted at the edge"),
                        "409": problem_response("Event id reused with other content"),
                        "413": problem_response("Body or batch too large"),
                        "415": problem_response("Another media type"),
                        "422": problem_response("Event data invalid"),
                        "503": problem_response("The broker did not confirm delivery in time"),
                    },
                }
            },
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


def _entry_key_pattern() -> str:
    code = CODE_PATTERN.removeprefix("^").removesuffix("$")
    return f"^(metric/{code}|plan/{code}/[1-9][0-9]*)$"


def _key_schema(topic: str) -> dict[str, Any]:
    if topic == PRICE_BOOK.name:
        return {
            "type": "string",
            "pattern": _entry_key_pattern(),
            "maxLength": 128,
            "$schema": DRAFT,
            "$id": f"{ID_BASE}{topic}/{KEY_FILE}",
            "title": f"{topic} key",
            "description": (
                "Record key: the price book entry as UTF-8 text, metric/<metric code> or "
                "plan/<plan code>/<version>. It also is the CloudEvents subject (header "
                "ce_subject). Entries are immutable, so compaction keeps exactly the one "
                "record each key was published with."
            ),
        }
    return {
        **TypeAdapter(CustomerId).json_schema(mode="serialization"),
        "$schema": DRAFT,
        "$id": f"{ID_BASE}{topic}/{KEY_FILE}",
        "title": f"{topic} key",
        "description": (
            "Record key: the customer id as UTF-8 text. It also is the CloudEvents "
            "subject (header ce_subject) and the murmur2 partitioning key, so all "
            "of a customer's events share one partition."
        ),
    }


def _value_schema(topic: str, model: type[EventData]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="serialization")
    schema["$schema"] = DRAFT
    schema["$id"] = f"{ID_BASE}{topic}/{model.event_type}.schema.json"
    schema["title"] = f"{model.event_type} ({model.__name__})"
    schema["x-cloudevents-type"] = model.event_type
    schema["x-kafka-topic"] = topic
    return schema


#: Headers the Debezium outbox EventRouter adds on billing.invoices.v1 (see
#: connectors/outbox-connector.json): ``id`` is Debezium's own copy of the outbox
#: row id (= ``ce_id``); ``document_id`` comes from the outbox column of that name.
_INVOICE_EXTRA_HEADERS: dict[str, dict[str, Any]] = {
    "id": {
        "type": "string",
        "format": "uuid",
        "description": "Added by the Debezium outbox EventRouter: the outbox row id, equal to "
        "ce_id. Prefer ce_id.",
    },
    "document_id": {
        "type": "string",
        "format": "uuid",
        "description": "The document (invoice revision or credit note) the event is about: "
        "invoice_id for invoice.issued. The reconciliation command may republish a "
        "document under a new ce_id; document_id (with ce_type) stays the same, so "
        "deduplicate on it as well as on ce_id.",
    },
}

#: Headers the dead-letter publisher adds (streams/billing/dead_letters.py), all UTF-8 text.
_DLQ_HEADERS: dict[str, dict[str, Any]] = {
    "dlq.reason": {"type": "string", "minLength": 1, "description": "Why the record was refused."},
    "dlq.kind": {
        "type": "string",
        "minLength": 1,
        "description": "invalid (undecodable or invalid record), conflict (same event id, "
        "different payload) or rejected (a close marker whose invoice a permanent rule "
        "refused). Accept other values: kinds may be added.",
    },
    "dlq.source.topic": {"type": "string", "minLength": 1, "description": "Topic read from."},
    "dlq.source.partition": {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "Partition read from (decimal text).",
    },
    "dlq.source.offset": {
        "type": "string",
        "pattern": "^[0-9]+$",
        "description": "Offset of the refused record (decimal text).",
    },
    "dlq.consumer.group": {
        "type": "string",
        "minLength": 1,
        "description": "Consumer group that refused it.",
    },
    "dlq.failed_at": {
        "type": "string",
        "format": "date-time",
        "description": "When it was refused (UTC, ISO 8601).",
    },
}


def _cloudevents_headers(spec: TopicSpec) -> dict[str, dict[str, Any]]:
    """``ce_*`` and ``content-type`` headers from the :class:`Envelope` model's attributes."""
    envelope = Envelope.model_json_schema(mode="serialization")["properties"]
    types = [model.event_type for model in event_models(spec.event_types)]
    headers: dict[str, dict[str, Any]] = {}
    for attribute in ("specversion", "id", "source", "type", "time", "subject"):
        schema = {k: v for k, v in envelope[attribute].items() if k not in ("title", "default")}
        headers[f"ce_{attribute}"] = schema
    headers["ce_type"] = {"type": "string", "enum": types}
    content_type = envelope["datacontenttype"]
    headers["content-type"] = {
        k: v for k, v in content_type.items() if k not in ("title", "default")
    }
    notes = {
        "ce_specversion": "CloudEvents specification version.",
        "ce_id": "Event id: unique per event; a redelivery carries the same id. Deduplicate on it.",
        "ce_source": "Producer of the event (a URI reference, e.g. /invoicing/worker).",
        "ce_type": "Event type: selects the value schema.",
        "ce_time": "When the fact happened (UTC, RFC 3339).",
        "ce_subject": "The entry key (metric/<code>, plan/<code>/<version>); equals the record key."
        if spec.name == PRICE_BOOK.name
        else "The customer id; equals the record key.",
        "content-type": "Media type of the value (CloudEvents datacontenttype).",
    }
    for name, note in notes.items():
        headers[name]["description"] = note
    return headers


def _headers_schema(spec: TopicSpec) -> dict[str, Any]:
    """JSON Schema of ``spec``'s record headers, as a JSON object of name → UTF-8 text."""
    topic = spec.name
    pattern_properties: dict[str, Any] = {}
    if topic in DEAD_LETTER_TOPICS:
        source, refused_by = DEAD_LETTER_TOPICS[topic]
        properties = dict(_DLQ_HEADERS)
        required = sorted(_DLQ_HEADERS)
        description = (
            "Headers of a dead-lettered record: the original record's headers, unchanged "
            f"(usually the ce_* headers of {source}, but the record may "
            "have been refused precisely because they were missing or wrong), plus the "
            f"dlq.* headers added by {refused_by} that refused it."
        )
    else:
        properties = _cloudevents_headers(spec)
        required = sorted(properties)
        description = (
            "Record headers, each value UTF-8 text: the CloudEvents 1.0 Kafka protocol "
            "binding, binary content mode (ce_<attribute> headers, content-type). Other "
            "headers may be present; ignore those you do not know."
        )
        if topic == INVOICES.name:
            properties.update(_INVOICE_EXTRA_HEADERS)
            required += list(_INVOICE_EXTRA_HEADERS)
            # The outbox id column is a uuid.
            properties["ce_id"] = {**properties["ce_id"], "format": "uuid"}
            pattern_properties["^__debezium\\."] = {
                "type": "string",
                "description": "Debezium's context headers (connector name, task id, run id): "
                "operational, not part of the contract.",
            }
            required.sort()
    schema: dict[str, Any] = {
        "$schema": DRAFT,
        "$id": f"{ID_BASE}{topic}/{HEADERS_FILE}",
        "title": f"{topic} headers",
        "description": description,
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": {"type": "string"},
    }
    if pattern_properties:
        schema["patternProperties"] = pattern_properties
    return schema


# --------------------------------------------------------------------------- AsyncAPI


class _NoAliasDumper(yaml.SafeDumper):
    """A YAML dumper that writes repeated objects out instead of as anchors/aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_NoAliasDumper.add_representer(str, _represent_str)


def _camel(name: str) -> str:
    """``billing.account-events.v1`` → ``billingAccountEventsV1`` (AsyncAPI ids allow
    only ``[A-Za-z0-9_-]``)."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w]
    return words[0].lower() + "".join(w[:1].upper() + w[1:] for w in words[1:])


def _first_paragraph(text: str | None) -> str:
    return inspect.cleandoc(text or "").split("\n\n")[0].replace("\n", " ")


def message_id(event_type: str) -> str:
    """Component id of the AsyncAPI message of ``event_type`` (``usage.recorded`` →
    ``usageRecorded``)."""
    return _camel(event_type)


DEAD_LETTER_MESSAGE = "deadLetter"

#: AsyncAPI message id of each dead-letter topic's record (ids are unique per document).
DEAD_LETTER_MESSAGES: dict[str, str] = {
    ACCOUNT_EVENTS_DLQ.name: DEAD_LETTER_MESSAGE,
    INVOICES_DLQ.name: "invoiceDeadLetter",
}


def _kafka_key(topic: str) -> dict[str, Any]:
    return {"key": {"$ref": f"./{topic}/{KEY_FILE}"}, "bindingVersion": KAFKA_BINDING_VERSION}


def _messages(spec: TopicSpec) -> dict[str, dict[str, Any]]:
    topic = spec.name
    messages: dict[str, dict[str, Any]] = {}
    for model in event_models(spec.event_types):
        messages[message_id(model.event_type)] = {
            "name": model.event_type,
            "title": model.__name__,
            "summary": _first_paragraph(model.__doc__),
            "contentType": "application/json",
            "headers": {
                "allOf": [
                    {"$ref": f"./{topic}/{HEADERS_FILE}"},
                    {"type": "object", "properties": {"ce_type": {"const": model.event_type}}},
                ]
            },
            "payload": {"$ref": f"./{topic}/{model.event_type}.schema.json"},
            "bindings": {"kafka": _kafka_key(topic)},
        }
    if topic in DEAD_LETTER_TOPICS:
        source, refused_by = DEAD_LETTER_TOPICS[topic]
        messages[DEAD_LETTER_MESSAGES[topic]] = {
            "name": "dead_letter",
            "title": "Dead letter",
            "summary": f"A record {refused_by} could not take, with reason and source coordinates.",
            "description": f"See {topic}/README.md.",
            "contentType": "application/octet-stream",
            "headers": {"$ref": f"./{topic}/{HEADERS_FILE}"},
            "payload": {
                "description": "The original record's value bytes, unchanged: usually one of "
                f"the {source} messages, but not necessarily JSON (the "
                "record may have been refused for that)."
            },
            "bindings": {"kafka": _kafka_key(topic)},
        }
    return messages


def _channel(spec: TopicSpec, messages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ordering = (
        "one partition, so every reader sees the entries in publication order"
        if spec.name == PRICE_BOOK.name
        else "murmur2 partitioner, so every event of a customer is on one partition, in order"
    )
    return {
        "address": spec.name,
        "title": spec.name,
        "description": f"{spec.description}. Key: {spec.key} ({ordering}).",
        "messages": {mid: {"$ref": f"#/components/messages/{mid}"} for mid in messages},
        "bindings": {
            "kafka": {
                "topic": spec.name,
                "partitions": spec.partitions,
                "replicas": spec.replication_factor,
                "topicConfiguration": {
                    "cleanup.policy": spec.cleanup_policy.split(","),
                    "retention.ms": spec.retention_ms,
                },
                "bindingVersion": KAFKA_BINDING_VERSION,
            }
        },
    }


_ASYNCAPI_DESCRIPTION = """The Kafka topics of the invoicing pipeline: usage in, invoice events out.

- Values are JSON documents (JSON Schema draft 2020-12 files next to this one,
  using only keywords that mean the same in the AsyncAPI/draft-07 schema format).
  Money and quantities are decimal strings, never JSON numbers; times are UTC.
- Events use the CloudEvents 1.0 Kafka protocol binding in binary content mode:
  the value is the event's data, the attributes are ce_* headers (UTF-8 text).
- The key is the customer id; the murmur2 partitioner keeps each customer's events
  on one partition, in order.
- Delivery is at least once: deduplicate on ce_id (and, on billing.invoices.v1,
  on document_id + ce_type). Subscribers: docs/subscribing.md.
- Compatibility: within a topic version (.vN) fields are only added, optional;
  `invoicing schemas check-compat` refuses anything else. A breaking change ships
  on a new topic (.v2).

Generated by `python -m streams.schemas` from streams/domain/events.py and
streams/topics.py; do not edit."""


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document (as a dict) of every registered topic.

    Channels are the topics of :data:`streams.topics.REGISTRY` (bindings: partitions,
    replicas, cleanup policy, retention); messages are one per event type of
    each topic's :attr:`~streams.topics.TopicSpec.event_types` plus the dead letter, with payload, headers and key as
    ``$ref`` to the JSON Schema files next to the document.

    Raises:
        ValueError: two topics carry an event type with the same message id.
    """
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    components: dict[str, Any] = {}
    for spec in REGISTRY:
        messages = _messages(spec)
        for mid, message in messages.items():
            if mid in components:
                raise ValueError(f"message id {mid!r} is used by two topics")
            components[mid] = message
        channel_id = _camel(spec.name)
        channels[channel_id] = _channel(spec, messages)
        operations[f"send{channel_id[:1].upper()}{channel_id[1:]}"] = {
            "action": "send",
            "title": f"Publish to {spec.name}",
            "summary": spec.description,
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "messages": [{"$ref": f"#/channels/{channel_id}/messages/{mid}"} for mid in messages],
        }
    bootstrap = KafkaSettings.model_fields["bootstrap_servers"].default
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "Invoicing pipeline events",
            "version": API_VERSION,
            "description": _ASYNCAPI_DESCRIPTION,
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": bootstrap,
                "protocol": "kafka",
                "description": "The local stack (`make up`); other environments configure "
                "their own brokers.",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": components},
    }


def render_asyncapi() -> str:
    """:func:`asyncapi_document` as YAML text (deterministic, key order as built)."""
    header = "# Generated by `python -m streams.schemas`; do not edit.\n"
    body = yaml.dump(
        asyncapi_document(),
        Dumper=_NoAliasDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=100,
    )
    return header + body


_DLQ_README = """\
# {topic}

Dead-letter topic of {refused_by}, for records of `{source}`
(DESIGN §3 invariant 5: bad input never stalls a partition and is never dropped
silently).

- **Key:** the original record's key, unchanged ([key.schema.json](key.schema.json);
  it may be absent or not match the schema when the key itself was the problem).
- **Value:** the original record's value bytes, unchanged. They need not be JSON,
  so there is no value schema.
- **Headers:** the original headers, plus the reason and the source coordinates
  (topic, partition, offset) of the record, added by the process that refused it
  ([headers.schema.json](headers.schema.json)).
- **AsyncAPI:** channel `{topic}`, message `{message}` in [../asyncapi.yaml](../asyncapi.yaml).

Generated by `python -m streams.schemas`; do not edit.
"""


def render_schemas() -> dict[Path, str]:
    """Every schema file's text, by path relative to the ``schemas/`` folder.

    Deterministic: the same models give the same text.
    """
    files: dict[Path, str] = {}
    for spec in REGISTRY:
        topic = spec.name
        files[Path(topic) / KEY_FILE] = _dump(_key_schema(topic))
        files[Path(topic) / HEADERS_FILE] = _dump(_headers_schema(spec))
        for model in event_models(spec.event_types):
            files[Path(topic) / f"{model.event_type}.schema.json"] = _dump(
                _value_schema(topic, model)
            )
    for topic, (source, refused_by) in DEAD_LETTER_TOPICS.items():
        files[Path(topic) / "README.md"] = _DLQ_README.format(
            topic=topic, source=source, refused_by=refused_by, message=DEAD_LETTER_MESSAGES[topic]
        )
    files[Path(ASYNCAPI_FILE)] = render_asyncapi()
    files[Path(PRICE_BOOK_FILE)] = _dump(_price_book_schema())
    for name, body in _http_models().items():
        files[Path(HTTP_FOLDER) / f"{name}.schema.json"] = _dump(_http_schema(name, body))
    files[Path(OPENAPI_FILE)] = (
        "# Generated by `python -m streams.schemas`; do not edit.\n"
        + yaml.dump(
            openapi_document(),
            Dumper=_NoAliasDumper,
            sort_keys=False,
            allow_unicode=True,
            width=100,
        )
    )
    return dict(sorted(files.items()))


def write_schemas(root: Path) -> list[Path]:
    """Write the rendered files under ``root`` (the ``schemas/`` folder), touching
    only those whose text changed; returns the paths written (relative to ``root``).

    Raises:
        OSError: a file or folder cannot be written.
    """
    written: list[Path] = []
    for relative, text in render_schemas().items():
        target = root / relative
        if target.is_file() and target.read_text(encoding="utf-8") == text:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8", newline="\n")
        written.append(relative)
    return written


def stale_schemas(root: Path) -> list[str]:
    """What ``write_schemas(root)`` would fix: relative paths (POSIX form) of files
    that are missing or differ, plus ``*.schema.json`` files under ``root`` that
    nothing renders any more (write_schemas does not delete those). Empty = up to date.
    """
    rendered = render_schemas()
    stale = [
        relative.as_posix()
        for relative, text in rendered.items()
        if not (root / relative).is_file() or (root / relative).read_text(encoding="utf-8") != text
    ]
    if root.is_dir():
        for path in sorted(root.rglob("*.schema.json")):
            relative = path.relative_to(root)
            if relative not in rendered:
                stale.append(relative.as_posix())
    return stale


def main(argv: list[str] | None = None) -> int:
    """``python -m streams.schemas [folder]``: write the schemas, list what changed."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path("schemas")
    for relative in write_schemas(root):
        print(f"wrote {root / relative}")
    return 0
