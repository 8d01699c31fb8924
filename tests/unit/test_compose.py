"""docker-compose.yml describes the same stack as `invoicing stack up`, on the same ports."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def defaults() -> Settings:
    """The settings' defaults, whatever INVOICING_* variables this shell sets: the
    compose file describes the default stack (a worktree may run its own on other ports)."""
    return Settings.model_construct()


def host_ports(service: dict[str, Any]) -> set[int]:
    ports = set()
    for mapping in service.get("ports", []):
        parts = str(mapping).split(":")
        assert parts[0] == "127.0.0.1", f"{mapping} must bind loopback only"
        ports.add(int(parts[1]))
    return ports


def test_services_match_the_local_stack(compose: dict[str, Any]) -> None:
    assert {"postgres", "redis", "kafka", "connect", "smtp", "tax"} <= set(compose["services"])
    assert {"invoicing-worker", "email-sender"} <= set(compose["services"])


def test_host_ports_equal_settings_defaults(compose: dict[str, Any]) -> None:
    s = defaults()
    services = compose["services"]
    assert host_ports(services["postgres"]) == {s.postgres.port}
    assert host_ports(services["redis"]) == {urlparse(s.redis.url).port}
    assert host_ports(services["kafka"]) == {int(s.kafka.bootstrap_servers.rsplit(":", 1)[1])}
    assert host_ports(services["connect"]) == {urlparse(s.connect.url).port}
    assert host_ports(services["smtp"]) == {s.smtp.port}
    assert host_ports(services["tax"]) == {urlparse(s.tax.url).port}


def test_postgres_environment_equals_settings(compose: dict[str, Any]) -> None:
    s = defaults()
    pg = compose["services"]["postgres"]
    env = pg["environment"]
    assert env["POSTGRES_USER"] == s.postgres.user
    assert env["POSTGRES_PASSWORD"] == s.postgres.password.get_secret_value()
    assert env["POSTGRES_DB"] == s.postgres.database
    assert env["INVOICING_REPLICATION_USER"] == s.postgres.replication_user
    assert (
        env["INVOICING_REPLICATION_PASSWORD"] == s.postgres.replication_password.get_secret_value()
    )
    assert "wal_level=logical" in pg["command"]


def test_kafka_advertises_the_settings_bootstrap_address(compose: dict[str, Any]) -> None:
    s = defaults()
    env = compose["services"]["kafka"]["environment"]
    assert f"HOST://{s.kafka.bootstrap_servers}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_connect_group_matches_settings(compose: dict[str, Any]) -> None:
    s = defaults()
    env = compose["services"]["connect"]["environment"]
    assert env["GROUP_ID"] == s.connect.group_id
    for key in (
        "CONFIG_STORAGE_REPLICATION_FACTOR",
        "OFFSET_STORAGE_REPLICATION_FACTOR",
        "STATUS_STORAGE_REPLICATION_FACTOR",
    ):
        assert env[key] == "1"


def test_pinned_versions_agree_with_the_pom(compose: dict[str, Any]) -> None:
    pom = (ROOT / "connectors" / "pom.xml").read_text()
    kafka_image = compose["services"]["kafka"]["image"]
    connect_image = compose["services"]["connect"]["image"]
    kafka_version = kafka_image.split(":")[1]
    debezium_version = connect_image.split(":")[1]
    assert f"<kafka.version>{kafka_version}</kafka.version>" in pom
    assert f"<debezium.version>{debezium_version}</debezium.version>" in pom


def test_workers_point_at_compose_services(compose: dict[str, Any]) -> None:
    env = compose["services"]["invoicing-worker"]["environment"]
    settings_fields = {
        "INVOICING_KAFKA__BOOTSTRAP_SERVERS",
        "INVOICING_POSTGRES__HOST",
        "INVOICING_REDIS__URL",
        "INVOICING_TAX__URL",
        "INVOICING_SMTP__HOST",
    }
    assert settings_fields <= set(env)
    # Every variable is a real settings field (the prefix/nesting is what pydantic-settings reads).
    for name, value in env.items():
        section, _, field = name.removeprefix("INVOICING_").lower().partition("__")
        assert field in type(getattr(Settings(), section)).model_fields, name
        assert value
