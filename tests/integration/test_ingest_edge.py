"""The HTTP ingest edge on the real stack (docs/usage-api.md): authentication, validation, limits,
idempotency, and that nothing it refuses reaches the topic.

The edge runs as its own process (``invoicing worker ingest --port N``) against the
sandbox's topic, a key file of the test and the real Redis (claims under the
sandbox's prefix).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.bootstrap import api_key_store
from streams.core.domain.codec import decode
from streams.core.domain.events import event_models
from streams.devtools.sandbox.smtp import free_port
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS
from tests.support.kafka import headers_of, read_to_end
from tests.support.pipeline import Pipeline, isolated_pipeline
from tests.support.usage_view import health, start_view, usage_ok, wait_assigned, wait_until

BATCH = "application/cloudevents-batch+json"
SINGLE = "application/cloudevents+json"


@pytest.fixture
def edge(
    settings: Settings, unique: str, tmp_path: Path
) -> Iterator[tuple[Pipeline, str, str, str]]:
    """(pipeline, base URL, a live key, a revoked key's token). No connector or SMTP sink:
    the edge writes account events only."""
    with isolated_pipeline(settings, unique, tmp_path, connector=False, smtp=False) as p:
        keys_file = tmp_path / "api-keys.json"
        ingest = p.settings.ingest.model_copy(
            update={"api_keys_file": keys_file, "max_body_bytes": 64_000, "max_batch_events": 50}
        )
        store = api_key_store(p.settings.model_copy(update={"ingest": ingest}))
        _, live = store.create("test client")
        revoked_id, revoked = store.create("old client")
        store.revoke(revoked_id)
        port = free_port()
        p.workers.start(
            "ingest",
            extra_env={
                "INVOICING_INGEST__API_KEYS_FILE": str(keys_file),
                "INVOICING_INGEST__MAX_BODY_BYTES": "64000",
                "INVOICING_INGEST__MAX_BATCH_EVENTS": "50",
            },
            args=["--port", str(port)],
        )
        wait_until("the edge", lambda: health(port), p, 60)
        yield p, f"http://127.0.0.1:{port}", live, revoked


def usage_event(
    event_id: str, customer: str = "acme", amount: str = "1.25", **data: Any
) -> dict[str, Any]:
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": "test/edge",
        "type": "usage.recorded",
        "subject": customer,
        "data": {
            "customer_id": customer,
            "billing_period": "2024-09",
            "amount": amount,
            "currency": "USD",
            "event_time": "2024-09-03T10:00:00Z",
            **data,
        },
    }


def post(
    url: str, key: str | None, body: Any, content_type: str = BATCH, raw: bytes | None = None
) -> httpx.Response:
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(f"{url}/v1/events", content=content, headers=headers, timeout=30)


def test_authentication_limits_and_malformed_bodies(edge: tuple[Pipeline, str, str, str]) -> None:
    p, url, live, revoked = edge
    body = [usage_event("a-1")]
    for key in (None, "not-a-key", live + "x", revoked):
        response = post(url, key, body)
        assert response.status_code == 401, (key, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        assert response.headers["www-authenticate"].startswith("Bearer")
    assert post(url, live, body, content_type="application/json").status_code == 415
    malformed = post(url, live, None, raw=b"[{not json")
    assert malformed.status_code == 400 and malformed.json()["title"] == "Malformed body"
    assert post(url, live, {"id": "x"}).status_code == 400  # a batch must be an array
    assert post(url, live, []).status_code == 400
    floats = post(
        url, live, None, raw=json.dumps([usage_event("f-1")]).replace('"1.25"', "1.25").encode()
    )
    assert floats.status_code == 400 and "decimals as strings" in floats.json()["detail"]
    too_many = post(url, live, [usage_event(f"m-{i}") for i in range(51)])
    assert too_many.status_code == 413 and too_many.json()["title"] == "Batch too large"
    oversize = post(url, live, [usage_event("big", description="x" * 70_000)])
    assert oversize.status_code == 413, oversize.text
    # nothing of the above reached the topic (the edge answers after the broker confirmed
    # a write, so the end offsets hold all it wrote: no idle wait)
    assert read_to_end(p.settings.kafka, p.topic) == []


def test_validation_idempotency_and_only_valid_events_reach_the_topic(
    edge: tuple[Pipeline, str, str, str],
) -> None:
    p, url, live, _ = edge
    # one event, structured mode
    single = post(url, live, usage_event("e-1"), content_type=SINGLE)
    assert single.status_code == 200, single.text
    assert single.json()["results"][0]["status"] == "accepted"
    # a refused single event is a problem with its own status
    bad = post(url, live, usage_event("e-bad", amount="one"), content_type=SINGLE)
    assert bad.status_code == 422 and bad.headers["content-type"].startswith(
        "application/problem+json"
    )
    closed = {
        "specversion": "1.0",
        "id": "close-1",
        "source": "x",
        "type": "billing_period.closed",
        "data": {
            "customer_id": "acme",
            "billing_period": "2024-09",
            "closed_at": "2024-10-01T00:00:00Z",
        },
    }
    assert post(url, live, closed, content_type=SINGLE).status_code == 403
    # a batch: accepted, duplicate (same id, same content), conflict, invalid, subject mismatch,
    # extension attribute, unknown type, the same id twice in the request
    batch = [
        usage_event("e-2"),
        usage_event("e-1"),  # resend of e-1: duplicate
        usage_event("e-1", amount="9.99"),  # e-1 with other content: 409
        usage_event("e-3", currency="usd"),  # invalid data: 422
        {**usage_event("e-4"), "subject": "someone-else"},  # 422
        {**usage_event("e-5"), "traceparent": "00-x"},  # extension attribute: 400
        {**usage_event("e-6"), "type": "usage.invented"},  # 400
        usage_event("e-7", customer="/subscriptions/zz"),
        usage_event("e-7", customer="/subscriptions/zz"),  # twice in one request: duplicate
        "not an object",  # 400
    ]
    response = post(url, live, batch)
    assert response.status_code == 207, response.text
    results = response.json()["results"]
    got = [(r.get("id"), r["status"], (r.get("error") or {}).get("status")) for r in results]
    assert got == [
        ("e-2", "accepted", None),
        ("e-1", "duplicate", None),
        ("e-1", "rejected", 409),
        ("e-3", "rejected", 422),
        ("e-4", "rejected", 422),
        ("e-5", "rejected", 400),
        ("e-6", "rejected", 400),
        ("e-7", "accepted", None),
        ("e-7", "duplicate", None),
        (None, "rejected", 400),
    ], got
    assert response.json()["accepted"] == 2 and response.json()["rejected"] == 6
    # a whole batch refused: problem+json with the per-event results
    refused = post(url, live, [usage_event("r-1", amount="x"), usage_event("r-2", amount="y")])
    assert refused.status_code == 422 and len(refused.json()["results"]) == 2
    # a resend of the whole first batch changes nothing on the topic
    again = post(url, live, batch)
    assert [r["status"] for r in again.json()["results"]][:2] == ["duplicate", "duplicate"]

    # The topic holds exactly e-1, e-2, e-7, once each, every one valid by the topic's contract.
    records = read_to_end(p.settings.kafka, p.topic)  # written before the answers (above)
    allowed = event_models(ACCOUNT_EVENTS.event_types)
    envelopes = [decode(r.key(), r.value(), headers_of(r), allowed=allowed) for r in records]
    assert sorted(e.id for e in envelopes) == ["e-1", "e-2", "e-7"]
    for record, envelope in zip(records, envelopes, strict=True):
        assert record.key() == envelope.subject.encode()
    by_id = {e.id: e for e in envelopes}
    assert str(by_id["e-1"].data.amount) == "1.25"


def test_events_through_the_edge_reach_the_view(edge: tuple[Pipeline, str, str, str]) -> None:
    p, url, live, _ = edge
    _, port = start_view(p, store="memory")
    wait_assigned(p, [port])
    customer = {
        "specversion": "1.0",
        "id": "c-1",
        "source": "test",
        "type": "customer.upserted",
        "data": {
            "customer_id": "/subscriptions/q",
            "name": "Q",
            "email": "q@example.com",
            "currency": "EUR",
        },
    }
    events = [customer] + [
        {
            **usage_event(f"q-{i}", customer="/subscriptions/q", amount="0.105"),
            "data": {
                **usage_event(f"q-{i}", customer="/subscriptions/q", amount="0.105")["data"],
                "currency": "EUR",
            },
        }
        for i in range(10)
    ]
    assert post(url, live, events).status_code == 200
    started = time.monotonic()
    body = wait_until(
        "edge events in the view",
        lambda: (lambda b: b if b and b["usage"]["pass_through"]["lines"] == 10 else None)(
            usage_ok(port, "/subscriptions/q", "2024-09")
        ),
        p,
    )
    assert (
        body["upcoming_invoice"]["subtotal"] == "1.05"
        and body["upcoming_invoice"]["currency"] == "EUR"
    )
    assert time.monotonic() - started < 60
