"""The AsyncAPI 3.0 document of every registered topic (``schemas/asyncapi.yaml``).

Channels are the topics of :data:`streams.topics.REGISTRY` with their Kafka bindings
(partitions, replicas, cleanup policy, retention); messages are one per event type
plus each dead-letter topic's record, with payload, headers and key as ``$ref`` to
the JSON Schema files beside the document (:mod:`streams.devtools.schemas.render`).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import yaml

from streams.core.domain.events import event_models
from streams.devtools.schemas.files import (
    API_VERSION,
    GENERATED,
    HEADERS_FILE,
    KEY_FILE,
    NoAliasDumper,
)
from streams.settings import KafkaSettings
from streams.topics import (
    ACCOUNT_EVENTS_DLQ,
    DEAD_LETTER_TOPICS,
    INVOICES_DLQ,
    PRICE_BOOK,
    REGISTRY,
    TopicSpec,
)

#: Version of the AsyncAPI specification the document follows.
ASYNCAPI_VERSION = "3.0.0"
#: AsyncAPI Kafka bindings version (channel, message and operation bindings). Not
#: 0.5.0: the official AsyncAPI 3.0.0 JSON Schema (@asyncapi/specs 6.11.1) checks a
#: 0.5.0 message key with ``oneOf`` [Reference, Schema], so a ``$ref`` key matches
#: both and fails (the bug fixed for 0.4.0 in asyncapi/spec-json-schemas#466);
#: 0.4.0 has every field used here and validates with standard tooling.
KAFKA_BINDING_VERSION = "0.4.0"


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

Generated by `python -m streams.devtools.schemas` from streams/core/domain/events/ and
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
    header = GENERATED
    body = yaml.dump(
        asyncapi_document(),
        Dumper=NoAliasDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
        width=100,
    )
    return header + body
