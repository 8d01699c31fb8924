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
    from streams.stack.manager import Stack

    Stack(settings, report=lambda m: print(f"stack: {m}")).up()


def start_docker(settings: Settings, root: Path) -> object:
    """``docker compose up`` the same stack, then provision schema/topics/connector."""
    from testcontainers.compose import DockerCompose

    compose = DockerCompose(str(root), compose_file_name="docker-compose.yml", wait=True)
    compose.start()
    from streams.adapters import migrate
    from streams.adapters.connect import apply_outbox_connector
    from streams.adapters.kafka import ensure_topics
    from streams.adapters.provision import provision_publication

    migrate.upgrade(settings.postgres)
    provision_publication(settings.postgres)
    ensure_topics(settings.kafka)
    apply_outbox_connector(settings, root)
    return compose
