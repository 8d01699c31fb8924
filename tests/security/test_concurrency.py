"""Finding 3, the rest (docs/security.md "Back-pressure"): the edge had no bound on the
requests in flight, per key or in total, so one client could hold every connection while
its records waited for the broker; and a delivery timeout was answered 503 "Not delivered"
although the record may be delivered later. Now a request over a key's bound is a 429, over
the total bound a 503, both at once with ``Retry-After``; a timeout is the event status
``unknown`` with the problem type :data:`~streams.apps.ingest.server.OUTCOME_UNKNOWN` (504).

The pump's reports wait for a gate the test opens only after the second request was
answered: before the fix the second request waited behind the gate too (the test would
never open it, and the client's timeout ended it); the timeout was a "rejected" 503.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from streams.apps.ingest.server import OUTCOME_UNKNOWN
from tests.security.edge import SINGLE, GatedPump, dumps, make_edge, serve, usage_event


def _second_request_while_the_first_waits(
    edge: Any, second_key: str | None = None
) -> tuple[int, str | None, int]:
    async def work(client: TestClient[Any, Any], _: TestServer) -> tuple[int, str | None, int]:
        headers = {"Authorization": f"Bearer {edge.key}", "Content-Type": SINGLE}
        first = asyncio.create_task(
            client.post("/v1/events", data=dumps(usage_event("w-1")), headers=headers)
        )
        while not edge.produced:  # the first request is waiting for its report
            await asyncio.sleep(0.01)
        other = {**headers, "Authorization": f"Bearer {second_key or edge.key}"}
        second = await client.post(
            "/v1/events",
            data=dumps(usage_event("w-2")),
            headers=other,
            timeout=ClientTimeout(total=10),
        )
        pump = edge.pumps[0]
        assert isinstance(pump, GatedPump)
        pump.gate.set()
        done = await first
        return second.status, second.headers.get("Retry-After"), done.status

    result: tuple[int, str | None, int] = serve(edge, work)
    return result


def test_a_key_over_its_concurrency_bound_is_a_429_at_once(tmp_path: Path) -> None:
    edge = make_edge(tmp_path, pump=GatedPump, max_in_flight_per_key=1, max_in_flight=10)
    status, retry, first = _second_request_while_the_first_waits(edge)
    assert (status, retry, first) == (429, "1", 200)


def test_the_edge_over_its_total_bound_is_a_503_at_once(tmp_path: Path) -> None:
    edge = make_edge(tmp_path, pump=GatedPump, max_in_flight_per_key=5, max_in_flight=1)
    assert edge.keys is not None
    _, other = edge.keys.create("another client")
    status, retry, first = _second_request_while_the_first_waits(edge, other)
    assert (status, retry, first) == (503, "1", 200)


class _SilentPump(GatedPump):
    """Takes the records, never reports."""

    def __post_init__(self) -> None:
        self.hold = False


def test_a_delivery_timeout_is_an_unknown_outcome_not_a_refusal(tmp_path: Path) -> None:
    edge = make_edge(tmp_path, pump=_SilentPump, delivery_timeout_s=0.05)

    async def work(client: TestClient[Any, Any], _: TestServer) -> tuple[int, Any, str | None]:
        response = await client.post(
            "/v1/events",
            data=dumps([usage_event("u-1")]),
            headers={
                "Authorization": f"Bearer {edge.key}",
                "Content-Type": "application/cloudevents-batch+json",
            },
        )
        return (
            response.status,
            await response.json(content_type=None),
            response.headers.get("Retry-After"),
        )

    status, body, retry = serve(edge, work)
    assert status == 504, body
    assert body["type"] == OUTCOME_UNKNOWN and retry == "1"
    result = body["results"][0]
    assert result["status"] == "unknown"
    assert result["error"]["type"] == OUTCOME_UNKNOWN and result["error"]["status"] == 504
