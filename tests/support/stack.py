"""Providers of the real stack for integration tests.

- local (default): ``invoicing stack up`` — supervisord-run services started
  by the project itself, no Docker. Idempotent: a running stack is reused.
- docker: where a Docker engine answers (``DOCKER_HOST`` set, or the socket
  responds), ``docker-compose.yml`` via testcontainers' ``DockerCompose``,
  on the same ports, so the same settings apply. Thin on purpose.

Choose explicitly with ``INVOICING_TEST_STACK=local|docker``; tests never skip:
a provider that cannot start its services fails the session with the reason.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from streams.settings import Settings


def docker_available() -> bool:
    """Whether a Docker engine answers (DOCKER_HOST set, or /var/run/docker.sock accepts)."""
    if os.environ.get("DOCKER_HOST"):
        return True
    sock_path = "/var/run/docker.sock"
    if not os.path.exists(sock_path):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(sock_path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            return b"OK" in sock.recv(1024)
    except OSError:
        return False


def provider_name() -> str:
    chosen = os.environ.get("INVOICING_TEST_STACK")
    if chosen:
        return chosen
    return "docker" if docker_available() else "local"


def start_local(settings: Settings) -> None:
    """Bring the local stack up (installing and provisioning as needed)."""
    from streams.devtools.stack.manager import Stack

    Stack(settings, report=lambda m: print(f"stack: {m}")).up()


def start_docker(settings: Settings, root: Path) -> object:
    """``docker compose up`` the same stack; its one-shot ``provision`` service creates the
    roles, migrates, creates the topics and registers the connector (docker-compose.yml).

    The tests' own connectors (the sandboxes') are registered from the host, so the
    session's settings learn what Connect reaches inside the compose network: PostgreSQL
    as ``postgres:5432`` and the secrets folder mounted at ``/etc/kafka-connect/secrets``
    (a sandbox then uses the stack's replication login, whose file compose mounts).
    """
    import json
    import subprocess
    import time

    from testcontainers.compose import DockerCompose

    compose = DockerCompose(str(root), compose_file_name="docker-compose.yml", wait=True)
    compose.start()
    deadline = time.monotonic() + 300
    while True:
        listed = subprocess.run(
            ["docker", "compose", "ps", "-a", "--format", "json", "provision"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows = [json.loads(line) for line in listed.splitlines() if line.strip()]
        if rows and rows[0].get("State") == "exited":
            if rows[0].get("ExitCode") != 0:
                raise RuntimeError(f"the compose provision service failed: {rows[0]}")
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the compose provision service did not finish: {rows}")
        time.sleep(2)
    settings.connect.database_host = "postgres"
    settings.connect.database_port = 5432
    settings.connect.secrets_dir = "/etc/kafka-connect/secrets"
    return compose
