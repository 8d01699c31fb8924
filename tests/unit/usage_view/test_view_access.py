"""The usage view is safe to expose (docs/usage-api.md, "Authentication" and "Forwarding"),
without a broker: the view's real faust web app served by aiohttp's test server, its
owner lookup (``app.router.key_store``) and the group's members (the assignor's changelog
distribution) set by hand, another instance played by a real view or a recording stub.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from streams.apps.ingest.keys import ApiKeyFile, UnknownScope
from streams.apps.usage_view.access import HOP_HEADER
from streams.apps.usage_view.app import ViewConfig, create_app, usage_path
from streams.apps.usage_view.price_book import StaticPriceBook
from streams.devtools.sandbox.smtp import free_port

CUSTOMER = "/subscriptions/a/b"
PATH = usage_path(CUSTOMER, "2024-09")


def config(tmp_path: Path, port: int, *, forward_timeout_s: float = 2.0) -> ViewConfig:
    return ViewConfig(
        app_id=f"t-view-{port}",
        brokers="127.0.0.1:1",
        source_topic="billing.account-events.v1",
        partitions=12,
        host="127.0.0.1",
        port=port,
        store="memory://",
        datadir=tmp_path / str(port),
        standby_replicas=0,
        retain_closed=timedelta(days=35),
        retain_open=timedelta(days=400),
        cleanup_interval_s=3600,
        forward_timeout_s=forward_timeout_s,
    )


class Instance:
    """A view app on its own port whose owner lookup answers ``owner`` and whose group
    is ``members`` (both settable)."""

    def __init__(self, tmp_path: Path, keys: ApiKeyFile, **kw: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(config(tmp_path, self.port, **kw), StaticPriceBook(), keys=keys)
        self.owner = self.url
        self.members = [self.url]
        router: Any = self.app.router
        router.key_store = lambda table, key: URL(self.owner)

    def set_group(self, members: list[str]) -> None:
        self.members = members
        assignor: Any = self.app.assignor
        assignor.changelog_distribution = {m: {} for m in members}

    async def server(self) -> TestServer:
        self.set_group(self.members)
        web_app = await self.app.web.wsgi()  # faust's own route table, blueprints applied
        server = TestServer(web_app, host="127.0.0.1", port=self.port)
        await server.start_server()
        return server


def run(check: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(check())


@pytest.fixture
def keys(tmp_path: Path) -> ApiKeyFile:
    return ApiKeyFile(tmp_path / "keys.json")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def client_of(instance: Instance) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(await instance.server())
    await client.start_server()
    return client


def assert_problem(status: int, body: bytes, headers: Any, expected: int) -> dict[str, Any]:
    assert status == expected, body
    assert headers["Content-Type"].startswith("application/problem+json")
    problem: dict[str, Any] = json.loads(body)
    assert problem["status"] == expected and problem["title"]
    return problem


def test_faust_table_and_router_endpoints_answer_404(tmp_path: Path, keys: ApiKeyFile) -> None:
    view = Instance(tmp_path, keys)

    async def check() -> None:
        client = await client_of(view)
        try:
            for path in (
                "/table/",
                "/table/customers/",
                f"/table/customers/{CUSTOMER}/",
                "/router/",
                "/router/customers/",
                f"/router/customers/{CUSTOMER}/",
            ):
                response = await client.get(path)
                assert response.status == 404, (path, response.status)
            # the server does route: the usage endpoint is there (and wants a key)
            assert (await client.get(PATH)).status == 401
        finally:
            await client.close()
            await view.app.http_client.close()

    run(check)


def test_401_without_or_with_a_wrong_key_403_without_the_read_scope_404_unknown(
    tmp_path: Path, keys: ApiKeyFile
) -> None:
    _, reader = keys.create("reader", scopes=("usage:read",))
    _, writer = keys.create("edge-client")  # default scopes: ingest only
    revoked_id, revoked = keys.create("old", scopes=("usage:read",))
    keys.revoke(revoked_id)
    view = Instance(tmp_path, keys)

    async def check() -> None:
        client = await client_of(view)
        try:
            for headers in (
                {},
                {"Authorization": "Basic dXNlcjpwYXNz"},
                {"Authorization": "Bearer "},
                bearer(reader + "x"),
                bearer("ik_00000000.nothing"),
                bearer(revoked),
            ):
                response = await client.get(PATH, headers=headers)
                assert_problem(response.status, await response.read(), response.headers, 401)
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
            response = await client.get(PATH, headers=bearer(writer))
            problem = assert_problem(response.status, await response.read(), response.headers, 403)
            assert "usage:read" in problem["detail"]
            response = await client.get(PATH, headers=bearer(reader))
            problem = assert_problem(response.status, await response.read(), response.headers, 404)
            assert problem["title"] == "Unknown customer"
        finally:
            await client.close()
            await view.app.http_client.close()

    run(check)


def test_a_read_key_limited_to_customers_reads_only_those_403_otherwise(
    tmp_path: Path, keys: ApiKeyFile
) -> None:
    """A ``usage:read`` key with a customer list or prefix (docs/usage-api.md,
    "Authentication"): another customer is 403 before any lookup (404 for its own
    customers here: no state)."""
    _, listed = keys.create("listed", scopes=("usage:read",), customers=(CUSTOMER,))
    _, prefixed = keys.create(
        "prefixed", scopes=("usage:read",), customer_prefix="/subscriptions/a/"
    )
    _, elsewhere = keys.create(
        "elsewhere", scopes=("usage:read",), customer_prefix="/subscriptions/z/"
    )
    _, others = keys.create("others", scopes=("usage:read",), customers=("/subscriptions/x/y",))
    view = Instance(tmp_path, keys)

    async def check() -> None:
        client = await client_of(view)
        try:
            for token in (listed, prefixed):
                response = await client.get(PATH, headers=bearer(token))
                problem = assert_problem(
                    response.status, await response.read(), response.headers, 404
                )
                assert problem["title"] == "Unknown customer"
            for token in (elsewhere, others):
                response = await client.get(PATH, headers=bearer(token))
                problem = assert_problem(
                    response.status, await response.read(), response.headers, 403
                )
                assert CUSTOMER in problem["detail"]
        finally:
            await client.close()
            await view.app.http_client.close()

    run(check)


def test_keys_stored_before_scopes_read_as_ingest_only(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    store = ApiKeyFile(path)
    _, token = store.create("legacy")
    data = json.loads(path.read_text())
    for item in data["keys"]:
        del item["scopes"]  # the file as written before scopes existed
    path.write_text(json.dumps(data))
    key = ApiKeyFile(path).verify(token)
    assert key is not None and key.allows("ingest") and not key.allows("usage:read")
    _, both = store.create("both", scopes=("ingest", "usage:read"))
    again = ApiKeyFile(path).verify(both)
    assert again is not None and again.scopes == ("ingest", "usage:read")
    with pytest.raises(UnknownScope):
        store.create("typo", scopes=("usage:write",))
    with pytest.raises(UnknownScope):
        store.create("none", scopes=())


class Stub:
    """Another instance that records what it receives and answers 200 (or never)."""

    def __init__(self, *, hang: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.hang = hang
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.path_qs, dict(request.headers)))
        if self.hang:
            await self.release.wait()
        return web.json_response({"served_by": self.url}, status=200)

    async def server(self) -> TestServer:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        server = TestServer(app, host="127.0.0.1", port=self.port)
        await server.start_server()
        return server


def test_forwards_to_a_group_member_with_only_the_callers_key_and_one_hop(
    tmp_path: Path, keys: ApiKeyFile
) -> None:
    _, reader = keys.create("reader", scopes=("usage:read",))
    view, owner = Instance(tmp_path, keys), Stub()
    view.owner = owner.url
    view.members = [view.url, owner.url]

    async def check() -> None:
        stub_server = await owner.server()
        client = await client_of(view)
        try:
            response = await client.get(
                PATH,
                headers={
                    **bearer(reader),
                    "Accept": "application/json",
                    "Cookie": "session=secret",
                    "Proxy-Authorization": "Basic cHJveHk6cGFzcw==",
                    "X-Api-Key": "other-secret",
                    "X-Forwarded-Host": "evil.example",
                },
            )
            assert response.status == 200 and (await response.json()) == {"served_by": owner.url}
            ((path, headers),) = owner.seen
            assert path == PATH
            sent = {k.lower(): v for k, v in headers.items()}
            assert sent["authorization"] == f"Bearer {reader}"
            assert sent[HOP_HEADER.lower()] == "1"
            for dropped in ("cookie", "proxy-authorization", "x-api-key", "x-forwarded-host"):
                assert dropped not in sent, dropped
        finally:
            await client.close()
            await stub_server.close()
            await view.app.http_client.close()

    run(check)


def test_refuses_to_forward_outside_the_group_or_a_second_hop(
    tmp_path: Path, keys: ApiKeyFile
) -> None:
    _, reader = keys.create("reader", scopes=("usage:read",))
    view, stranger = Instance(tmp_path, keys), Stub()
    view.owner = stranger.url  # the lookup names an instance the group does not have

    async def check() -> None:
        stub_server = await stranger.server()
        client = await client_of(view)
        try:
            response = await client.get(PATH, headers=bearer(reader))
            assert_problem(response.status, await response.read(), response.headers, 502)
            view.set_group([view.url, stranger.url])
            response = await client.get(PATH, headers={**bearer(reader), HOP_HEADER: "1"})
            assert_problem(response.status, await response.read(), response.headers, 508)
            assert stranger.seen == []
            # an unauthenticated request is refused before any routing
            response = await client.get(PATH, headers={HOP_HEADER: "1"})
            assert response.status == 401 and stranger.seen == []
        finally:
            await client.close()
            await stub_server.close()
            await view.app.http_client.close()

    run(check)


def test_two_views_one_hop_then_the_owner_answers_or_a_stale_owner_refuses(
    tmp_path: Path, keys: ApiKeyFile
) -> None:
    _, reader = keys.create("reader", scopes=("usage:read",))
    a, b = Instance(tmp_path, keys), Instance(tmp_path, keys)
    a.members = b.members = [a.url, b.url]
    a.owner = b.url  # b owns the customer and answers itself (404: no event of it yet)

    async def check() -> None:
        client_a, client_b = await client_of(a), await client_of(b)
        try:
            response = await client_a.get(PATH, headers=bearer(reader))
            problem = assert_problem(response.status, await response.read(), response.headers, 404)
            assert "has reached the view" in problem["detail"]  # b's answer, not a's
            b.owner = a.url  # b's assignment is stale: it would send it back
            response = await client_a.get(PATH, headers=bearer(reader))
            assert_problem(response.status, await response.read(), response.headers, 508)
        finally:
            await client_a.close()
            await client_b.close()
            await a.app.http_client.close()
            await b.app.http_client.close()

    run(check)


def test_an_owner_that_does_not_answer_is_504_and_an_absent_one_503(
    tmp_path: Path, keys: ApiKeyFile
) -> None:
    _, reader = keys.create("reader", scopes=("usage:read",))
    view, slow = Instance(tmp_path, keys, forward_timeout_s=0.2), Stub(hang=True)
    gone = f"http://127.0.0.1:{free_port()}"  # a member whose port nothing listens on
    view.members = [view.url, slow.url, gone]

    async def check() -> None:
        stub_server = await slow.server()
        client = await client_of(view)
        try:
            view.owner = slow.url
            response = await client.get(PATH, headers=bearer(reader))
            assert_problem(response.status, await response.read(), response.headers, 504)
            assert len(slow.seen) == 1
            view.owner = gone
            response = await client.get(PATH, headers=bearer(reader))
            assert_problem(response.status, await response.read(), response.headers, 503)
        finally:
            slow.release.set()
            await client.close()
            await stub_server.close()
            await view.app.http_client.close()

    run(check)


def test_the_edge_takes_ingest_keys_old_and_new_and_refuses_read_only_ones(
    tmp_path: Path,
) -> None:
    from streams.apps.ingest.idempotency import MemoryIdempotency
    from streams.apps.ingest.server import EdgeConfig, create_edge

    path = tmp_path / "keys.json"
    store = ApiKeyFile(path)
    _, legacy = store.create("legacy")
    data = json.loads(path.read_text())
    del data["keys"][0]["scopes"]  # written before scopes existed
    path.write_text(json.dumps(data))
    _, reader = store.create("reader", scopes=("usage:read",))
    _, writer = store.create("writer", scopes=("ingest",))

    class Pump:
        def close(self) -> None:
            pass

    edge = create_edge(
        EdgeConfig(
            host="127.0.0.1",
            port=0,
            topic="t",
            max_body_bytes=1000,
            max_batch_events=10,
            delivery_timeout_s=1.0,
        ),
        pump_factory=lambda loop: Pump(),
        keys=store,
        idempotency=MemoryIdempotency(),
    )

    async def check() -> None:
        async with TestClient(TestServer(edge)) as client:
            response = await client.post("/v1/events", data=b"x" * 2000, headers=bearer(reader))
            assert_problem(response.status, await response.read(), response.headers, 403)
            for token in (legacy, writer):  # past the key check: refused for the body's size
                response = await client.post("/v1/events", data=b"x" * 2000, headers=bearer(token))
                assert response.status == 413, token

    run(check)
