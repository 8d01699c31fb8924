"""Finding 4, edge robustness (docs/security.md "The ingest edge"): hostile bodies and
headers get a 4xx problem, never a 500, and the idempotency claim knows CloudEvents'
identity of an event, ``source`` + ``id``.

Before the fixes: a deeply nested body answered 500 (``RecursionError`` out of
``json.loads``), so did a bearer token whose bytes are not UTF-8 (``str.encode`` of the
surrogates aiohttp decodes them to); the same ``id`` from another ``source`` was answered
``duplicate`` and silently dropped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.security.edge import BATCH, SINGLE, dumps, make_edge, serve, usage_event


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("content_type", [SINGLE, BATCH])
def test_a_deeply_nested_body_is_a_400_problem(
    tmp_path: Path, depth: int, content_type: str
) -> None:
    edge = make_edge(tmp_path)
    bodies = [
        nested(depth),  # the whole body
        b'{"specversion": "1.0", "id": "n-1", "source": "s", "type": "usage.recorded", '
        b'"data": {"customer_id": "acme", "deep": ' + nested(depth) + b"}}",
    ]
    if content_type == BATCH:
        bodies = [b"[" + body + b"]" for body in bodies]

    async def work(client: TestClient[Any, Any], _: TestServer) -> list[tuple[int, str]]:
        out = []
        for body in bodies:
            response = await client.post(
                "/v1/events",
                data=body,
                headers={"Authorization": f"Bearer {edge.key}", "Content-Type": content_type},
            )
            out.append((response.status, response.headers.get("Content-Type", "")))
        return out

    for status, kind in serve(edge, work):
        assert status == 400
        assert kind.startswith("application/problem+json")
    assert edge.produced == []


async def _raw_post(server: TestServer, authorization: bytes) -> int:
    """The status of a POST whose Authorization header carries ``authorization`` as is
    (HTTP clients refuse to send bytes that are not their header encoding)."""
    body = dumps([usage_event("raw-1")])
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /v1/events HTTP/1.1\r\nHost: edge\r\nConnection: close\r\n"
        b"Authorization: " + authorization + b"\r\n"
        b"Content-Type: " + BATCH.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return int(status_line.split()[1])


def test_a_bearer_token_that_is_not_utf8_or_not_ascii_is_a_401(tmp_path: Path) -> None:
    edge = make_edge(tmp_path)
    prefix = f"ik_{edge.key_id}.".encode()  # a live key's id: the hash is then computed
    tokens = [
        b"Bearer " + prefix + b"\xff\xfe\x80",  # not UTF-8
        b"Bearer " + prefix + "cl\u00e9".encode(),  # UTF-8, not ASCII
        b"Bearer \xff" + prefix,
        b"Bearer " + edge.key.encode(),  # the live key itself: accepted
    ]

    async def work(_: TestClient[Any, Any], server: TestServer) -> list[int]:
        return [await _raw_post(server, token) for token in tokens]

    assert serve(edge, work) == [401, 401, 401, 200]
    assert [v.event_id for v in edge.produced] == ["raw-1"]


def test_the_idempotency_claim_is_source_and_id(tmp_path: Path) -> None:
    edge = make_edge(tmp_path)
    headers = {"Authorization": f"Bearer {edge.key}", "Content-Type": SINGLE}

    async def work(client: TestClient[Any, Any], _: TestServer) -> list[tuple[int, Any]]:
        out = []
        for event in (
            usage_event("same-id", source="crm/a"),
            usage_event("same-id", source="crm/a"),  # a resend: duplicate
            usage_event("same-id", source="crm/b"),  # another event under the same id
            usage_event("same-id", source="crm/b", amount="9.99"),
        ):
            response = await client.post("/v1/events", data=dumps(event), headers=headers)
            out.append((response.status, await response.json()))
        # the same two events in one batch request
        response = await client.post(
            "/v1/events",
            data=dumps([usage_event("pair", source="crm/a"), usage_event("pair", source="crm/b")]),
            headers={**headers, "Content-Type": BATCH},
        )
        out.append((response.status, await response.json()))
        return out

    first, resend, other_source, other_both, pair = serve(edge, work)
    assert first[0] == 200 and first[1]["accepted"] == 1
    assert resend[0] == 200 and resend[1]["duplicates"] == 1
    # the consumers deduplicate by id alone: an id another source sent is a conflict,
    # answered at once, never a silent "duplicate" (nor a conflict found downstream)
    assert other_source[0] == 409, other_source
    assert other_both[0] == 409, other_both
    assert pair[0] == 207
    assert [r["status"] for r in pair[1]["results"]] == ["accepted", "rejected"]
    assert pair[1]["results"][1]["error"]["status"] == 409
    assert [(v.event_id, v.source) for v in edge.produced] == [
        ("same-id", "crm/a"),
        ("pair", "crm/a"),
    ]


def test_an_id_that_is_no_unicode_string_is_a_400_problem(tmp_path: Path) -> None:
    """A JSON escape of a lone surrogate (``"\\udcff"``) decodes to a Python string that has
    no UTF-8 form: the refusal may not echo it (the problem would not serialize: 500)."""
    edge = make_edge(tmp_path)
    event = dumps(usage_event("placeholder")).replace(b'"placeholder"', b'"x\\udcff"')

    async def work(client: TestClient[Any, Any], _: TestServer) -> list[int]:
        out = []
        for body, content_type in ((event, SINGLE), (b"[" + event + b"]", BATCH)):
            response = await client.post(
                "/v1/events",
                data=body,
                headers={"Authorization": f"Bearer {edge.key}", "Content-Type": content_type},
            )
            out.append(response.status)
        return out

    assert serve(edge, work) == [400, 400]
    assert edge.produced == []
