"""Validation at the ingest edge: a request body → records for the topic, or per-event errors (pure).

Input: CloudEvents 1.0.2 in **structured** JSON mode (JSON event format §3):
``application/cloudevents+json`` (one event, an object) or
``application/cloudevents-batch+json`` (a JSON array of events, §4). Output: the
same event in the topic's **binary** mode (:func:`streams.core.domain.codec.encode`)
built from the data validated by the topic's own models (``streams/core/domain/events.py``),
so the edge accepts exactly what the consumers' decoder accepts.

Rules:

* attributes: ``specversion`` "1.0", ``id``, ``source``, ``type`` required;
  ``subject`` (the customer id) optional — it defaults to ``data.customer_id``
  and must equal it; ``time`` optional (default: the time of receipt; a time
  without a zone is refused); ``datacontenttype`` ``application/json`` if given;
  no extension attributes (the topic has none) — 400 for any of these;
* ``type`` one of the topic's types **except** ``billing_period.closed`` (closing
  a period is the close-period command's, under its lease) — 403;
* ``data`` validated by the type's model (``streams/core/domain/events.py``) — 422.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    create_model,
)

from streams.core.domain.codec import EncodedRecord, encode
from streams.core.domain.events import (
    EVENT_TYPES,
    CustomerId,
    Envelope,
    EventData,
    UtcDateTime,
    event_models,
)
from streams.core.domain.http import CloudEventIn
from streams.errors import InvoicingError
from streams.topics import ACCOUNT_EVENTS

SINGLE = "application/cloudevents+json"
BATCH = "application/cloudevents-batch+json"

#: Types the edge takes: the account events topic's, less the close marker.
ACCEPTED_TYPES = tuple(t for t in ACCOUNT_EVENTS.event_types if t != "billing_period.closed")
_TOPIC_MODELS = event_models(ACCOUNT_EVENTS.event_types)


class BodyError(InvoicingError):
    """The request body as a whole is unusable: ``status`` and ``title`` for the problem."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title
        self.detail = detail


@dataclass(frozen=True)
class Valid:
    """An event ready to produce: its id, content digest, record, ``source``, type and
    customer id (what a key's scope is checked against)."""

    index: int
    event_id: str
    digest: str
    record: EncodedRecord
    source: str = ""
    event_type: str = ""
    customer_id: str = ""

    @property
    def claim(self) -> str:
        """What the idempotency claim of this event's id holds: its source and content
        (:func:`claim_digest`)."""
        return claim_digest(self.source, self.digest)


def claim_digest(source: str, digest: str) -> str:
    """The idempotency claim's digest: ``source`` and the content ``digest`` together.

    CloudEvents identifies an event by ``source`` + ``id``. The consumers deduplicate by
    ``id`` alone (``usage_lines`` is keyed by it, docs/design.md), so an id another source
    already sent would reach them as a conflict and hold the customer's invoice: the edge
    answers the same ``source`` + ``id`` + content as a duplicate, and any other source or
    content under a claimed id as a conflict (409), never a silent duplicate.
    """
    return hashlib.sha256(
        source.encode("utf-8", "surrogatepass") + b"\n" + digest.encode()
    ).hexdigest()[:16]


@dataclass(frozen=True)
class Invalid:
    """An event refused before the topic: ``status`` (400, 403, 422), title and detail."""

    index: int
    event_id: str | None
    status: int
    title: str
    detail: str


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def parse_body(body: bytes, content_type: str | None, *, max_events: int) -> tuple[list[Any], bool]:
    """The events of a request body, and whether it was a batch.

    Raises:
        BodyError: 415 another media type; 400 not UTF-8 JSON, nested deeper than the
            interpreter's recursion limit, or not an object
            (single) / an array (batch); 400 an empty batch; 413 more than
            ``max_events`` events.
    """
    kind = media_type(content_type)
    if kind not in (SINGLE, BATCH):
        raise BodyError(
            415,
            "Unsupported media type",
            f"send {SINGLE} (one event) or {BATCH} (a JSON array of events), not {kind or 'nothing'}",
        )
    try:
        parsed = json.loads(
            body.decode("utf-8"), parse_float=_no_float, parse_constant=_no_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise BodyError(400, "Malformed body", f"not UTF-8 JSON: {exc}") from None
    except RecursionError:
        # json.loads recurses per nesting level; an event is a few levels deep
        raise BodyError(400, "Malformed body", "JSON nested too deeply for a CloudEvent") from None
    if kind == SINGLE:
        if not isinstance(parsed, dict):
            raise BodyError(400, "Malformed body", f"{SINGLE} is one JSON object")
        return [parsed], False
    if not isinstance(parsed, list):
        raise BodyError(400, "Malformed body", f"{BATCH} is a JSON array of events")
    if not parsed:
        raise BodyError(400, "Empty batch", "the batch holds no event")
    if len(parsed) > max_events:
        raise BodyError(
            413, "Batch too large", f"{len(parsed)} events, at most {max_events} per request"
        )
    return parsed, True


def _no_float(text: str) -> Any:
    # Money and property values are decimal strings; a JSON number with a fraction
    # would be a float in most consumers: refused, with where.
    raise ValueError(f"JSON number {text} with a fraction or exponent: send decimals as strings")


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def validate(index: int, item: Any, *, received_at: datetime) -> Valid | Invalid:
    """One structured-mode event → a :class:`Valid` record or an :class:`Invalid` reason."""
    event_id = _echo(item.get("id")) if isinstance(item, dict) else None
    if not isinstance(item, dict):
        return Invalid(index, None, 400, "Malformed event", "an event is a JSON object")
    try:
        event = CloudEventIn.model_validate(item)
    except ValidationError as exc:
        return Invalid(index, event_id, 400, "Invalid CloudEvent", _summary(exc))
    if event.type not in EVENT_TYPES or EVENT_TYPES[event.type] not in _TOPIC_MODELS:
        return Invalid(
            index,
            event.id,
            400,
            "Unknown event type",
            f"{event.type!r} is not an account event type ({', '.join(ACCEPTED_TYPES)})",
        )
    if event.type not in ACCEPTED_TYPES:
        return Invalid(
            index,
            event.id,
            403,
            "Event type not accepted here",
            f"{event.type} is sent by `invoicing close-period` (under its lease), not through the edge",
        )
    model = EVENT_TYPES[event.type]
    try:
        data = model.model_validate(event.data)
    except ValidationError as exc:
        return Invalid(index, event.id, 422, f"Invalid {event.type} data", _summary(exc))
    customer_id = str(getattr(data, "customer_id"))  # noqa: B009 - every account event names its customer
    if event.subject is not None and event.subject != customer_id:
        return Invalid(
            index,
            event.id,
            422,
            "Subject mismatch",
            f"subject {event.subject!r} differs from data.customer_id {customer_id!r}",
        )
    try:
        time = (
            datetime.fromisoformat(event.time.replace("Z", "+00:00"))
            if event.time is not None
            else received_at.astimezone(UTC)
        )
        envelope = Envelope(
            id=event.id,
            source=event.source,
            type=event.type,
            time=time,
            subject=customer_id,
            data=data,
        )
    except ValidationError as exc:  # the envelope's own constraints (id, source, time)
        return Invalid(index, event.id, 400, "Invalid CloudEvent", _summary(exc))
    except ValueError as exc:
        return Invalid(index, event.id, 400, "Invalid CloudEvent", f"time: {exc}")
    record = encode(envelope)
    # The record is the topic's contract by construction: ``data`` was validated by the
    # type's model and ``encode`` writes key = subject = data.customer_id; decoding it
    # again would double the edge's cost per event (the unit tests decode every
    # accepted record, and the integration test every record on the topic).
    return Valid(
        index,
        event.id,
        record_digest(event.type, record.value),
        record,
        event.source,
        event.type,
        customer_id,
    )


def _echo(value: Any) -> str | None:
    """``value`` to repeat in a refusal: a string with a UTF-8 form, else None (a JSON
    escape of a lone surrogate decodes to a string that has none, and the problem would
    not serialize)."""
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def record_digest(event_type: str, value: bytes) -> str:
    """:func:`streams.apps.usage_view.state.digest` from the encoded record: the value is the
    data's canonical JSON (``model_dump_json``), so the digests agree."""
    return hashlib.sha256(event_type.encode() + b"\n" + value).hexdigest()[:16]


def envelope_attribute(name: str) -> Any:
    """The type of the :class:`~streams.core.domain.events.Envelope`'s attribute ``name`` with
    its constraints (lengths, pattern): the one definition both paths of the edge validate
    ``id`` and ``source`` with (the single-event path by building the envelope)."""
    info = Envelope.model_fields[name]
    return Annotated[(info.annotation, *info.metadata)]


def _typed_cloudevent(model: type[EventData]) -> type[BaseModel]:
    """A structured-mode CloudEvent whose ``data`` is ``model``: the envelope's attribute
    constraints (:class:`~streams.core.domain.events.Envelope`, :func:`envelope_attribute`)
    with ``type`` fixed."""
    fields: dict[str, Any] = {
        "specversion": (Literal["1.0"], ...),
        "id": (envelope_attribute("id"), ...),
        "source": (envelope_attribute("source"), ...),
        "type": (Literal[model.event_type], ...),
        "subject": (CustomerId | None, None),
        # strict: an RFC 3339 string only (as the per-event path), never a unix number
        "time": (Annotated[UtcDateTime, Strict()] | None, None),
        "datacontenttype": (Literal["application/json"] | None, None),
        "data": (model, ...),
    }
    typed: type[BaseModel] = create_model(
        f"CloudEvent_{model.__name__}",
        __config__=ConfigDict(frozen=True, extra="forbid"),
        **fields,
    )
    return typed


def _batch_adapter() -> TypeAdapter[list[Any]]:
    union = Union[tuple(_typed_cloudevent(EVENT_TYPES[t]) for t in ACCEPTED_TYPES)]  # type: ignore[valid-type]  # noqa: UP007
    return TypeAdapter(list[Annotated[union, Field(discriminator="type")]])  # type: ignore[valid-type]


_BATCH: TypeAdapter[list[Any]] | None = None


def validate_batch_fast(body: bytes, *, received_at: datetime) -> list[Valid] | None:
    """Every event of a batch body validated in one pass (pydantic-core parses and
    validates the JSON: no ``json.loads`` then per-event models), or ``None`` when any
    event fails, or a subject differs from its ``data.customer_id``: the caller then
    takes the per-event path (:func:`parse_body` + :func:`validate`) for the errors.
    Same rules, same records: a unit test compares both paths."""
    global _BATCH
    if _BATCH is None:
        _BATCH = _batch_adapter()
    try:
        events = _BATCH.validate_json(body)
    except ValidationError:
        return None
    valid: list[Valid] = []
    now = received_at.astimezone(UTC)
    for index, event in enumerate(events):
        data = event.data
        subject = data.customer_id
        if event.subject is not None and event.subject != subject:
            return None
        record = _record(event.id, event.source, event.type, event.time or now, subject, data)
        valid.append(
            Valid(
                index,
                event.id,
                record_digest(event.type, record.value),
                record,
                event.source,
                event.type,
                subject,
            )
        )
    return valid


_SPECVERSION = ("ce_specversion", b"1.0")
_CONTENT_TYPE = ("content-type", b"application/json")


def _record(
    event_id: str, source: str, event_type: str, time: datetime, subject: str, data: EventData
) -> EncodedRecord:
    """:func:`streams.core.domain.codec.encode` of the envelope these attributes make, without
    building the envelope (the attributes were validated with its constraints): the
    same headers in the same order (a unit test compares the two)."""
    key = subject.encode()
    return EncodedRecord(
        key=key,
        value=data.model_dump_json().encode(),
        headers=[
            _SPECVERSION,
            ("ce_id", event_id.encode()),
            ("ce_source", source.encode()),
            ("ce_type", event_type.encode()),
            ("ce_time", time.isoformat().replace("+00:00", "Z").encode()),
            ("ce_subject", key),
            _CONTENT_TYPE,
        ],
    )


def _summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:8]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)
