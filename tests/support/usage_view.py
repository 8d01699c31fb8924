"""Test helpers for the usage view and the ingest edge: start instances as processes
(``invoicing worker usage-view|ingest``) in a sandbox, wait for them, ask them."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from streams.apps.ingest.keys import ApiKeyFile
from streams.apps.usage_view.app import usage_path
from streams.devtools.sandbox.processes import WorkerProcess
from streams.devtools.sandbox.smtp import free_port
from tests.support.pipeline import Pipeline

T = TypeVar("T")


#: The ``usage:read`` key of each started view instance's port (sent by :func:`get_usage`).
_PORT_KEYS: dict[int, str] = {}


def view_keys_file(p: Pipeline) -> Path:
    """The key file the sandbox's view instances check bearer keys against."""
    return p.workdir / "view-api-keys.json"


def view_key(p: Pipeline, *scopes: str) -> str:
    """A new key in :func:`view_keys_file` with ``scopes`` (default ``usage:read``)."""
    return ApiKeyFile(view_keys_file(p)).create("tests", scopes=scopes or ("usage:read",))[1]


def view_env(
    p: Pipeline, *, store: str = "rocksdb", price_book: str | None = None
) -> dict[str, str]:
    """The environment of the sandbox's view instances: a group under the sandbox's topic
    prefix (so its changelog topics are deleted with the sandbox), its own data folder."""
    env = {
        "INVOICING_VIEW__GROUP": f"{p.settings.kafka.topic_prefix}usage-view",
        "INVOICING_VIEW__STORE": store,
        "INVOICING_VIEW__DATA_DIR": str(p.workdir / "view-data"),
        "INVOICING_INGEST__API_KEYS_FILE": str(view_keys_file(p)),
    }
    if price_book is not None:
        env["INVOICING_VIEW__PRICE_BOOK"] = price_book
    return env


def start_view(
    p: Pipeline, port: int | None = None, *, settings: dict[str, str] | None = None, **env: Any
) -> tuple[WorkerProcess, int]:
    """One view instance on ``port`` (a free one by default); ``settings``: more
    ``INVOICING_*`` variables for it (e.g. the retention's)."""
    port = port or free_port()
    _PORT_KEYS[port] = view_key(p)
    (proc,) = p.workers.start(
        "usage-view",
        extra_env={**view_env(p, **env), **(settings or {})},
        args=["--port", str(port)],
    )
    return proc, port


def health(port: int) -> dict[str, Any] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def wait_until(
    what: str, probe: Callable[[], T | None], p: Pipeline, timeout_s: float = 120.0
) -> T:
    """``probe()`` until it returns something truthy; fail loudly with the workers' logs."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        dead = [
            w.name
            for w in p.workers.processes
            if w.process.poll() is not None and w.process.returncode not in (0, -9)
        ]
        assert not dead, f"processes died while waiting for {what}: {dead}\n{p.worker_logs()}"
        time.sleep(0.5)
    raise AssertionError(
        f"after {timeout_s}s still waiting for {what} (last: {last!r})\n{p.worker_logs()}"
    )


def wait_assigned(
    p: Pipeline, ports: list[int], partitions: int = 12, timeout_s: float = 120.0
) -> dict[int, list[int]]:
    """Wait until the instances on ``ports`` together own every partition, each once."""

    def probe() -> dict[int, list[int]] | None:
        owned: dict[int, list[int]] = {}
        for port in ports:
            answer = health(port)
            if answer is None:
                return None
            owned[port] = list(answer["partitions"])
        flat = sorted(x for parts in owned.values() for x in parts)
        return owned if flat == list(range(partitions)) and all(owned.values()) else None

    return wait_until(f"partitions assigned across {ports}", probe, p, timeout_s)


def get_usage(
    port: int,
    customer: str,
    period: str,
    *,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """The view's answer; ``headers`` default: the instance's read key (:func:`start_view`)."""
    if headers is None:
        headers = {"Authorization": f"Bearer {_PORT_KEYS[port]}"}
    return httpx.get(
        f"http://127.0.0.1:{port}{usage_path(customer, period)}",
        timeout=timeout_s,
        headers=headers,
    )


def usage_ok(port: int, customer: str, period: str) -> dict[str, Any] | None:
    """The 200 answer, or ``None`` (404 before the customer's events arrived, 503 while
    the view rebalances, 508 when a forwarded request met a stale assignment)."""
    try:
        response = get_usage(port, customer, period)
    except httpx.HTTPError:
        return None
    if response.status_code == 200:
        body: dict[str, Any] = response.json()
        return body
    assert response.status_code in (404, 503, 508), response.text
    return None
