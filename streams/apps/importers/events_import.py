"""``invoicing import events FILE``: CloudEvents JSON lines → ``billing.account-events.v1``.

For systems that export their events to a file rather than produce them to
Kafka, and for the pricing scenario (:mod:`streams.devtools.demo.pricing.generator`
writes such a file). Each non-blank line is one event in the CloudEvents 1.0
**JSON event format** (structured: ``specversion``, ``id``, ``source``, ``type``,
``time``, ``subject``, optional ``datacontenttype`` = ``application/json``, and
``data`` as a JSON object)::

    {"specversion":"1.0","id":"…","source":"/meter","type":"usage.metered",
     "time":"2024-11-03T14:22:05Z","subject":"acme",
     "data":{"customer_id":"acme","metric":"api_calls","event_time":"2024-11-03T14:22:05Z",
             "properties":{"endpoint":"/v1/search","billable":"true"},"values":{"calls":"1200"}}}

Every line is validated as the workers will decode it: the type must be one the
account-events topic carries and that may be imported (``customer.upserted``,
``usage.recorded``, ``usage.metered``, ``subscription.started``/``changed``/``ended``;
not ``billing_period.closed``, which only ``close-period`` sends, under its lease),
``data`` must validate against the type's contract (:mod:`streams.core.domain.events`),
and ``data.customer_id`` must equal ``subject`` (the record key). Unknown
attributes (CloudEvents extensions) are refused rather than dropped, since the
binary mode here carries none; ``data_base64`` is not accepted.

Valid events are produced **in file order**, re-encoded in binary content mode
(:func:`streams.core.domain.codec.encode`; key = customer id), with their own ``id``,
``source`` and ``time``, by the producer the caller gives
(:func:`streams.bootstrap.producer`: murmur2, idempotent, ``acks=all``). A
customer's events keep the file's order on its partition. Re-importing a file is
safe: the workers deduplicate by event id (a repeated id in the file is produced
again, and deduplicated the same way).

A line that does not validate is reported with its line number and reason, and
the import goes on. Delivery reports are checked and the producer flushed as in
:mod:`streams.apps.importers.focus_import` (the same exit codes: 0 delivered, skipped
lines printed; 1 a delivery failed or Kafka/the topic is unavailable; 2 the file
cannot be read; 3 ``--strict`` and a line was skipped).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

from confluent_kafka import Producer
from pydantic import ValidationError

from streams.adapters.progress import progress_bar
from streams.apps.importers import SourceUnreadable
from streams.apps.importers.focus_import import (
    FLUSH_TIMEOUT_S,
    DeliveryFailure,
    DeliveryTracker,
    SkippedRow,
    account_events_topic,
    require_topic,
)
from streams.core.domain.codec import encode
from streams.core.domain.events import EVENT_TYPES, Envelope
from streams.errors import InvoicingError
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS

logger = logging.getLogger(__name__)

__all__ = [
    "IMPORTABLE_TYPES",
    "EventLine",
    "EventsImportSummary",
    "ImportEventsRun",
    "import_events",
    "parse_event_line",
    "read_event_lines",
]

#: The event types a file may carry: the account-events topic's, except the close
#: marker (close-period sends it under its lease, after recording the request).
IMPORTABLE_TYPES: tuple[str, ...] = tuple(
    name for name in ACCOUNT_EVENTS.event_types if name != "billing_period.closed"
)

_ATTRIBUTES = frozenset(
    {"specversion", "id", "source", "type", "time", "subject", "datacontenttype", "data"}
)
_REQUIRED = ("specversion", "id", "source", "type", "time", "subject", "data")


class EventLineError(InvoicingError, ValueError):
    """A line that is not an importable CloudEvent; the message says why."""


@dataclass(frozen=True)
class EventLine:
    """One line of the file: its number (1-based) and the envelope, or why not."""

    line_number: int
    envelope: Envelope | None
    reason: str | None = None
    event_id: str | None = None


def parse_event_line(text: str, allowed: tuple[str, ...] = IMPORTABLE_TYPES) -> Envelope:
    """The envelope of one CloudEvents JSON line, its data validated.

    Raises:
        EventLineError: not JSON, not an object, a missing or unknown attribute, a
            ``specversion`` other than 1.0, a content type other than JSON, a type
            not in ``allowed``, data that does not validate, or a ``subject`` other
            than ``data.customer_id``.
    """
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EventLineError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise EventLineError("not a JSON object")
    missing = [name for name in _REQUIRED if name not in raw]
    if missing:
        raise EventLineError(f"missing attribute(s): {', '.join(missing)}")
    unknown = sorted(set(raw) - _ATTRIBUTES)
    if unknown:
        raise EventLineError(f"unknown attribute(s) (not carried in binary mode): {unknown}")
    if raw["specversion"] != "1.0":
        raise EventLineError(f"unsupported specversion {raw['specversion']!r}")
    content_type = raw.get("datacontenttype", "application/json")
    if content_type != "application/json":
        raise EventLineError(f"unsupported datacontenttype {content_type!r}")
    event_type = raw["type"]
    if event_type not in allowed:
        raise EventLineError(
            f"type {event_type!r} cannot be imported (importable: {', '.join(allowed)})"
        )
    model = EVENT_TYPES[event_type]
    try:
        data = model.model_validate(raw["data"])
    except ValidationError as exc:
        raise EventLineError(f"invalid {event_type} data: {_summary(exc)}") from None
    customer = getattr(data, "customer_id", None)
    if customer != raw["subject"]:
        raise EventLineError(
            f"subject {raw['subject']!r} differs from data.customer_id {customer!r}"
        )
    try:
        moment = datetime.fromisoformat(str(raw["time"]).replace("Z", "+00:00"))
        return Envelope(
            id=raw["id"],
            source=raw["source"],
            type=event_type,
            time=moment,
            subject=raw["subject"],
            data=data,
        )
    except (ValidationError, ValueError, TypeError) as exc:
        detail = _summary(exc) if isinstance(exc, ValidationError) else str(exc)
        raise EventLineError(f"invalid CloudEvents attributes: {detail}") from None


def _summary(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
        parts.append(f"{loc}: {err.get('msg')}")
    return "; ".join(parts)


def read_event_lines(handle: TextIO) -> Iterator[EventLine]:
    """Every non-blank line of ``handle``, parsed (:func:`parse_event_line`)."""
    for number, text in enumerate(handle, start=1):
        if not text.strip():
            continue
        try:
            yield EventLine(number, parse_event_line(text))
        except EventLineError as exc:
            yield EventLine(number, None, str(exc), _id_of(text))


def _id_of(text: str) -> str | None:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        return None
    found = raw.get("id") if isinstance(raw, dict) else None
    return found if isinstance(found, str) else None


@dataclass(frozen=True)
class EventsImportSummary:
    """What an events import did.

    Attributes:
        path, topic: the file read and the topic produced to.
        lines: non-blank lines read.
        delivered: events Kafka confirmed, per type.
        skipped: every line that did not validate (line number, reason, its id if any).
        delivery_failures: every record Kafka did not confirm.
        customers: distinct customers among the valid events.
        elapsed_s: wall time of the whole import (seconds).
    """

    path: str
    topic: str
    lines: int
    delivered: Mapping[str, int]
    skipped: tuple[SkippedRow, ...]
    delivery_failures: tuple[DeliveryFailure, ...]
    customers: int
    elapsed_s: float

    @property
    def produced(self) -> int:
        """Events Kafka confirmed, every type."""
        return sum(self.delivered.values())

    @property
    def ok(self) -> bool:
        """Whether every valid line was delivered."""
        return not self.delivery_failures

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON-ready data (the CLI's ``--json``)."""
        return {
            "path": self.path,
            "topic": self.topic,
            "ok": self.ok,
            "lines": self.lines,
            "produced": self.produced,
            "delivered": dict(self.delivered),
            "skipped": len(self.skipped),
            "skipped_lines": [
                {"line": s.line_number, "reason": s.reason, "id": s.event_id} for s in self.skipped
            ],
            "delivery_failures": [
                {
                    "event_id": f.event_id,
                    "type": f.event_type,
                    "customer_id": f.customer_id,
                    "line": f.line_number,
                    "error": f.error,
                }
                for f in self.delivery_failures
            ],
            "customers": self.customers,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def _count_lines(path: Path) -> int | None:
    try:
        with path.open(encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    except UnicodeDecodeError:
        return None


def import_events(
    path: Path,
    settings: Settings,
    *,
    producer: Producer,
    progress: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
) -> EventsImportSummary:
    """Import the CloudEvents JSON-lines file at ``path`` into the account-events topic.

    Args:
        path: the file (UTF-8).
        settings: the topic prefix.
        producer: the producer to use (flushed, not closed).
        progress: show a progress bar on stderr.
        flush_timeout_s: how long to wait for the last delivery reports (seconds).

    Raises:
        SourceUnreadable: the file is missing or not UTF-8 (nothing produced when it
            is missing; the lines before a bad byte were produced and flushed).
        KafkaUnavailable, TopicMissing: as :func:`~streams.apps.importers.focus_import.require_topic`;
            nothing was produced.
    """
    started = time.monotonic()
    topic = account_events_topic(settings)
    if not path.is_file():
        raise SourceUnreadable(f"{path}: no such file")
    require_topic(producer, topic)
    total = _count_lines(path) if progress else None
    tracker = DeliveryTracker()
    skipped: list[SkippedRow] = []
    customers: set[str] = set()
    lines = 0
    with (
        path.open(encoding="utf-8") as handle,
        progress_bar(progress) as bar,
    ):
        task = bar.add_task(f"import {path.name}", total=total) if bar is not None else None
        try:
            for line in read_event_lines(handle):
                lines += 1
                if bar is not None and task is not None and lines % 500 == 0:
                    bar.update(task, completed=lines)
                if line.envelope is None:
                    skipped.append(SkippedRow(line.line_number, line.reason or "", line.event_id))
                    logger.warning(
                        "%s line %d skipped: %s", path.name, line.line_number, line.reason
                    )
                    continue
                envelope = line.envelope
                customers.add(envelope.subject)
                tracker.produce(producer, topic, encode(envelope), envelope, line.line_number)
        except UnicodeDecodeError as exc:
            raise SourceUnreadable(
                f"{path}: not UTF-8 ({exc}); the lines before it were produced, "
                "a re-import of the fixed file deduplicates"
            ) from exc
        finally:
            if bar is not None and task is not None:
                bar.update(task, completed=lines)
            tracker.flush(producer, flush_timeout_s)
    summary = EventsImportSummary(
        path=str(path),
        topic=topic,
        lines=lines,
        delivered=dict(sorted(tracker.delivered.items())),
        skipped=tuple(skipped),
        delivery_failures=tuple(tracker.failures),
        customers=len(customers),
        elapsed_s=time.monotonic() - started,
    )
    logger.info(
        "imported %s: %d lines, %d events delivered, %d skipped, %d delivery failures",
        path.name,
        lines,
        summary.produced,
        len(skipped),
        len(tracker.failures),
    )
    return summary


class ImportEventsRun(Protocol):
    """:func:`import_events` with its producer wired in by the composition root
    (:func:`streams.bootstrap.run_import_events`)."""

    def __call__(
        self, path: Path, settings: Settings, *, progress: bool = ...
    ) -> EventsImportSummary: ...
