"""docker-compose.yml describes the same stack as `invoicing stack up`, on the same ports."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, get_args
from urllib.parse import urlparse

import pytest
import yaml

from streams.adapters.connect import FILE_CONFIG_PROVIDER, render_outbox_config
from streams.settings import RoleName, Settings

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
    assert host_ports(services["redis"]) == {urlparse(s.redis.url.get_secret_value()).port}
    assert host_ports(services["kafka"]) == {int(s.kafka.bootstrap_servers.rsplit(":", 1)[1])}
    assert host_ports(services["connect"]) == {urlparse(s.connect.url).port}
    assert host_ports(services["smtp"]) == {s.smtp.port}
    assert host_ports(services["tax"]) == {urlparse(s.tax.url).port}


def test_postgres_environment_equals_settings(compose: dict[str, Any]) -> None:
    """The database's superuser is the `provision` service's alone: it is none of the
    settings' logins, and nothing that runs the application knows its password."""
    s = defaults()
    pg = compose["services"]["postgres"]
    env = pg["environment"]
    logins = {s.postgres.role(r).user for r in get_args(RoleName)}
    assert env["POSTGRES_USER"] not in logins
    assert "wal_level=logical" in pg["command"]
    provision = compose["services"]["provision"]["environment"]
    assert (provision["PGUSER"], provision["PGPASSWORD"]) == (
        env["POSTGRES_USER"],
        env["POSTGRES_PASSWORD"],
    )
    assert provision["PGHOST"] == "postgres"
    for name in ("invoicing-worker", "email-sender", "connect", "smtp", "tax"):
        values = [str(v) for v in (compose["services"][name].get("environment") or {}).values()]
        assert env["POSTGRES_PASSWORD"] not in values, name
        assert not {"PGUSER", "PGPASSWORD"} & set(
            compose["services"][name].get("environment") or {}
        )


def test_the_database_is_the_settings_database(compose: dict[str, Any]) -> None:
    """`provision` creates the settings' database (owned by the owner login) as the
    superuser: the image's POSTGRES_DB is only the superuser's maintenance database."""
    s = defaults()
    command = " ".join(compose["services"]["provision"]["command"])
    assert "invoicing db provision" in command and "invoicing db migrate" in command
    assert "INVOICING_POSTGRES__DATABASE" not in compose["services"]["provision"]["environment"]
    assert s.postgres.database == "invoicing"


def _compose_settings(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings the `provision` service runs with (its environment over the defaults)."""
    for name in list(os.environ):
        if name.startswith("INVOICING_"):
            monkeypatch.delenv(name)
    for name, value in compose["services"]["provision"]["environment"].items():
        if name.startswith("INVOICING_"):
            monkeypatch.setenv(name, str(value))
    return Settings()


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """container path → host path of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        host, container, *_ = str(volume).split(":")
        out[container] = (ROOT / host).resolve()
    return out


def test_the_compose_connector_config_names_compose_hosts_and_no_password(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under compose, the connector config is rendered by `provision` inside the compose
    network: Connect must reach PostgreSQL as the `postgres` service on its container port,
    and read the password through the file config provider from a mounted file."""
    settings = _compose_settings(compose, monkeypatch)
    config = render_outbox_config(settings, ROOT)
    services = compose["services"]
    assert config["database.hostname"] in services
    assert config["database.hostname"] == "postgres"
    assert config["database.port"] == "5432"
    assert {str(p).split(":")[-1] for p in services["postgres"]["ports"]} == {"5432"}
    assert "127.0.0.1" not in json.dumps(config)

    # ${file:<path>:password}, <path> inside a folder mounted into the connect service.
    match = re.fullmatch(r"\$\{file:(?P<path>[^:}]+):password\}", config["database.password"])
    assert match, config["database.password"]
    folder, _, name = match["path"].rpartition("/")
    connect = services["connect"]
    host_file = _mounts(connect)[folder] / name
    stored = dict(
        line.split("=", 1)
        for line in host_file.read_text().splitlines()
        if line and not line.startswith("#")
    )
    password = settings.postgres.replication.password.get_secret_value()
    assert stored["password"] == password
    secret_keys = [k for k in config if "password" in k]
    assert secret_keys == ["database.password"]
    env = connect["environment"]
    assert env["CONNECT_CONFIG_PROVIDERS"] == "file"
    assert env["CONNECT_CONFIG_PROVIDERS_FILE_CLASS"] == FILE_CONFIG_PROVIDER
    assert env["CONNECT_CONFIG_PROVIDERS_FILE_PARAM_ALLOWED_PATHS"] == folder
    assert config["database.user"] == settings.postgres.replication.user


def test_the_local_connector_config_is_rendered_from_host_settings() -> None:
    """The same template on the local stack: host settings, the local secrets folder."""
    s = defaults()
    config = render_outbox_config(s, ROOT)
    assert (config["database.hostname"], config["database.port"]) == (
        s.postgres.host,
        str(s.postgres.port),
    )
    assert config["database.password"] == (
        f"${{file:{s.stack.local_dir}/conf/connect-secrets/{s.postgres.replication.user}"
        ".properties:password}"
    )


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
    # One worker: lost connectors come back at once (docs/architecture.md).
    assert env["CONNECT_SCHEDULED_REBALANCE_MAX_DELAY_MS"] == "0"


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


#: Every process of the product, as a compose service (docker/Dockerfile's entry point is
#: `invoicing`, so a service's command is an `invoicing` command line).
PROCESSES = ("invoicing-worker", "email-sender", "usage-view", "ingest", "portal")


def _cli_paths() -> set[tuple[str, ...]]:
    import typer

    from streams.entrypoints.app import app

    paths: set[tuple[str, ...]] = set()

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        paths.add(path)
        for name, sub in (getattr(cmd, "commands", None) or {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return paths


def test_every_process_runs_its_real_command(compose: dict[str, Any]) -> None:
    services = compose["services"]
    known = _cli_paths()
    for name in PROCESSES:
        command = tuple(services[name]["command"])
        assert command in known, f"{name}: invoicing {' '.join(command)} is no command"
        assert "entrypoint" not in services[name]
        assert services[name]["profiles"] == ["workers"]
    # the others replace the entry point on purpose
    assert services["smtp"]["entrypoint"][:2] == ["python", "-m"]
    assert services["provision"]["entrypoint"] == ["sh", "-c"]


def test_every_process_settings_load_and_serve_metrics(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    for name in PROCESSES:
        for var in list(os.environ):
            if var.startswith("INVOICING_"):
                monkeypatch.delenv(var)
        for var, value in services[name]["environment"].items():
            monkeypatch.setenv(var, str(value))
        s = Settings()
        ports = [str(p) for p in services[name]["ports"]]
        assert all(p.startswith("127.0.0.1:") for p in ports)
        if name in ("invoicing-worker", "email-sender"):
            assert s.worker.metrics_host == "0.0.0.0" and s.worker.metrics_port
            assert any(p.endswith(f":{s.worker.metrics_port}") for p in ports)
        else:
            host, port = {
                "usage-view": (s.view.host, s.view.port),
                "ingest": (s.ingest.host, s.ingest.port),
                "portal": (s.portal.host, s.portal.port),
            }[name]
            assert host == "0.0.0.0"
            assert any(p.endswith(f":{port}") for p in ports)
            assert "/health" in " ".join(services[name]["healthcheck"]["test"])
