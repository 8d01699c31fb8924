"""The TLS profile's pieces without services: the certificates and the clients'
environment (valid settings that ask for TLS everywhere, the environment file read back
as written), and the configs rendered from those settings (Redis on ``tls-port`` only
with the ACL user, Connect's worker and its clients over SASL_SSL, PostgreSQL's options,
the SMTP sink's STARTTLS and AUTH parameters)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from streams.devtools.stack import services as svc
from streams.devtools.stack import tls
from streams.devtools.stack.layout import Layout
from streams.devtools.stack.smtp_sink import build_parser, tls_parameters
from streams.settings import KafkaSettings, Settings


@pytest.fixture
def tls_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, tls.TlsFiles]:
    monkeypatch.setenv("INVOICING_STACK__HOME", str(tmp_path))
    files = tls.tls_files(tmp_path / ".local" / "conf")
    tls.make_certificates(files)
    env = tls.client_environment(Settings(), files)
    path = tls.write_environment(files, env)
    assert path.stat().st_mode & 0o077 == 0, "the environment file holds passwords: 0600"
    assert tls.read_environment(path) == env
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings(), files


def test_the_environment_asks_for_tls_everywhere(tls_env: tuple[Settings, tls.TlsFiles]) -> None:
    settings, files = tls_env
    assert tls.kafka_tls(settings) and tls.postgres_tls(settings)
    assert tls.redis_tls(settings) and tls.smtp_tls(settings)
    assert settings.postgres.sslrootcert == files.ca and settings.kafka.ssl_ca_file == files.ca
    assert (
        files.key.stat().st_mode & 0o077 == 0 and files.kafka_keystore.stat().st_mode & 0o077 == 0
    )
    context = ssl.create_default_context(cafile=str(files.ca))
    context.load_cert_chain(str(files.kafka_keystore))  # key and chain in one PEM file
    assert files.key.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----"), "PKCS#8 for Kafka"
    assert not tls.kafka_tls(Settings(kafka=KafkaSettings()))


def test_redis_and_connect_configs_follow_the_settings(
    tls_env: tuple[Settings, tls.TlsFiles],
) -> None:
    settings, files = tls_env
    layout = Layout(settings.stack.home)
    layout.ensure()
    svc.prepare_redis(layout, settings)
    redis_conf = (layout.conf / "redis.conf").read_text().splitlines()
    port = settings.redis.url.get_secret_value().rsplit(":", 1)[1].split("/")[0]
    assert "port 0" in redis_conf and f"tls-port {port}" in redis_conf
    assert "user default off" in redis_conf
    assert any(line.startswith(f"user {tls.REDIS_USER} on >") for line in redis_conf)
    svc.prepare_connect(layout, settings)
    worker = (layout.conf / "connect-distributed.properties").read_text().splitlines()
    for prefix in ("", "producer.", "consumer.", "admin."):
        assert f"{prefix}security.protocol=SASL_SSL" in worker
        assert f"{prefix}ssl.truststore.location={files.ca}" in worker


def test_plain_settings_render_plain_configs(tmp_path: Path) -> None:
    settings = Settings.model_validate({"stack": {"home": str(tmp_path)}})
    layout = Layout(tmp_path)
    layout.ensure()
    svc.prepare_redis(layout, settings)
    assert "tls-port" not in (layout.conf / "redis.conf").read_text()
    svc.prepare_connect(layout, settings)
    assert "SASL_SSL" not in (layout.conf / "connect-distributed.properties").read_text()


def test_the_one_connect_worker_gets_its_lost_connectors_back_at_once(tmp_path: Path) -> None:
    """docs/architecture.md "Kafka Connect after a broker outage": without this line a
    broker outage can leave the outbox connector UNASSIGNED for five minutes."""
    settings = Settings.model_validate({"stack": {"home": str(tmp_path)}})
    layout = Layout(tmp_path)
    layout.ensure()
    svc.prepare_connect(layout, settings)
    worker = (layout.conf / "connect-distributed.properties").read_text().splitlines()
    assert "scheduled.rebalance.max.delay.ms=0" in worker


def test_the_sink_requires_starttls_and_auth(
    tls_env: tuple[Settings, tls.TlsFiles], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, files = tls_env
    argv = ["--maildir", "m", "--tls-cert", str(files.cert), "--tls-key", str(files.key)]
    args = build_parser().parse_args([*argv, "--auth-user", "invoicing"])
    params = tls_parameters(args)
    assert params["require_starttls"] is True and params["auth_required"] is True
    assert params["auth_require_tls"] is True
    assert tls_parameters(build_parser().parse_args(["--maildir", "m"])) == {}


def test_the_sink_under_the_profile_takes_mail_only_over_starttls_with_auth(
    tls_env: tuple[Settings, tls.TlsFiles], tmp_path: Path
) -> None:
    import smtplib
    import subprocess
    import sys
    import time
    from email.message import EmailMessage

    from streams.adapters.smtp import SmtpTransport
    from streams.devtools.stack.health import smtp_check
    from streams.devtools.stack.maildir import list_messages
    from tests.unit.test_tls_settings import free_port

    settings, files = tls_env
    port = free_port()
    smtp = settings.smtp.model_copy(update={"port": port, "timeout_s": 30.0})  # a loaded box
    settings = settings.model_copy(update={"smtp": smtp})
    argv = [sys.executable, "-m", "streams.devtools.stack.smtp_sink", "--port", str(port)]
    argv += ["--maildir", str(tmp_path / "maildir"), "--tls-cert", str(files.cert)]
    argv += ["--tls-key", str(files.key), "--auth-user", tls.SMTP_USER]
    env = {"SMTP_SINK_PASSWORD": tls.SMTP_PASSWORD, "PATH": "/usr/bin:/bin"}
    log = tmp_path / "sink.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 20
        while smtp_check(settings) is not None:  # health check: through STARTTLS
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the sink did not start: {smtp_check(settings)}\n{log.read_text()}")
            time.sleep(0.1)
        with smtplib.SMTP("127.0.0.1", port, timeout=5) as plain:
            assert plain.mail("billing@invoicing.example")[0] == 530
        msg = EmailMessage()
        msg["Message-ID"] = "<tls-profile@invoicing.example>"
        msg["Subject"] = "Invoice"
        msg.set_content("over TLS")
        SmtpTransport(smtp).send(msg, from_address="b@x.example", to_address="c@y.example")
        stored = list_messages(tmp_path / "maildir")
        assert len(stored) == 1
    finally:
        process.terminate()
        process.wait(timeout=15)
