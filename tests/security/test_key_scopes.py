"""Finding 1, keys have no scope and leave no trace (docs/security.md "API keys"): any key
could send any event type for any customer from any ``source`` (change a customer's email,
start or end subscriptions), and the key that sent an event was not recorded. Now a key
carries permissions (event types; all customers, a list or an id prefix; allowed sources),
an out-of-scope event is refused 403 with a problem naming what was out of scope, the key id
travels as the record header ``invoicing_key_id``, and each key has a rate limit (429 with
``Retry-After``).

Before the fix ``create`` took no scope and every event below was accepted, without the
header.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from streams.apps.ingest.keys import ApiKeyFile
from streams.apps.ingest.server import KEY_ID_HEADER, OUT_OF_SCOPE
from tests.security.edge import BATCH, SINGLE, dumps, make_edge, serve, upsert_event, usage_event


def _auth(key: str, content_type: str = SINGLE) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "Content-Type": content_type}


def test_an_event_type_out_of_scope_is_a_403_naming_the_type(tmp_path: Path) -> None:
    edge = make_edge(tmp_path, scope={"event_types": ("usage.recorded",)})

    async def work(client: TestClient[Any, Any], _: TestServer) -> tuple[int, Any]:
        response = await client.post(
            "/v1/events", data=dumps(upsert_event("s-1")), headers=_auth(edge.key)
        )
        return response.status, await response.json(content_type=None)

    status, body = serve(edge, work)
    assert status == 403, body
    assert body["type"] == OUT_OF_SCOPE
    assert "customer.upserted" in body["detail"] and "type" in body["detail"]
    assert edge.produced == []


def _statuses(target: Any, events: list[Any]) -> list[tuple[int, Any]]:
    """Each event posted alone to ``target``: (status, body)."""

    async def work(client: TestClient[Any, Any], _: TestServer) -> list[tuple[int, Any]]:
        seen = []
        for event in events:
            response = await client.post("/v1/events", data=dumps(event), headers=_auth(target.key))
            seen.append((response.status, await response.json(content_type=None)))
        return seen

    result: list[tuple[int, Any]] = serve(target, work)
    return result


def test_a_customer_out_of_scope_is_refused_by_list_and_by_prefix(tmp_path: Path) -> None:
    listed = make_edge(tmp_path / "list", scope={"customers": ("acme",)})
    prefixed = make_edge(tmp_path / "prefix", scope={"customer_prefix": "eu-"})
    (ok, _), (status, body) = _statuses(
        listed, [usage_event("c-1", customer="acme"), usage_event("c-2", customer="globex")]
    )
    assert ok == 200
    assert status == 403 and body["type"] == OUT_OF_SCOPE and "globex" in body["detail"]
    (ok, _), (status, body) = _statuses(
        prefixed, [usage_event("p-1", customer="eu-acme"), usage_event("p-2", customer="us-acme")]
    )
    assert ok == 200
    assert status == 403 and "us-acme" in body["detail"] and "eu-" in body["detail"]


def test_a_source_out_of_scope_is_refused_within_a_batch(tmp_path: Path) -> None:
    edge = make_edge(tmp_path, scope={"sources": ("billing/eu",)})
    batch = [usage_event("b-1", source="billing/eu"), usage_event("b-2", source="billing/us")]

    async def work(client: TestClient[Any, Any], _: TestServer) -> tuple[int, Any]:
        response = await client.post(
            "/v1/events", data=dumps(batch), headers=_auth(edge.key, BATCH)
        )
        return response.status, await response.json()

    status, body = serve(edge, work)
    assert status == 207, body
    ok, refused = body["results"]
    assert ok["status"] == "accepted"
    assert refused["status"] == "rejected" and refused["error"]["status"] == 403
    assert refused["error"]["type"] == OUT_OF_SCOPE and "billing/us" in refused["error"]["detail"]
    assert [v.event_id for v in edge.produced] == ["b-1"]


def test_the_key_id_travels_as_a_record_header(tmp_path: Path) -> None:
    edge = make_edge(tmp_path)

    async def work(client: TestClient[Any, Any], _: TestServer) -> int:
        response = await client.post(
            "/v1/events",
            data=dumps([usage_event("h-1"), upsert_event("h-2")]),
            headers=_auth(edge.key, BATCH),
        )
        return response.status

    assert serve(edge, work) == 200
    for valid in edge.produced:
        assert (KEY_ID_HEADER, edge.key_id.encode()) in valid.record.headers


def test_a_key_over_its_rate_limit_is_a_429_with_retry_after(tmp_path: Path) -> None:
    edge = make_edge(tmp_path, scope={"rate_limit": "2/minute"})

    async def work(client: TestClient[Any, Any], _: TestServer) -> list[tuple[int, str | None]]:
        seen = []
        for n in range(3):
            response = await client.post(
                "/v1/events", data=dumps(usage_event(f"r-{n}")), headers=_auth(edge.key)
            )
            seen.append((response.status, response.headers.get("Retry-After")))
        return seen

    (s1, _), (s2, _), (s3, retry) = serve(edge, work)
    assert (s1, s2, s3) == (200, 200, 429)
    assert retry is not None and 1 <= int(retry) <= 60


def test_rotate_keeps_the_scope_and_retires_the_old_key(tmp_path: Path) -> None:
    keys = ApiKeyFile(tmp_path / "api-keys.json")
    old_id, old = keys.create("client", event_types=("usage.recorded",), customer_prefix="eu-")
    new_id, new = keys.rotate(old_id)
    assert keys.verify(old) is None
    fresh = keys.verify(new)
    assert fresh is not None and fresh.key_id == new_id != old_id
    assert fresh.event_types == ("usage.recorded",) and fresh.customer_prefix == "eu-"
    assert fresh.rotated_from == old_id


def test_a_key_without_the_ingest_scope_is_a_403_even_for_an_event_in_its_restrictions(
    tmp_path: Path,
) -> None:
    """Scopes (what a key may do) and restrictions (which events) both apply: a read-only
    key is refused before its events are looked at; an ingest key still gets the
    out-of-scope 403 for an event outside its restrictions (docs/security.md "API keys")."""
    reader = make_edge(
        tmp_path / "reader", scope={"scopes": ("usage:read",), "customers": ("acme",)}
    )
    ((status, body),) = _statuses(reader, [usage_event("r-1")])
    assert status == 403, body
    assert body.get("type") != OUT_OF_SCOPE and "'ingest'" in body["detail"]
    assert reader.produced == []
    both = make_edge(
        tmp_path / "both",
        scope={"scopes": ("ingest", "usage:read"), "event_types": ("usage.recorded",)},
    )
    ((status, body),) = _statuses(both, [upsert_event("s-1")])
    assert status == 403 and body["type"] == OUT_OF_SCOPE, body


def test_rotate_keeps_the_scopes_and_legacy_keys_are_ingest_only(tmp_path: Path) -> None:
    keys = ApiKeyFile(tmp_path / "api-keys.json")
    old_id, _ = keys.create("reader", scopes=("usage:read",), customer_prefix="eu-")
    _, new = keys.rotate(old_id)
    fresh = keys.verify(new)
    assert fresh is not None and fresh.scopes == ("usage:read",)
    assert fresh.customer_prefix == "eu-" and fresh.may_read("eu-1") and not fresh.may_read("us-1")
    _, plain = keys.create("edge client")
    key = keys.verify(plain)
    assert key is not None and key.allows("ingest") and not key.allows("usage:read")
