"""Validation at the ingest edge (streams/apps/ingest/edge.py): what is refused, with which
status, before anything is produced; what is accepted is exactly the topic's record."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from streams.apps.ingest.edge import BATCH, SINGLE, BodyError, Invalid, Valid, parse_body, validate
from streams.core.domain.codec import decode

NOW = datetime(2024, 9, 30, 12, tzinfo=UTC)


def event(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "specversion": "1.0",
        "id": "e-1",
        "source": "crm",
        "type": "usage.metered",
        "data": {
            "customer_id": "acme",
            "metric": "api_calls",
            "event_time": "2024-09-03T10:00:00Z",
            "properties": {"billable": "true"},
        },
    }
    base.update(overrides)
    return base


def test_a_valid_event_becomes_the_topics_binary_record() -> None:
    result = validate(0, event(), received_at=NOW)
    assert isinstance(result, Valid)
    envelope = decode(result.record.key, result.record.value, result.record.headers)
    assert envelope.id == "e-1" and envelope.subject == "acme" and envelope.time == NOW
    assert result.record.key == b"acme"
    same = validate(0, event(source="elsewhere", time="2024-09-04T00:00:00Z"), received_at=NOW)
    assert isinstance(same, Valid) and same.digest == result.digest  # content = type + data


@pytest.mark.parametrize(
    ("change", "status"),
    [
        ({"specversion": "0.3"}, 400),
        ({"id": ""}, 400),
        ({"source": None}, 400),
        ({"traceparent": "x"}, 400),
        ({"datacontenttype": "text/xml"}, 400),
        ({"type": "nope"}, 400),
        ({"type": "invoice.issued"}, 400),
        ({"type": "billing_period.closed"}, 403),
        ({"subject": "someone"}, 422),
        ({"time": "2024-09-03T10:00:00"}, 400),
        ({"data": {"customer_id": "acme", "metric": "api_calls"}}, 422),
        (
            {
                "data": {
                    "customer_id": "a b",
                    "metric": "api_calls",
                    "event_time": "2024-09-03T10:00:00Z",
                }
            },
            422,
        ),
    ],
)
def test_refusals(change: dict[str, Any], status: int) -> None:
    result = validate(3, event(**change), received_at=NOW)
    assert isinstance(result, Invalid), change
    assert (result.index, result.status) == (3, status), result


def test_bodies() -> None:
    one = json.dumps(event()).encode()
    assert parse_body(one, SINGLE, max_events=10) == ([event()], False)
    assert parse_body(
        json.dumps([event(), event()]).encode(), f"{BATCH}; charset=utf-8", max_events=10
    )[1]
    for body, content_type, status in [
        (one, "application/json", 415),
        (one, None, 415),
        (b"\xff", SINGLE, 400),
        (b"[1,", BATCH, 400),
        (one, BATCH, 400),
        (b"[]", BATCH, 400),
        (json.dumps([event()] * 11).encode(), BATCH, 413),
        (b'{"amount": 1.5}', SINGLE, 400),
        (b'{"amount": NaN}', SINGLE, 400),
    ]:
        with pytest.raises(BodyError) as caught:
            parse_body(body, content_type, max_events=10)
        assert caught.value.status == status, (body[:20], content_type)


def test_the_one_pass_batch_path_gives_the_per_event_paths_records() -> None:
    from streams.apps.ingest.edge import validate_batch_fast
    from streams.apps.usage_view.scenario import ScenarioConfig, events
    from streams.apps.usage_view.state import digest

    envelopes = list(events(ScenarioConfig(customers=6, seed=3)))
    items = [
        {
            "specversion": "1.0",
            "id": e.id,
            "source": e.source,
            "type": e.type,
            **({"subject": e.subject} if n % 2 else {}),
            **({"time": e.time.isoformat()} if n % 3 else {}),
            "data": e.data.model_dump(mode="json"),
        }
        for n, e in enumerate(envelopes)
    ]
    body = json.dumps(items).encode()
    fast = validate_batch_fast(body, received_at=NOW)
    assert fast is not None and len(fast) == len(items)
    slow = [
        validate(i, item, received_at=NOW)
        for i, item in enumerate(parse_body(body, BATCH, max_events=10_000)[0])
    ]
    for quick, checked, envelope in zip(fast, slow, envelopes, strict=True):
        assert isinstance(checked, Valid)
        assert quick.record == checked.record and quick.digest == checked.digest
        assert quick.digest == digest(envelope)  # the edge's digest is the view's
        decode(quick.record.key, quick.record.value, quick.record.headers)
    # any refusal sends the batch to the per-event path (which names it)
    for broken in (
        [*items[:2], event(type="billing_period.closed")],
        [*items[:2], {**items[0], "subject": "other"}],
        [*items[:2], {**items[0], "time": 1725357600}],
        [*items[:2], {**items[0], "data": {**items[0]["data"], "amount": 1.5}}],
    ):
        assert validate_batch_fast(json.dumps(broken).encode(), received_at=NOW) is None
