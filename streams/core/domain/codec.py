"""CloudEvents Kafka protocol binding, binary content mode (pure, no Kafka import).

Source: CloudEvents 1.0.2 "Kafka Protocol Binding" §3.2 (binary content mode):
the value is the ``data`` as ``application/json``; each context attribute is a
header named ``ce_<attribute>`` with its value as UTF-8 bytes; ``content-type``
carries ``datacontenttype``; the record key is the customer id (the binding's
``partitionkey`` extension is implied by the key and not sent).

Shapes: a record is ``(key: bytes, value: bytes, headers: list[tuple[str, bytes]])``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import EVENT_TYPES, Envelope, EventData

Headers = list[tuple[str, bytes]]

_REQUIRED = ("ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject")


#: The record header (UTF-8 text, optional) naming the id of the API key that sent the
#: event through the ingest edge; the invoicing worker stores it as lineage
#: (``usage_lines.key_id``, ``metered_usage.key_id``; docs/security.md "API keys").
#: Not a CloudEvents attribute: the decoders ignore it.
KEY_ID_HEADER = "invoicing_key_id"


@dataclass(frozen=True)
class EncodedRecord:
    """A record ready for a producer: key, value and headers as bytes."""

    key: bytes
    value: bytes
    headers: Headers


def encode(envelope: Envelope) -> EncodedRecord:
    """The binary-mode record of ``envelope``; key = ``envelope.subject`` (customer id)."""
    data = envelope.data
    if not isinstance(data, EventData):
        raise InvalidEvent(f"envelope data must be an EventData model, got {type(data).__name__}")
    headers: Headers = [
        ("ce_specversion", envelope.specversion.encode()),
        ("ce_id", envelope.id.encode()),
        ("ce_source", envelope.source.encode()),
        ("ce_type", envelope.type.encode()),
        ("ce_time", envelope.time.isoformat().replace("+00:00", "Z").encode()),
        ("ce_subject", envelope.subject.encode()),
        ("content-type", envelope.datacontenttype.encode()),
    ]
    return EncodedRecord(
        key=envelope.subject.encode(),
        value=data.model_dump_json().encode(),
        headers=headers,
    )


def headers_dict(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Headers as ``name → text``; the last of repeated names wins.

    Raises:
        InvalidEvent: a header value is not UTF-8.
    """
    result: dict[str, str] = {}
    for name, raw in headers or ():
        if raw is None:
            continue
        try:
            result[name] = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidEvent(f"header {name!r} is not UTF-8") from None
    return result


def decode(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | Mapping[str, bytes] | None,
    *,
    allowed: Iterable[type[EventData]] | None = None,
) -> Envelope:
    """The envelope carried by a binary-mode record, its ``data`` validated.

    Args:
        allowed: data models accepted on this topic (default: every known type).

    Raises:
        InvalidEvent: a missing or malformed header, an unknown or disallowed
            type, a value that is not JSON or does not validate, or a key that
            differs from ``ce_subject``. The message says which.
    """
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
    attrs = headers_dict(pairs)
    missing = [name for name in _REQUIRED if name not in attrs]
    if missing:
        raise InvalidEvent(f"missing CloudEvents header(s): {', '.join(missing)}")
    if attrs["ce_specversion"] != "1.0":
        raise InvalidEvent(f"unsupported ce_specversion {attrs['ce_specversion']!r}")
    content_type = attrs.get("content-type", "application/json")
    if content_type.split(";")[0].strip() != "application/json":
        raise InvalidEvent(f"unsupported content-type {content_type!r}")
    event_type = attrs["ce_type"]
    model = EVENT_TYPES.get(event_type)
    if model is None:
        raise InvalidEvent(f"unknown event type {event_type!r}")
    if allowed is not None and model not in tuple(allowed):
        raise InvalidEvent(f"event type {event_type!r} does not belong on this topic")
    if key is None:
        raise InvalidEvent("record has no key (the customer id)")
    try:
        key_text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidEvent("record key is not UTF-8") from None
    if key_text != attrs["ce_subject"]:
        raise InvalidEvent(
            f"record key {key_text!r} differs from ce_subject {attrs['ce_subject']!r}"
        )
    if value is None:
        raise InvalidEvent("record has no value")
    payload = read_json(value)
    try:
        data = model.model_validate(payload)
    except ValidationError as exc:
        raise InvalidEvent(f"invalid {event_type} data: {_summarise(exc)}") from None
    except (ValueError, ArithmeticError, RecursionError) as exc:  # a validator's own failure
        raise InvalidEvent(f"invalid {event_type} data: {type(exc).__name__}: {exc}") from None
    customer = getattr(data, "customer_id", None)
    if customer is not None and customer != key_text:
        raise InvalidEvent(
            f"data.customer_id {customer!r} differs from the record key {key_text!r}"
        )
    if data.record_key() != key_text:
        raise InvalidEvent(f"the record key {key_text!r} is not {data.record_key()!r}")
    try:
        return Envelope(
            id=attrs["ce_id"],
            source=attrs["ce_source"],
            type=event_type,
            time=datetime.fromisoformat(attrs["ce_time"].replace("Z", "+00:00")),
            subject=attrs["ce_subject"],
            data=data,
        )
    except (ValidationError, ValueError, OverflowError) as exc:
        raise InvalidEvent(f"invalid CloudEvents attributes: {_summarise(exc)}") from None


class _RepeatedName(ValueError):
    pass


def _no_repeated_names(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose names are unique (RFC 8259 §4: "names SHOULD be unique"; parsers
    differ on which value wins, so a repeated name is refused rather than guessed)."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for name, _value in pairs:
            if name in seen:
                raise _RepeatedName(f"the name {name[:64]!r} appears twice in one object")
            seen.add(name)
    return result


def read_json(value: bytes) -> object:
    """The JSON document ``value``.

    Raises:
        InvalidEvent: not UTF-8 JSON, or JSON the standard parser refuses to hold:
            an integer literal longer than Python's ``int_max_str_digits`` (4,300
            digits; ``ValueError``) or nesting deeper than the recursion limit
            (``RecursionError``). Both were found by the fuzz suite, each crashing
            every consumer of the topic (tests/fuzz).
    """
    try:
        return json.loads(value, object_pairs_hook=_no_repeated_names)
    except _RepeatedName as exc:
        raise InvalidEvent(f"value is not JSON this pipeline reads: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidEvent(f"value is not JSON: {exc}") from None
    except ValueError as exc:  # int_max_str_digits
        raise InvalidEvent(f"value is not JSON this pipeline reads: {exc}") from None
    except RecursionError:
        raise InvalidEvent("value is not JSON this pipeline reads: nested too deeply") from None


def _summarise(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
            parts.append(f"{loc}: {err.get('msg')}")
        return "; ".join(parts)
    return str(exc)
