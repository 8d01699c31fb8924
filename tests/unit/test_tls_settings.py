"""TLS and authentication settings reach every client they configure: the librdkafka
configs (producer, consumer, reader, admin), the usage view's faust credentials (and
the aiokafka arguments faust makes of them), every libpq connection string, the
migrations' URL and the Debezium connector, the Redis client, and the SMTP transport
(a real STARTTLS / implicit-TLS relay with AUTH, on loopback, certificates from
trustme). Secrets stay out of ``repr``, ``config show`` and the view's config."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pydantic
import pytest
import redis
import trustme
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from psycopg.conninfo import conninfo_to_dict
from typer.testing import CliRunner

from streams.adapters.connect import render_outbox_config
from streams.adapters.kafka import (
    consumer_config,
    faust_credentials,
    producer_config,
    reader_config,
    security_config,
)
from streams.adapters.postgres.migrate import url
from streams.adapters.smtp import SmtpTransport
from streams.core.billing.mail_errors import SmtpTransientError
from streams.entrypoints.app import app
from streams.settings import KafkaSettings, PostgresSettings, Settings, SmtpSettings

KAFKA_PASSWORD = "kafka-pw-XYZ"
ROOT = Path(__file__).resolve().parents[2]


def sasl_kafka(tmp_path: Path, **extra: Any) -> KafkaSettings:
    return KafkaSettings.model_validate(
        {
            "bootstrap_servers": "broker:9093",
            "security_protocol": "SASL_SSL",
            "sasl_username": "invoicing",
            "sasl_password": KAFKA_PASSWORD,
            "ssl_ca_file": str(tmp_path / "ca.pem"),
            **extra,
        }
    )


def test_plaintext_adds_no_security_keys() -> None:
    kafka = KafkaSettings()
    assert security_config(kafka) == {}
    for config in (
        producer_config(kafka),
        consumer_config(kafka, "g"),
        reader_config(kafka, "g"),
    ):
        assert not any(key.startswith(("security.", "sasl.", "ssl.")) for key in config)
    assert faust_credentials(kafka) is None


def test_sasl_ssl_reaches_every_librdkafka_config(tmp_path: Path) -> None:
    kafka = sasl_kafka(tmp_path)
    expected = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "invoicing",
        "sasl.password": KAFKA_PASSWORD,
        "ssl.ca.location": str(tmp_path / "ca.pem"),
    }
    assert security_config(kafka) == expected
    for config in (
        producer_config(kafka),
        consumer_config(kafka, "g"),
        reader_config(kafka, "g"),
    ):
        assert expected.items() <= config.items()
    assert KAFKA_PASSWORD not in repr(kafka) and KAFKA_PASSWORD not in kafka.model_dump_json()


def test_mtls_adds_the_client_certificate(tmp_path: Path) -> None:
    kafka = KafkaSettings.model_validate(
        {
            "security_protocol": "SSL",
            "ssl_ca_file": str(tmp_path / "ca.pem"),
            "ssl_cert_file": str(tmp_path / "client.pem"),
            "ssl_key_file": str(tmp_path / "client.key"),
        }
    )
    assert security_config(kafka) == {
        "security.protocol": "SSL",
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
    }


@pytest.mark.parametrize(
    "given",
    [
        {"security_protocol": "SASL_SSL", "sasl_username": "u"},
        {"security_protocol": "SASL_SSL", "sasl_password": "p"},
        {"security_protocol": "SSL", "ssl_cert_file": "/c.pem"},
    ],
)
def test_incomplete_kafka_security_is_refused(given: dict[str, str]) -> None:
    with pytest.raises(pydantic.ValidationError):
        KafkaSettings.model_validate(given)


def test_the_usage_view_gets_sasl_ssl_credentials(tmp_path: Path) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from streams.bootstrap.view import view_config

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    settings = Settings(kafka=sasl_kafka(tmp_path))
    config = view_config(settings)
    auth = credentials_to_aiokafka_auth(config.broker_credentials)
    assert auth["security_protocol"] == "SASL_SSL"
    assert auth["sasl_mechanism"] == "SCRAM-SHA-512"
    assert auth["sasl_plain_username"] == "invoicing"
    assert auth["sasl_plain_password"] == KAFKA_PASSWORD
    context = auth["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.get_ca_certs(), "the CA file was not loaded"
    assert KAFKA_PASSWORD not in repr(config)


def test_the_usage_view_gets_ssl_credentials_with_a_client_certificate(tmp_path: Path) -> None:
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    client = ca.issue_cert("invoicing-client")
    client.cert_chain_pems[0].write_to_path(str(tmp_path / "client.pem"))
    client.private_key_pem.write_to_path(str(tmp_path / "client.key"))
    kafka = KafkaSettings.model_validate(
        {
            "security_protocol": "SSL",
            "ssl_ca_file": str(tmp_path / "ca.pem"),
            "ssl_cert_file": str(tmp_path / "client.pem"),
            "ssl_key_file": str(tmp_path / "client.key"),
        }
    )
    auth = credentials_to_aiokafka_auth(faust_credentials(kafka))
    assert auth["security_protocol"] == "SSL"
    assert isinstance(auth["ssl_context"], ssl.SSLContext)


def test_every_libpq_connection_carries_sslmode_and_the_ca(tmp_path: Path) -> None:
    default = conninfo_to_dict(PostgresSettings().dsn("worker"))
    assert default["sslmode"] == "prefer" and "sslrootcert" not in default
    pg = PostgresSettings(sslmode="verify-full", sslrootcert=tmp_path / "ca.pem")
    for role in ("worker", "email", "owner", "replication", "provisioner"):
        parsed = conninfo_to_dict(pg.dsn(role))
        assert parsed["sslmode"] == "verify-full"
        assert parsed["sslrootcert"] == str(tmp_path / "ca.pem")
    assert url(pg).query["sslmode"] == "verify-full"
    assert url(pg).query["sslrootcert"] == str(tmp_path / "ca.pem")


def test_debezium_gets_the_postgres_tls_settings(tmp_path: Path) -> None:
    plain = render_outbox_config(Settings(), ROOT)
    assert "database.sslmode" not in plain and "database.sslrootcert" not in plain
    settings = Settings(
        postgres=PostgresSettings(sslmode="verify-full", sslrootcert=tmp_path / "ca.pem")
    )
    config = render_outbox_config(settings, ROOT)
    assert config["database.sslmode"] == "verify-full"
    assert config["database.sslrootcert"] == str(tmp_path / "ca.pem")


def test_the_redis_client_uses_tls_the_ca_and_the_acl_login(tmp_path: Path) -> None:
    from streams.bootstrap.clients import redis_client

    settings = Settings.model_validate(
        {
            "redis": {
                "url": "rediss://redis.internal:6380/0",
                "ssl_ca_file": str(tmp_path / "ca.pem"),
                "username": "invoicing",
                "password": "redis-pw-XYZ",
            }
        }
    )
    client = redis_client(settings)
    try:
        pool = client.connection_pool
        assert pool.connection_class is redis.SSLConnection
        kwargs = pool.connection_kwargs
        assert kwargs["ssl_ca_certs"] == str(tmp_path / "ca.pem")
        assert kwargs["ssl_cert_reqs"] == "required" and kwargs["ssl_check_hostname"] is True
        assert kwargs["username"] == "invoicing" and kwargs["password"] == "redis-pw-XYZ"
    finally:
        client.close()
    plain = Settings().redis.client_kwargs()
    assert plain == {}, "a redis:// URL gets no TLS arguments (redis-py would refuse them)"


def test_config_show_masks_the_new_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INVOICING_KAFKA__SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("INVOICING_KAFKA__SASL_USERNAME", "invoicing")
    monkeypatch.setenv("INVOICING_KAFKA__SASL_PASSWORD", KAFKA_PASSWORD)
    monkeypatch.setenv("INVOICING_REDIS__PASSWORD", "redis-pw-XYZ")
    monkeypatch.setenv("INVOICING_SMTP__SECURITY", "starttls")
    monkeypatch.setenv("INVOICING_SMTP__USERNAME", "mailer")
    monkeypatch.setenv("INVOICING_SMTP__PASSWORD", "smtp-pw-XYZ")
    result = CliRunner().invoke(app, ["config", "show", "--json"])
    assert result.exit_code == 0, result.output
    assert "XYZ" not in result.output
    rows = {row["key"]: row for row in json.loads(result.output)}
    for key in ("kafka.sasl_password", "redis.password", "smtp.password"):
        assert rows[key]["secret"] is True and rows[key]["value"] == "***", key
    assert rows["kafka.security_protocol"]["value"] == "SASL_SSL"


def test_smtp_auth_without_tls_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        SmtpSettings.model_validate({"username": "mailer", "password": "x"})


# ---------------------------------------------------------------------------------------
# A real relay on loopback: aiosmtpd with a trustme certificate for 127.0.0.1.


class Inbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.logins: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.content)
        return "250 OK"

    def authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any
    ) -> AuthResult:
        ok = isinstance(auth_data, LoginPassword) and auth_data.password == b"smtp-pw"
        if ok:
            self.logins.append(auth_data.login)
        return AuthResult(success=ok)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def server_context(ca: trustme.CA) -> ssl.SSLContext:
    # PROTOCOL_TLS_SERVER; aiosmtpd's readiness probe of an implicit-TLS server wraps a
    # client socket with the context it is given, hence a separate probe-able context below.
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


def relay(ca: trustme.CA, **params: Any) -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    controller = Controller(
        inbox, hostname="127.0.0.1", port=free_port(), authenticator=inbox.authenticate, **params
    )
    controller.start()
    try:
        yield inbox, controller.port
    finally:
        controller.stop()


@pytest.fixture
def starttls_relay(ca: trustme.CA) -> Iterator[tuple[Inbox, int]]:
    yield from relay(
        ca, tls_context=server_context(ca), require_starttls=True, auth_require_tls=True
    )


def ca_file(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


def message() -> EmailMessage:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "billing@x.example", "c@y.example", "Invoice"
    msg.set_content("hello")
    return msg


def smtp(port: int, **given: Any) -> SmtpSettings:
    return SmtpSettings.model_validate({"host": "127.0.0.1", "port": port, **given})


def test_starttls_and_auth_deliver(
    starttls_relay: tuple[Inbox, int], ca: trustme.CA, tmp_path: Path
) -> None:
    inbox, port = starttls_relay
    settings = smtp(
        port,
        security="starttls",
        ca_file=str(ca_file(ca, tmp_path)),
        username="mailer",
        password="smtp-pw",
    )
    SmtpTransport(settings).send(message(), from_address="b@x.example", to_address="c@y.example")
    assert inbox.logins == [b"mailer"]
    assert len(inbox.messages) == 1 and b"hello" in inbox.messages[0]


def test_starttls_refuses_an_unknown_ca(starttls_relay: tuple[Inbox, int], tmp_path: Path) -> None:
    inbox, port = starttls_relay
    other = ca_file(trustme.CA(), tmp_path)
    settings = smtp(port, security="starttls", ca_file=str(other))
    with pytest.raises(SmtpTransientError):
        SmtpTransport(settings).send(message(), from_address="b@x.example", to_address="c@y")
    assert inbox.messages == []


def test_a_wrong_password_is_transient(
    starttls_relay: tuple[Inbox, int], ca: trustme.CA, tmp_path: Path
) -> None:
    inbox, port = starttls_relay
    settings = smtp(
        port,
        security="starttls",
        ca_file=str(ca_file(ca, tmp_path)),
        username="mailer",
        password="wrong",
        timeout_s=2.0,  # smtplib tries its next mechanism after a refusal; bound the wait
    )
    with pytest.raises(SmtpTransientError):
        SmtpTransport(settings).send(message(), from_address="b@x.example", to_address="c@y")
    assert inbox.messages == []


def test_a_relay_without_starttls_is_never_used_in_clear(ca: trustme.CA, tmp_path: Path) -> None:
    for inbox, port in relay(ca):
        settings = smtp(port, security="starttls", ca_file=str(ca_file(ca, tmp_path)))
        with pytest.raises(SmtpTransientError, match="lacks"):
            SmtpTransport(settings).send(message(), from_address="b@x.example", to_address="c@y")
        assert inbox.messages == []


def test_implicit_tls_and_auth_deliver(ca: trustme.CA, tmp_path: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    probe_ok = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe_ok.check_hostname = False
    probe_ok.verify_mode = ssl.CERT_NONE

    class TlsController(Controller):
        # aiosmtpd's readiness probe wraps its client socket with ``ssl_context``: give it
        # a client context, and the server the server one.
        def _trigger_server(self) -> None:
            server_ctx, self.ssl_context = self.ssl_context, probe_ok
            try:
                super()._trigger_server()  # type: ignore[no-untyped-call]
            finally:
                self.ssl_context = server_ctx

    inbox = Inbox()
    controller = TlsController(
        inbox,
        hostname="127.0.0.1",
        port=free_port(),
        ssl_context=context,
        authenticator=inbox.authenticate,
        auth_require_tls=False,
    )
    controller.start()
    try:
        settings = smtp(
            controller.port,
            security="tls",
            ca_file=str(ca_file(ca, tmp_path)),
            username="mailer",
            password="smtp-pw",
        )
        SmtpTransport(settings).send(
            message(), from_address="b@x.example", to_address="c@y.example"
        )
    finally:
        controller.stop()
    assert inbox.logins == [b"mailer"] and len(inbox.messages) == 1
