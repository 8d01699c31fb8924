"""Kafka Connect REST client: register the outbox connector idempotently, read its status.

The connector's configuration lives in ``connectors/outbox-connector.json`` with
``${section.name}`` placeholders filled from settings (:func:`template_values`;
``${routedByValue}`` is Debezium's own and stays). ``PUT /connectors/{name}/config``
creates or updates; an unchanged configuration is not sent again, so ``stack up``
twice restarts nothing.

**Debezium's password never appears in the connector config.** It is written to a
properties file (:func:`write_connect_secrets`, ``<secrets dir>/<replication user>.properties``,
key ``password``, mode 0600) and the connector config references it as
``${file:<that file>:password}``: Kafka's ``FileConfigProvider``, enabled in the Connect
worker config (``config.providers=file``, its ``allowed.paths`` restricted to the
secrets folder: :func:`worker_provider_config`), resolves it when the task starts.
``GET /connectors/<name>/config`` returns the reference, not the password.

The hosts are the ones **Connect** reaches: ``settings.connect.database_host`` /
``database_port`` when set (a Connect container on a compose network names
``postgres:5432``), else ``settings.postgres.host`` / ``port``.

Registering is provisioning: :func:`apply_outbox_connector` opens its own
short-lived client from the settings (it runs from the stack manager, the
``connectors apply`` command and test setup). Reading the status is what
commands do at run time: :func:`connector_status` takes the client the
composition root built (:func:`streams.bootstrap.connect_client`).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx

from streams.errors import InvoicingError
from streams.settings import DatabaseRole, Settings


class ConnectError(InvoicingError):
    """The Connect REST API refused or failed a request (status and body in the message)."""


#: Alias of the config provider in the worker config and in ``${file:…:…}`` references.
CONFIG_PROVIDER = "file"
#: Kafka's provider of values read from a properties file (kafka-clients, on Connect's path).
FILE_CONFIG_PROVIDER = "org.apache.kafka.common.config.provider.FileConfigProvider"

_PLACEHOLDER = re.compile(r"\$\{([a-z]+\.[a-z_.]+)\}")


def local_secrets_dir(settings: Settings) -> Path:
    """The local stack's secrets folder, ``.local/conf/connect-secrets``."""
    return settings.stack.local_dir / "conf" / "connect-secrets"


def secrets_dir(settings: Settings) -> str:
    """The secrets folder as Connect sees it (``settings.connect.secrets_dir`` or the
    local stack's)."""
    return settings.connect.secrets_dir or str(local_secrets_dir(settings))


def secrets_file(settings: Settings, login: DatabaseRole) -> str:
    """The properties file holding ``login``'s password, as Connect sees it."""
    return f"{secrets_dir(settings)}/{login.user}.properties"


def worker_provider_config(settings: Settings) -> dict[str, str]:
    """The Connect worker properties that enable the file config provider, allowed to read
    the secrets folder only."""
    prefix = f"config.providers.{CONFIG_PROVIDER}"
    return {
        "config.providers": CONFIG_PROVIDER,
        f"{prefix}.class": FILE_CONFIG_PROVIDER,
        f"{prefix}.param.allowed.paths": secrets_dir(settings),
    }


def _properties_escape(value: str) -> str:
    """``value`` as a ``java.util.Properties`` value: backslash escapes for ``\\``, the
    separators and comment characters, line breaks and leading spaces; ``\\uXXXX``
    outside printable ASCII (so the file's encoding never matters)."""
    out = []
    for i, ch in enumerate(value):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "=:#!":
            out.append("\\" + ch)
        elif ch == " " and i == 0:
            out.append("\\ ")
        elif ch in "\n\r\t\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[ch])
        elif not (0x20 <= ord(ch) < 0x7F):
            out.append("".join(f"\\u{unit:04x}" for unit in _utf16(ch)))
        else:
            out.append(ch)
    return "".join(out)


def _utf16(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


def write_connect_secrets(settings: Settings, login: DatabaseRole | None = None) -> Path:
    """Write ``login``'s password (default: ``settings.postgres.replication``) to its file
    in the local secrets folder, mode 0600 (only the user running Connect reads it), and
    return the path. Rewritten only when its content changes.

    Raises:
        ConnectError: ``settings.connect.secrets_dir`` names another folder (compose
            mounts its own files; this process does not write there).
    """
    if settings.connect.secrets_dir is not None:
        raise ConnectError(
            f"connect.secrets_dir is {settings.connect.secrets_dir}: its files are provided "
            "where Connect runs, not written here"
        )
    login = login or settings.postgres.replication
    folder = local_secrets_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / f"{login.user}.properties"
    content = (
        "# Written by invoicing (streams/adapters/connect.py); read by Kafka Connect's\n"
        "# FileConfigProvider. Never commit or share it.\n"
        f"password={_properties_escape(login.password.get_secret_value())}\n"
    )
    if not path.exists() or path.read_text() != content:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(content)
    path.chmod(0o600)
    return path


def template_values(settings: Settings) -> dict[str, str]:
    """What ``${section.name}`` placeholders of the connector template may name. The
    password is not among them: the template references it through the provider."""
    pg, connect = settings.postgres, settings.connect
    return {
        "postgres.database": pg.database,
        "postgres.publication": pg.publication,
        "postgres.slot": pg.slot,
        "postgres.replication.user": pg.replication.user,
        "connect.database_host": connect.database_host or pg.host,
        "connect.database_port": str(connect.database_port or pg.port),
        "connect.secrets_file": secrets_file(settings, pg.replication),
        "kafka.topic_prefix": settings.kafka.topic_prefix,
    }


def render_outbox_config(settings: Settings, root: Path) -> dict[str, str]:
    """The outbox connector config with settings filled in.

    Raises:
        ConnectError: a placeholder names no value of :func:`template_values`.
    """
    template = json.loads((root / "connectors" / "outbox-connector.json").read_text())
    values = template_values(settings)

    def value(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise ConnectError(f"connector template names unknown setting {match.group(0)}")
        return values[match.group(1)]

    config = {k: _PLACEHOLDER.sub(value, str(v)) for k, v in template.items()}
    # TLS to PostgreSQL: libpq's mode and CA, as Connect sees the CA file (the same
    # path: the local stack runs Connect on this host). "prefer" is Debezium's default.
    if settings.postgres.sslmode != "prefer":
        config["database.sslmode"] = settings.postgres.sslmode
    if settings.postgres.sslrootcert is not None:
        config["database.sslrootcert"] = str(settings.postgres.sslrootcert)
    return config


def apply_outbox_connector(settings: Settings, root: Path, timeout_s: float = 60.0) -> bool:
    """Create or update the outbox connector; returns True when something changed.

    Raises:
        ConnectError: Connect answered an error, or the connector did not reach RUNNING.
    """
    name = settings.connect.outbox_connector
    if settings.connect.secrets_dir is None:
        write_connect_secrets(settings)
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
