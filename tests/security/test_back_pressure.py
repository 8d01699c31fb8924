"""Finding 3, back-pressure at the edge (docs/security.md "Back-pressure"), in part: when the
producer's local queue is full, the edge answered only once there was room, sleeping on its
event loop meanwhile, so the whole edge (``/health`` included) stalled, for as long as the
broker stayed away. Now the events that found no room are answered 503 with ``Retry-After``
at once (they were never produced: their claims are released, so the retry is produced).

The edge runs with the real :class:`~streams.apps.ingest.server.DeliveryPump` over a
producer whose queue takes ``room`` records and never drains, on a thread of its own, and
the client has a 10-second timeout: before the fix the request never got an answer and the
client timed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from streams.apps.ingest.idempotency import MemoryIdempotency
from streams.apps.ingest.keys import ApiKeyFile
from streams.apps.ingest.server import DeliveryPump, EdgeConfig, create_edge
from tests.security.edge import BATCH, TOPIC, dumps, usage_event


class FullProducer:
    """A producer whose local queue holds ``room`` records and never drains (the broker is
    away): each record it took is reported delivered only when ``deliver()`` is called."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken: list[Callable[[Any, Any], None]] = []
        self.lock = threading.Lock()

    def produce(self, topic: str, *, on_delivery: Callable[[Any, Any], None], **_: Any) -> None:
        with self.lock:
            if len(self.taken) >= self.room:
                raise BufferError("Local: Queue full")
            self.taken.append(on_delivery)

    def poll(self, timeout: float) -> int:
        threading.Event().wait(timeout)
        return 0

    def flush(self, timeout: float) -> int:
        return 0


class _Message:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[tuple[str, str, FullProducer]]:
    """(base URL, a live key, the producer) of an edge served on a thread of its own."""
    keys = ApiKeyFile(tmp_path / "api-keys.json")
    _, key = keys.create("back-pressure test")
    producer = FullProducer(room=2)
    config = EdgeConfig("127.0.0.1", 0, TOPIC, 4_000_000, 500, delivery_timeout_s=5.0)
    app = create_edge(
        config,
        pump_factory=lambda loop: DeliveryPump(producer, loop),  # type: ignore[arg-type]
        keys=keys,
        idempotency=MemoryIdempotency(),
    )
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", key, producer
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_a_full_producer_queue_is_a_503_with_retry_after_at_once(
    edge: tuple[str, str, FullProducer],
) -> None:
    url, key, producer = edge
    headers = {"Authorization": f"Bearer {key}", "Content-Type": BATCH}
    with httpx.Client(base_url=url, timeout=10.0) as client:
        # two events fit, the third finds no room and is not waited for; the two wait for
        # their reports, which the test delivers after /health answered meanwhile
        posted: dict[str, httpx.Response] = {}

        def post() -> None:
            body = dumps([usage_event(f"bp-{i}") for i in range(3)])
            with contextlib.suppress(httpx.HTTPError):  # no answer: asserted below
                posted["first"] = client.post("/v1/events", content=body, headers=headers)

        sender = threading.Thread(target=post)
        sender.start()
        while len(producer.taken) < 2 and sender.is_alive():
            threading.Event().wait(0.01)
        assert client.get("/health").status_code == 200  # the loop is not stalled
        for n, report in enumerate(producer.taken):
            report(None, _Message(n))
        sender.join()
        assert "first" in posted, "the edge never answered the request"
        first = posted["first"]
        assert first.status_code == 207, first.text
        assert first.headers["Retry-After"] == "1"
        statuses = [(r["id"], r["status"]) for r in first.json()["results"]]
        assert statuses == [("bp-0", "accepted"), ("bp-1", "accepted"), ("bp-2", "rejected")]
        assert first.json()["results"][2]["error"]["status"] == 503
        # the queue stays full: a request of its own is a 503 problem, answered at once
        again = client.post("/v1/events", content=dumps([usage_event("bp-2")]), headers=headers)
        assert again.status_code == 503, again.text
        assert again.headers["Retry-After"] == "1"
        assert again.headers["Content-Type"].startswith("application/problem+json")
        # its claim was released: once there is room, the retry is produced (not a duplicate)
        producer.room = 3
        retry: dict[str, httpx.Response] = {}
        sender = threading.Thread(
            target=lambda: retry.setdefault(
                "r",
                client.post("/v1/events", content=dumps([usage_event("bp-2")]), headers=headers),
            )
        )
        sender.start()
        while len(producer.taken) < 3 and sender.is_alive():
            threading.Event().wait(0.01)
        producer.taken[2](None, _Message(2))
        sender.join()
        assert retry["r"].status_code == 200 and retry["r"].json()["accepted"] == 1
