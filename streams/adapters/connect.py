"""Kafka Connect REST client: register the outbox connector idempotently, read its status.

The connector's configuration lives in ``connectors/outbox-connector.json`` with
``${section.field}`` placeholders filled from settings (``${routedByValue}`` is
Debezium's own and stays). ``PUT /connectors/{name}/config`` creates or updates;
an unchanged configuration is not sent again, so ``stack up`` twice restarts
nothing.

Registering is provisioning: :func:`apply_outbox_connector` opens its own
short-lived client from the settings (it runs from the stack manager, the
``connectors apply`` command and test setup). Reading the status is what
commands do at run time: :func:`connector_status` takes the client the
composition root built (:func:`streams.bootstrap.connect_client`).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx

from streams.settings import Settings


class ConnectError(Exception):
    """The Connect REST API refused or failed a request (status and body in the message)."""


_PLACEHOLDER = re.compile(r"\$\{(postgres|kafka|connect)\.([a-z_]+)\}")


def render_outbox_config(settings: Settings, root: Path) -> dict[str, str]:
    """The outbox connector config with settings filled in.

    Raises:
        ConnectError: a placeholder names no setting.
    """
    template = json.loads((root / "connectors" / "outbox-connector.json").read_text())

    def value(match: re.Match[str]) -> str:
        section = getattr(settings, match.group(1))
        if not hasattr(section, match.group(2)):
            raise ConnectError(f"connector template names unknown setting {match.group(0)}")
        raw = getattr(section, match.group(2))
        return raw.get_secret_value() if hasattr(raw, "get_secret_value") else str(raw)

    return {k: _PLACEHOLDER.sub(value, str(v)) for k, v in template.items()}


def apply_outbox_connector(settings: Settings, root: Path, timeout_s: float = 60.0) -> bool:
    """Create or update the outbox connector; returns True when something changed.

    Raises:
        ConnectError: Connect answered an error, or the connector did not reach RUNNING.
    """
    name = settings.connect.outbox_connector
    config = render_outbox_config(settings, root)
    base = settings.connect.url
    with httpx.Client(base_url=base, timeout=30.0) as client:
        current = client.get(f"/connectors/{name}/config")
        if current.status_code == 200:
            existing = {k: v for k, v in current.json().items() if k != "name"}
            if existing == config:
                return False
        response = client.put(f"/connectors/{name}/config", json=config)
        if response.status_code not in (200, 201):
            raise ConnectError(
                f"PUT /connectors/{name}/config answered {response.status_code}: {response.text}"
            )
        wait_running(client, name, timeout_s)
    return True


def connector_status(client: httpx.Client, name: str) -> dict[str, Any] | None:
    """``GET /connectors/{name}/status`` through ``client`` (based at Connect's REST URL),
    or None when the connector is absent.

    Raises:
        httpx.HTTPError: Connect did not answer, or answered another error.
    """
    response = client.get(f"/connectors/{name}/status")
    if response.status_code == 404:
        return None
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def wait_running(client: httpx.Client, name: str, timeout_s: float) -> None:
    """Wait until the connector and all its tasks are RUNNING.

    Raises:
        ConnectError: a task FAILED (its trace is included) or the timeout passed.
    """
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        response = client.get(f"/connectors/{name}/status")
        if response.status_code == 200:
            last = response.json()
            states = [last["connector"]["state"], *(t["state"] for t in last.get("tasks", []))]
            if "FAILED" in states:
                traces = [
                    t.get("trace", "")[:2000]
                    for t in last.get("tasks", [])
                    if t["state"] == "FAILED"
                ]
                raise ConnectError(f"connector {name} failed: {last['connector']}; {traces}")
            if last.get("tasks") and all(s == "RUNNING" for s in states):
                return
        time.sleep(0.5)
    raise ConnectError(f"connector {name} not RUNNING after {timeout_s:.0f}s: {last}")
