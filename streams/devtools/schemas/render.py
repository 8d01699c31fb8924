"""JSON Schema files of every topic's key and value, generated from the event models.

One place per contract (docs/conventions.md "One place per contract"): the pydantic models in
:mod:`streams.core.domain.events` are the source; ``schemas/`` holds what they render
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
                                       streams.core.domain.rating.book (not a topic)

The value of an account or invoice event is the event's ``data`` as JSON
(CloudEvents binary content mode); the CloudEvents attributes travel as
``ce_*`` headers (:mod:`streams.core.domain.codec`). Files are JSON Schema draft
2020-12, serialization mode (money and quantities are decimal *strings*),
rendered with sorted keys, 2-space indent and a trailing newline, so the same
models always give the same bytes.

Modules: this one renders the topics' and the price book's JSON Schemas and writes the
folder; :mod:`~streams.devtools.schemas.asyncapi` the AsyncAPI document,
:mod:`~streams.devtools.schemas.openapi` the HTTP bodies and the OpenAPI document,
:mod:`~streams.devtools.schemas.files` the layout and the writers they share.

Regenerate: ``python -m streams.devtools.schemas [schemas-folder]`` (default ``./schemas``), or
``invoicing schemas export``. Compatibility of a change against an earlier commit:
``invoicing schemas check-compat`` (:mod:`streams.devtools.schemas.compat`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter

from streams.core.domain.codec import KEY_ID_HEADER
from streams.core.domain.events import CODE_PATTERN, CustomerId, Envelope, EventData, event_models
from streams.core.domain.rating.book import price_book_json_schema
from streams.devtools.schemas.asyncapi import DEAD_LETTER_MESSAGES, render_asyncapi
from streams.devtools.schemas.files import (
    ASYNCAPI_FILE,
    DRAFT,
    GENERATED,
    HEADERS_FILE,
    HTTP_FOLDER,
    ID_BASE,
    KEY_FILE,
    OPENAPI_FILE,
    PRICE_BOOK_FILE,
    NoAliasDumper,
    dump_json,
)
from streams.devtools.schemas.openapi import http_models, http_schema, openapi_document
from streams.topics import (
    ACCOUNT_EVENTS,
    DEAD_LETTER_TOPICS,
    INVOICES,
    PRICE_BOOK,
    REGISTRY,
    TopicSpec,
)


def _price_book_schema() -> dict[str, Any]:
    return {
        **price_book_json_schema(),
        "$schema": DRAFT,
        "$id": f"{ID_BASE}{PRICE_BOOK_FILE}",
        "title": "Price book",
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

#: Headers the dead-letter publisher adds (streams/core/billing/dead_letters.py), all UTF-8 text.
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
        if topic == ACCOUNT_EVENTS.name:
            properties[KEY_ID_HEADER] = {
                "type": "string",
                "minLength": 1,
                "maxLength": 64,
                "description": "Optional: the id of the API key that sent the event through "
                "the ingest edge (lineage, not a CloudEvents attribute).",
            }
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


_DLQ_README = """\
# {topic}

Dead-letter topic of {refused_by}, for records of `{source}`
(docs/design.md, invariant 5: bad input never stalls a partition and is never dropped
silently).

- **Key:** the original record's key, unchanged ([key.schema.json](key.schema.json);
  it may be absent or not match the schema when the key itself was the problem).
- **Value:** the original record's value bytes, unchanged. They need not be JSON,
  so there is no value schema.
- **Headers:** the original headers, plus the reason and the source coordinates
  (topic, partition, offset) of the record, added by the process that refused it
  ([headers.schema.json](headers.schema.json)).
- **AsyncAPI:** channel `{topic}`, message `{message}` in [../asyncapi.yaml](../asyncapi.yaml).

Generated by `python -m streams.devtools.schemas`; do not edit.
"""


def render_schemas() -> dict[Path, str]:
    """Every schema file's text, by path relative to the ``schemas/`` folder.

    Deterministic: the same models give the same text.
    """
    files: dict[Path, str] = {}
    for spec in REGISTRY:
        topic = spec.name
        files[Path(topic) / KEY_FILE] = dump_json(_key_schema(topic))
        files[Path(topic) / HEADERS_FILE] = dump_json(_headers_schema(spec))
        for model in event_models(spec.event_types):
            files[Path(topic) / f"{model.event_type}.schema.json"] = dump_json(
                _value_schema(topic, model)
            )
    for topic, (source, refused_by) in DEAD_LETTER_TOPICS.items():
        files[Path(topic) / "README.md"] = _DLQ_README.format(
            topic=topic, source=source, refused_by=refused_by, message=DEAD_LETTER_MESSAGES[topic]
        )
    files[Path(ASYNCAPI_FILE)] = render_asyncapi()
    files[Path(PRICE_BOOK_FILE)] = dump_json(_price_book_schema())
    for name, body in http_models().items():
        files[Path(HTTP_FOLDER) / f"{name}.schema.json"] = dump_json(http_schema(name, body))
    files[Path(OPENAPI_FILE)] = GENERATED + yaml.dump(
        openapi_document(),
        Dumper=NoAliasDumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
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
    """``python -m streams.devtools.schemas [folder]``: write the schemas, list what changed."""
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else Path("schemas")
    for relative in write_schemas(root):
        print(f"wrote {root / relative}")
    return 0


__all__ = [
    "ASYNCAPI_FILE",
    "HTTP_FOLDER",
    "PRICE_BOOK_FILE",
    "render_schemas",
    "stale_schemas",
    "write_schemas",
]
