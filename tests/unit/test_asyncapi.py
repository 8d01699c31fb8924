"""schemas/asyncapi.yaml: a valid AsyncAPI 3.0 document that matches the topic registry,
the event models and the headers the pipeline really writes."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import (  # type: ignore[import-untyped]
    Draft7Validator,
    Draft202012Validator,
    ValidationError,
)

from streams.core.billing.dead_letters import DeadLetters
from streams.core.domain.codec import encode, headers_dict
from streams.core.domain.events import Envelope
from streams.devtools.schemas.asyncapi import message_id, render_asyncapi
from streams.devtools.schemas.files import ASYNCAPI_FILE
from streams.topics import ACCOUNT_EVENTS, ACCOUNT_EVENTS_DLQ, INVOICES, REGISTRY
from tests.unit.test_schemas import TOPIC_MODELS, sample_events

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
OFFICIAL = Path(__file__).parent / "data" / "asyncapi-3.0.0-without-id.schema.json.gz"
WHEN = datetime(2024, 10, 1, 0, 0, 5, tzinfo=UTC)
CLOUDEVENTS = {
    "ce_specversion",
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_time",
    "ce_subject",
    "content-type",
}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((SCHEMAS / ASYNCAPI_FILE).read_text(encoding="utf-8"))
    return loaded


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def pointer(document: dict[str, Any], ref: str) -> Any:
    node: Any = document
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def headers_validator(topic: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / topic / "headers.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def test_it_parses_and_is_asyncapi_3(document: dict[str, Any]) -> None:
    assert document["asyncapi"] == "3.0.0"
    assert document["info"]["title"] and document["info"]["version"]
    assert render_asyncapi() == (SCHEMAS / ASYNCAPI_FILE).read_text(encoding="utf-8")


def test_it_validates_against_the_official_asyncapi_3_schema(document: dict[str, Any]) -> None:
    official = json.loads(gzip.decompress(OFFICIAL.read_bytes()))
    Draft7Validator.check_schema(official)
    errors = sorted(Draft7Validator(official).iter_errors(document), key=lambda e: e.path)
    assert [f"{list(e.absolute_path)}: {e.message[:200]}" for e in errors] == []
    # The validator does look: a wrong binding field fails.
    broken = json.loads(json.dumps(document))
    next(iter(broken["channels"].values()))["bindings"]["kafka"]["partitions"] = "twelve"
    assert not Draft7Validator(official).is_valid(broken)


def test_every_channel_is_a_registered_topic_with_its_bindings(document: dict[str, Any]) -> None:
    channels = document["channels"]
    assert sorted(c["address"] for c in channels.values()) == sorted(s.name for s in REGISTRY)
    for spec in REGISTRY:
        [channel] = [c for c in channels.values() if c["address"] == spec.name]
        kafka = channel["bindings"]["kafka"]
        assert kafka["topic"] == spec.name
        assert kafka["partitions"] == spec.partitions
        assert kafka["replicas"] == spec.replication_factor
        assert kafka["topicConfiguration"] == {
            "cleanup.policy": spec.cleanup_policy.split(","),
            "retention.ms": spec.retention_ms,
        }


def test_every_reference_resolves(document: dict[str, Any]) -> None:
    found = list(refs(document))
    external = [r for r in found if not r.startswith("#")]
    assert len(external) >= 3 * 6 + 2  # payload, headers and key of each event, the DLQ's two
    for ref in found:
        if ref.startswith("#"):
            assert pointer(document, ref) is not None, ref
        else:
            path = (SCHEMAS / ref).resolve()
            assert path.is_file(), ref
            assert SCHEMAS in path.parents, ref
            Draft202012Validator.check_schema(json.loads(path.read_text(encoding="utf-8")))


def test_one_message_per_event_type_with_payload_key_and_headers(
    document: dict[str, Any],
) -> None:
    messages = document["components"]["messages"]
    for topic, models in TOPIC_MODELS.items():
        [channel] = [c for c in document["channels"].values() if c["address"] == topic]
        assert set(channel["messages"]) == {message_id(m.event_type) for m in models}
        for model in models:
            message = messages[message_id(model.event_type)]
            assert message["name"] == model.event_type
            assert message["contentType"] == "application/json"
            assert message["payload"] == {"$ref": f"./{topic}/{model.event_type}.schema.json"}
            assert message["bindings"]["kafka"]["key"] == {"$ref": f"./{topic}/key.schema.json"}
            headers, this_type = message["headers"]["allOf"]
            assert headers == {"$ref": f"./{topic}/headers.schema.json"}
            assert this_type["properties"]["ce_type"] == {"const": model.event_type}
    dead = messages["deadLetter"]
    assert dead["headers"] == {"$ref": f"./{ACCOUNT_EVENTS_DLQ.name}/headers.schema.json"}


def test_headers_schemas_require_what_the_binding_and_the_router_place() -> None:
    def required(topic: str) -> set[str]:
        schema = json.loads((SCHEMAS / topic / "headers.schema.json").read_text(encoding="utf-8"))
        return set(schema["required"])

    assert required(ACCOUNT_EVENTS.name) == CLOUDEVENTS
    assert required(INVOICES.name) == CLOUDEVENTS | {"document_id", "id"}
    # The router's header placement (connectors/outbox-connector.json) + Debezium's own `id`.
    connector = json.loads((ROOT / "connectors" / "outbox-connector.json").read_text())
    placed = {
        entry.split(":")[2]
        for entry in connector["transforms.outbox.table.fields.additional.placement"].split(",")
    }
    assert placed | {"id"} == required(INVOICES.name)


@pytest.mark.parametrize("event", sample_events(), ids=lambda event: event.event_type)
def test_real_headers_validate(event: Any) -> None:
    record = encode(Envelope.wrap(event, id="6a0e1b0e-6a39-4f8e-8f1e-0d5a3c9d1f11", source="/t"))
    headers: dict[str, str] = headers_dict(record.headers)
    topic = next(t for t, models in TOPIC_MODELS.items() if type(event) in models)
    check = headers_validator(topic)
    if topic == INVOICES.name:
        with pytest.raises(ValidationError):  # the router adds these two
            check.validate(headers)
        headers |= {
            "id": headers["ce_id"],
            "document_id": "24ea12fb-0969-58a4-9c9a-b30e60636fd7",
            "__debezium.context.taskId": "0",
        }
    check.validate(headers)
    with pytest.raises(ValidationError):
        check.validate(headers | {"ce_type": "invoice.deleted"})
    with pytest.raises(ValidationError):
        check.validate(headers | {"ce_subject": "has space"})
    if topic == INVOICES.name:
        with pytest.raises(ValidationError):  # the outbox id is a uuid
            check.validate(headers | {"ce_id": "e-1"})


class FakeProducer:
    """Records produce() calls and acknowledges them on flush()."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._pending: list[Any] = []

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.records.append({"topic": topic, **kwargs})
        self._pending.append(kwargs["on_delivery"])

    def flush(self, timeout: float) -> int:
        for report in self._pending:
            report(None, None)
        self._pending.clear()
        return 0


def test_dead_letter_headers_match_the_dlq_headers_schema() -> None:
    producer = FakeProducer()
    DeadLetters(producer, ACCOUNT_EVENTS_DLQ.name, "invoicing").publish(  # type: ignore[arg-type]
        key=b"c-1",
        value=b"\x00not json",
        headers=[("ce_id", b"e-1")],
        source_topic=ACCOUNT_EVENTS.name,
        source_partition=3,
        source_offset=42,
        kind="invalid",
        reason="value is not JSON",
    )
    [record] = producer.records
    headers = headers_dict(record["headers"])
    check = headers_validator(ACCOUNT_EVENTS_DLQ.name)
    check.validate(headers)
    schema = json.loads(
        (SCHEMAS / ACCOUNT_EVENTS_DLQ.name / "headers.schema.json").read_text(encoding="utf-8")
    )
    assert {h for h in headers if h.startswith("dlq.")} == set(schema["required"])


#: Keywords of draft 2020-12 that draft-07 (the base of AsyncAPI's default schema
#: format) does not know or reads differently; "$defs" is fine: refs point into it.
DRAFT_2020_ONLY = {
    "prefixItems",
    "$dynamicRef",
    "$dynamicAnchor",
    "$anchor",
    "unevaluatedItems",
    "unevaluatedProperties",
    "dependentRequired",
    "dependentSchemas",
    "$vocabulary",
    "minContains",
    "maxContains",
}


def keywords(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield key
            if key not in ("properties", "$defs", "patternProperties"):
                yield from keywords(value)
            else:
                for sub in value.values():
                    yield from keywords(sub)
    elif isinstance(node, list):
        for item in node:
            yield from keywords(item)


def test_schema_files_mean_the_same_under_the_default_asyncapi_schema_format() -> None:
    files = sorted(SCHEMAS.rglob("*.schema.json"))
    # Topic files, plus the price book's document schema and the HTTP bodies' (docs/usage-api.md),
    # checked alike below.
    topic_files = [path for path in files if path.parent.name not in ("price-book", "http")]
    assert len(topic_files) == len(REGISTRY) * 2 + sum(len(m) for m in TOPIC_MODELS.values())
    http_files = [path for path in files if path.parent.name == "http"]
    assert len(http_files) == 4
    assert len(files) == len(topic_files) + 1 + len(http_files)
    for path in files:
        used = set(keywords(json.loads(path.read_text(encoding="utf-8"))))
        assert not used & DRAFT_2020_ONLY, path
        # items as an array means "tuple" in draft-07 but is invalid in 2020-12.
        assert "items" not in used or all(
            not isinstance(v, list) for v in _items(json.loads(path.read_text()))
        )


def _items(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "items":
                yield value
            yield from _items(value)
    elif isinstance(node, list):
        for item in node:
            yield from _items(item)
