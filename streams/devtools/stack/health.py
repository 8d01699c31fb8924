"""Real health checks of the stack's services: each asks the service to do work.

Each check returns ``None`` when healthy, else a one-line reason. No check
raises; ``wait_healthy`` turns a timeout into :class:`ServiceUnhealthy`.

- kafka:    a metadata request answered by the broker (confluent-kafka AdminClient)
- connect:  REST root answers, and ``/connector-plugins`` lists the Debezium connector
- postgres: ``SELECT 1`` (over the unix socket as the superuser, or TCP as the owner role)
- redis:    ``PING``
- smtp:     SMTP ``NOOP`` answered 250
- tax:      ``GET /health`` answered 200
"""

from __future__ import annotations

import smtplib
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from streams.devtools.stack.errors import ServiceUnhealthy
from streams.settings import Settings

POSTGRES_CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"

Check = Callable[[], str | None]


def kafka_check(settings: Settings, timeout_s: float = 3.0) -> str | None:
    from confluent_kafka.admin import AdminClient

    from streams.adapters.kafka import security_config

    try:
        admin = AdminClient(
            {
                "bootstrap.servers": settings.kafka.bootstrap_servers,
                **security_config(settings.kafka),
                "log_level": 0,
                "socket.connection.setup.timeout.ms": int(timeout_s * 1000),
            }
        )
        metadata = admin.list_topics(timeout=timeout_s)
    except Exception as exc:  # confluent_kafka raises KafkaException with a code
        return f"metadata request failed: {exc}"
    if not metadata.brokers:
        return "metadata response lists no broker"
    return None


def connect_check(settings: Settings, timeout_s: float = 3.0) -> str | None:
    try:
        root = httpx.get(settings.connect.url + "/", timeout=timeout_s)
        if root.status_code != 200:
            return f"GET / answered {root.status_code}"
        plugins = httpx.get(settings.connect.url + "/connector-plugins", timeout=timeout_s)
        if plugins.status_code != 200:
            return f"GET /connector-plugins answered {plugins.status_code}"
    except httpx.HTTPError as exc:
        return f"REST API unreachable: {exc!r}"
    classes = {p.get("class") for p in plugins.json()}
    if POSTGRES_CONNECTOR_CLASS not in classes:
        return f"{POSTGRES_CONNECTOR_CLASS} is not among the plugins ({len(classes)} listed)"
    return None


def postgres_superuser_check(socket_dir: Path, port: int, timeout_s: float = 3.0) -> str | None:
    import psycopg

    try:
        with psycopg.connect(
            host=str(socket_dir),
            port=port,
            user="postgres",
            dbname="postgres",
            connect_timeout=max(1, int(timeout_s)),
        ) as conn:
            conn.execute("SELECT 1").fetchone()
    except psycopg.Error as exc:
        return f"SELECT 1 failed: {str(exc).strip()}"
    return None


def postgres_app_check(settings: Settings, timeout_s: float = 3.0) -> str | None:
    """``SELECT 1`` as the owner (the role migrations run as), or the reason it failed."""
    import psycopg

    try:
        with psycopg.connect(
            settings.postgres.dsn("owner", connect_timeout=max(1, int(timeout_s)))
        ) as conn:
            conn.execute("SELECT 1").fetchone()
    except psycopg.Error as exc:
        return f"SELECT 1 as {settings.postgres.owner.user} failed: {str(exc).strip()}"
    return None


def redis_check(settings: Settings, timeout_s: float = 2.0) -> str | None:
    import redis

    try:
        client = redis.Redis.from_url(
            settings.redis.url.get_secret_value(),
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            **settings.redis.client_kwargs(),
        )
        try:
            if client.ping() is not True:
                return "PING did not answer PONG"
        finally:
            client.close()
    except redis.RedisError as exc:
        return f"PING failed: {exc}"
    return None


def smtp_check(settings: Settings, timeout_s: float = 3.0) -> str | None:
    try:
        with smtplib.SMTP(settings.smtp.host, settings.smtp.port, timeout=timeout_s) as smtp:
            if settings.smtp.security == "starttls":  # the TLS profile: through STARTTLS
                from streams.adapters.smtp import SmtpTransport

                smtp.starttls(context=SmtpTransport(settings.smtp).tls_context())
            code, _ = smtp.noop()
    except (OSError, smtplib.SMTPException) as exc:
        return f"NOOP failed: {exc}"
    if code != 250:
        return f"NOOP answered {code}"
    return None


def tax_check(settings: Settings, timeout_s: float = 3.0) -> str | None:
    try:
        response = httpx.get(settings.tax.url + "/health", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"GET /health failed: {exc!r}"
    if response.status_code != 200:
        return f"GET /health answered {response.status_code}"
    return None


def wait_healthy(
    service: str,
    check: Check,
    *,
    timeout_s: float,
    log: Path,
    alive: Callable[[], bool] | None = None,
    interval_s: float = 0.5,
) -> float:
    """Poll ``check`` until it passes; return the seconds it took.

    ``alive`` (optional) reports whether the process still runs: a process that
    died fails at once instead of after the whole timeout.

    Raises:
        ServiceUnhealthy: the timeout passed or the process died; names the log.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    reason: str | None = "not checked yet"
    while time.monotonic() < deadline:
        reason = check()
        if reason is None:
            return time.monotonic() - started
        if alive is not None and not alive():
            raise ServiceUnhealthy(service, f"process exited ({reason})", str(log))
        time.sleep(interval_s)
    raise ServiceUnhealthy(
        service, f"no healthy answer within {timeout_s:.0f}s ({reason})", str(log)
    )
