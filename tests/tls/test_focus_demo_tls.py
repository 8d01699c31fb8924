"""The FOCUS demo end to end on the TLS profile of the local stack
(``invoicing stack up --profile tls``; ``make test-tls`` brings it up, runs this and
stops it): every client over TLS with its login (Kafka SASL_SSL / SCRAM-SHA-512,
PostgreSQL verify-full, Redis ``rediss://`` with the ACL user, SMTP STARTTLS with
AUTH), and each service's plaintext door shut.

Runs only when asked (``-m tls``, tests/conftest.py); needs the profile's environment
(``source .local/conf/tls/tls.env``) and fails loudly without it (``tls_settings``,
tests/tls/conftest.py)."""

from __future__ import annotations

import os
import smtplib
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka.admin import AdminClient
from psycopg.conninfo import make_conninfo

from streams.adapters.kafka import admin_client
from streams.settings import Settings
from streams.topics import ACCOUNT_EVENTS

pytestmark = pytest.mark.tls

ROOT = Path(__file__).resolve().parents[2]


def test_the_tls_clients_reach_every_service(tls_settings: Settings) -> None:
    s = tls_settings
    metadata = admin_client(s.kafka).list_topics(timeout=15)
    assert metadata.brokers, "no broker over SASL_SSL"
    with psycopg.connect(s.postgres.dsn("operator", connect_timeout=5)) as conn:
        row = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert row == (True,)
    client = redis.Redis.from_url(s.redis.url.get_secret_value(), **s.redis.client_kwargs())
    try:
        assert client.ping() is True
    finally:
        client.close()


def test_the_usage_views_aiokafka_client_connects(tls_settings: Settings) -> None:
    """The usage view's path: faust's credentials, turned into aiokafka's arguments by
    faust itself, reach the broker (a producer starts: metadata over SASL_SSL)."""
    import asyncio

    from aiokafka import AIOKafkaProducer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streams.adapters.kafka import faust_credentials

    auth = credentials_to_aiokafka_auth(faust_credentials(tls_settings.kafka))

    async def connect() -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=tls_settings.kafka.bootstrap_servers, request_timeout_ms=15000, **auth
        )
        await producer.start()
        try:
            topic = ACCOUNT_EVENTS.with_prefix(tls_settings.kafka.topic_prefix).name
            assert await producer.partitions_for(topic)
        finally:
            await producer.stop()

    asyncio.run(connect())


def test_the_plaintext_doors_are_shut(tls_settings: Settings) -> None:
    s = tls_settings
    plain = AdminClient({"bootstrap.servers": s.kafka.bootstrap_servers, "log_level": 0})
    assert not _lists(plain), "the broker answered a plaintext client"
    params = {**s.postgres.conninfo_params("operator", connect_timeout=5), "sslmode": "disable"}
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(make_conninfo("", **params))
    port = int(s.redis.url.get_secret_value().rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(redis.RedisError):
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=3).ping()
    with smtplib.SMTP(s.smtp.host, s.smtp.port, timeout=5) as conn:
        code, _ = conn.mail("billing@invoicing.example")
        assert code == 530, "the sink took MAIL before STARTTLS"


def _lists(admin: AdminClient) -> bool:
    """Whether a plaintext metadata request got an answer (it must not)."""
    from confluent_kafka import KafkaException

    try:
        admin.list_topics(timeout=5)
    except KafkaException:
        return False
    return True


def test_the_focus_demo_passes_over_tls(tls_settings: Settings) -> None:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "invoicing"), "demo", "--scenario", "focus"],
        cwd=ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
