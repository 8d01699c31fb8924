"""``invoicing import events``: the parsing of CloudEvents JSON lines (no Kafka here)."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from typing import Any

import pytest

from streams.apps.importers.events_import import (
    IMPORTABLE_TYPES,
    EventLineError,
    parse_event_line,
    read_event_lines,
)
from streams.core.domain.codec import decode, encode
from streams.core.domain.events import UsageMetered


def line(**changes: Any) -> str:
    event: dict[str, Any] = {
        "specversion": "1.0",
        "id": "e-1",
        "source": "/meter",
        "type": "usage.metered",
        "time": "2024-11-03T14:22:05Z",
        "subject": "acme",
        "datacontenttype": "application/json",
        "data": {
            "customer_id": "acme",
            "metric": "api_calls",
            "event_time": "2024-11-03T14:22:05Z",
            "properties": {"endpoint": "/v1/search"},
            "values": {"calls": "1200.0"},
        },
    }
    for name, value in changes.items():
        if value is None:
            event.pop(name, None)
        else:
            event[name] = value
    return json.dumps(event)


def test_a_line_becomes_the_envelope_the_workers_decode() -> None:
    envelope = parse_event_line(line())
    assert (envelope.id, envelope.type, envelope.subject) == ("e-1", "usage.metered", "acme")
    assert isinstance(envelope.data, UsageMetered)
    assert envelope.data.values == {"calls": Decimal("1200")}
    record = encode(envelope)
    decoded = decode(record.key, record.value, record.headers)
    assert decoded == envelope and record.key == b"acme"


def test_datacontenttype_is_optional_and_the_close_marker_is_not_importable() -> None:
    assert parse_event_line(line(datacontenttype=None)).id == "e-1"
    assert "billing_period.closed" not in IMPORTABLE_TYPES
    assert {"usage.metered", "subscription.changed", "usage.recorded"} <= set(IMPORTABLE_TYPES)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (line(id=None), "missing attribute(s): id"),
        (line(partitionkey="acme"), "unknown attribute(s)"),
        (line(specversion="0.3"), "unsupported specversion"),
        (line(datacontenttype="text/plain"), "unsupported datacontenttype"),
        (line(type="billing_period.closed"), "cannot be imported"),
        (line(type="invoice.issued"), "cannot be imported"),
        (line(subject="globex"), "differs from data.customer_id"),
        (line(time="yesterday"), "invalid CloudEvents attributes"),
        (
            line(data={"customer_id": "acme", "metric": "x", "event_time": "2024-11-03T00:00:00"}),
            "invalid usage.metered data: event_time",
        ),
        (
            line(data={"customer_id": "acme", "metric": "x", "event_time": "2024-11-03T00:00:00Z",
                       "values": {"calls": 3.5}}),
            "invalid usage.metered data",
        ),
    ],
)  # fmt: skip
def test_a_bad_line_says_why(text: str, reason: str) -> None:
    with pytest.raises(EventLineError) as caught:
        parse_event_line(text)
    assert reason in str(caught.value)


def test_lines_are_numbered_blank_ones_skipped_and_bad_ones_reported_with_their_id() -> None:
    text = "\n".join([line(), "", line(id="e-2", subject="other"), "{oops", line(id="e-3")])
    results = list(read_event_lines(io.StringIO(text + "\n")))
    assert [(r.line_number, r.envelope is not None) for r in results] == [
        (1, True),
        (3, False),
        (4, False),
        (5, True),
    ]
    assert results[1].event_id == "e-2" and "differs" in (results[1].reason or "")
    assert results[2].event_id is None
