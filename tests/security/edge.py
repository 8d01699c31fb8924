"""The ingest edge's aiohttp application in process, for the security tests: a pump that
records what it would produce (every report a success), the in-memory idempotency twin,
and a key file of the test's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from streams.apps.ingest.edge import Valid
from streams.apps.ingest.idempotency import MemoryIdempotency
from streams.apps.ingest.keys import ApiKeyFile
from streams.apps.ingest.server import Delivery, EdgeConfig, create_edge

BATCH = "application/cloudevents-batch+json"
SINGLE = "application/cloudevents+json"
TOPIC = "security.billing.account-events.v1"

T = TypeVar("T")


@dataclass
class RecordingPump:
    """Stands for :class:`~streams.apps.ingest.server.DeliveryPump`: every record is
    "delivered" at the next offset; ``produced`` holds what reached the "topic"."""

    loop: asyncio.AbstractEventLoop
    produced: list[Valid] = field(default_factory=list)

    def produce_all(self, topic: str, items: list[Valid]) -> asyncio.Future[list[Delivery]]:
        future: asyncio.Future[list[Delivery]] = self.loop.create_future()
        start = len(self.produced)
        self.produced.extend(items)
        future.set_result([(None, 0, start + i) for i in range(len(items))])
        return future

    def close(self) -> None:
        pass


@dataclass
class Edge:
    """The application, a live key, and what the pump received."""

    app: web.Application
    key: str
    key_id: str
    pumps: list[RecordingPump]
    keys: ApiKeyFile | None = None

    @property
    def produced(self) -> list[Valid]:
        return [v for pump in self.pumps for v in pump.produced]


@dataclass
class GatedPump(RecordingPump):
    """A :class:`RecordingPump` whose reports wait for ``gate`` (set by the test); ``hold``
    False: they never arrive (a broker that took the records and went away)."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    hold: bool = True

    def produce_all(self, topic: str, items: list[Valid]) -> asyncio.Future[list[Delivery]]:
        future: asyncio.Future[list[Delivery]] = self.loop.create_future()
        start = len(self.produced)
        self.produced.extend(items)

        async def report() -> None:
            await self.gate.wait()
            if self.hold:
                future.set_result([(None, 0, start + i) for i in range(len(items))])

        self.loop.create_task(report())
        return future


def make_edge(
    tmp_path: Path,
    *,
    scope: dict[str, Any] | None = None,
    pump: type[RecordingPump] = RecordingPump,
    **config_overrides: Any,
) -> Edge:
    """The edge with one key, created with ``scope`` (keyword arguments of
    :meth:`ApiKeyFile.create`), its pumps of class ``pump``, ``config_overrides`` on
    :class:`EdgeConfig`."""
    keys = ApiKeyFile(tmp_path / "api-keys.json")
    key_id, key = keys.create("security test", **(scope or {}))
    pumps: list[RecordingPump] = []

    def pump_factory(loop: asyncio.AbstractEventLoop) -> RecordingPump:
        made = pump(loop)
        pumps.append(made)
        return made

    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "topic": TOPIC,
        "max_body_bytes": 4_000_000,
        "max_batch_events": 500,
        "delivery_timeout_s": 5.0,
        **config_overrides,
    }
    config = EdgeConfig(**settings)
    app = create_edge(config, pump_factory=pump_factory, keys=keys, idempotency=MemoryIdempotency())
    edge = Edge(app, key, key_id, pumps)
    edge.keys = keys
    return edge


def serve(edge: Edge, work: Callable[[TestClient[Any, Any], TestServer], Awaitable[T]]) -> T:
    """Run ``work(client, server)`` against the edge on a local port; returns its result."""

    async def main() -> T:
        server = TestServer(edge.app)
        async with TestClient(server) as client:
            return await work(client, server)

    return asyncio.run(main())


def usage_event(
    event_id: str, *, source: str = "security/test", amount: str = "1.25", customer: str = "acme"
) -> Any:
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": "usage.recorded",
        "subject": customer,
        "data": {
            "customer_id": customer,
            "billing_period": "2024-09",
            "amount": amount,
            "currency": "USD",
            "event_time": "2024-09-03T10:00:00Z",
        },
    }


def dumps(body: Any) -> bytes:
    return json.dumps(body).encode()


def upsert_event(event_id: str, *, customer: str = "acme", source: str = "security/test") -> Any:
    """A ``customer.upserted`` that changes ``customer``'s email."""
    return {
        "specversion": "1.0",
        "id": event_id,
        "source": source,
        "type": "customer.upserted",
        "data": {
            "customer_id": customer,
            "name": "Acme",
            "email": "attacker@evil.example",
            "currency": "USD",
        },
    }
