"""The local stack's TLS profile (``invoicing stack up --profile tls``, docs/production.md
"TLS and authentication"): certificates made per run with ``trustme`` (a throwaway CA
and one server certificate for 127.0.0.1 and localhost), and the client settings that
go with them, written as an environment file the processes and tests read.

Files under ``.local/conf/tls/`` (keys mode 0600): ``ca.pem``; ``server.pem`` and
``server.key`` (PostgreSQL, Redis, the SMTP sink); ``kafka-keystore.pem`` (key and chain
in one PEM file, Kafka's ``ssl.keystore.type=PEM``); ``tls.env`` (``INVOICING_*=…``).

What each service does under the profile is decided from the client settings it must
serve (:func:`kafka_tls`, :func:`postgres_tls`, :func:`redis_tls`, :func:`smtp_tls`), so
the rendered configs and the clients cannot disagree. The logins are the local stack's
fixed development ones (as its PostgreSQL passwords are): a SCRAM-SHA-512 user created
when Kafka's storage is formatted, a Redis ACL user, an SMTP AUTH user.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from streams.settings import Settings

#: The Kafka SCRAM user (clients, Connect and the broker itself), the Redis ACL user and
#: the SMTP AUTH user of the profile, with their (local, fixed) passwords.
KAFKA_USER, KAFKA_PASSWORD = "invoicing", "invoicing-kafka-local"
REDIS_USER, REDIS_PASSWORD = "invoicing", "invoicing-redis-local"
SMTP_USER, SMTP_PASSWORD = "invoicing", "invoicing-smtp-local"


@dataclass(frozen=True)
class TlsFiles:
    """The profile's files (see the module docstring)."""

    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def cert(self) -> Path:
        return self.dir / "server.pem"

    @property
    def key(self) -> Path:
        return self.dir / "server.key"

    @property
    def kafka_keystore(self) -> Path:
        return self.dir / "kafka-keystore.pem"

    @property
    def env(self) -> Path:
        return self.dir / "tls.env"


def tls_files(conf: Path) -> TlsFiles:
    """The profile's files under the stack's conf folder ``conf``."""
    return TlsFiles(conf / "tls")


def make_certificates(files: TlsFiles, os_user: str | None = None) -> None:
    """A new CA and server certificate (SANs 127.0.0.1, localhost) into ``files``;
    the key files mode 0600, owned by ``os_user`` when given (PostgreSQL refuses a key
    another user can read, and runs as that user when the stack runs as root)."""
    import shutil

    import trustme
    from cryptography.hazmat.primitives import serialization

    files.dir.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="invoicing local stack")
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(files.ca))
    chain = b"".join(blob.bytes() for blob in server.cert_chain_pems)
    files.cert.write_bytes(chain)
    # PKCS#8 ("BEGIN PRIVATE KEY"): the one form Kafka's PEM keystore reads unencrypted.
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
    pkcs8 = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    for path, data in ((files.key, pkcs8), (files.kafka_keystore, pkcs8 + chain)):
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_bytes(data)
    if os_user is not None and os.geteuid() == 0:
        shutil.chown(files.key, os_user, None)


def client_environment(settings: Settings, files: TlsFiles) -> dict[str, str]:
    """The ``INVOICING_*`` variables of a client of the TLS stack: Kafka SASL_SSL
    (SCRAM-SHA-512) with the CA, PostgreSQL verify-full, Redis ``rediss://`` with the
    ACL user, SMTP STARTTLS with AUTH. Addresses and ports are those of ``settings``."""
    from urllib.parse import urlsplit

    redis_url = urlsplit(settings.redis.url.get_secret_value())
    host = redis_url.hostname or "127.0.0.1"
    return {
        # every address, not only Redis's (whose URL changes scheme): a shell that
        # sources only tls.env reaches this stack whatever its port offset
        "INVOICING_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "INVOICING_POSTGRES__HOST": settings.postgres.host,
        "INVOICING_POSTGRES__PORT": str(settings.postgres.port),
        "INVOICING_SMTP__HOST": settings.smtp.host,
        "INVOICING_SMTP__PORT": str(settings.smtp.port),
        "INVOICING_KAFKA__SECURITY_PROTOCOL": "SASL_SSL",
        "INVOICING_KAFKA__SASL_MECHANISM": "SCRAM-SHA-512",
        "INVOICING_KAFKA__SASL_USERNAME": KAFKA_USER,
        "INVOICING_KAFKA__SASL_PASSWORD": KAFKA_PASSWORD,
        "INVOICING_KAFKA__SSL_CA_FILE": str(files.ca),
        "INVOICING_POSTGRES__SSLMODE": "verify-full",
        "INVOICING_POSTGRES__SSLROOTCERT": str(files.ca),
        "INVOICING_REDIS__URL": f"rediss://{host}:{redis_url.port or 6379}{redis_url.path or '/0'}",
        "INVOICING_REDIS__SSL_CA_FILE": str(files.ca),
        "INVOICING_REDIS__USERNAME": REDIS_USER,
        "INVOICING_REDIS__PASSWORD": REDIS_PASSWORD,
        "INVOICING_SMTP__SECURITY": "starttls",
        "INVOICING_SMTP__CA_FILE": str(files.ca),
        "INVOICING_SMTP__USERNAME": SMTP_USER,
        "INVOICING_SMTP__PASSWORD": SMTP_PASSWORD,
    }


def write_environment(files: TlsFiles, env: dict[str, str]) -> Path:
    """``env`` as ``export NAME=value`` lines into ``files.env`` (mode 0600): ``source``
    it in a shell after ``stack up --profile tls``."""
    files.env.touch(mode=0o600)
    files.env.chmod(0o600)
    files.env.write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()))
    return files.env


def read_environment(path: Path) -> dict[str, str]:
    """The variables of an environment file written by :func:`write_environment`."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = shlex.split(value)[0] if value else ""
    return env


def kafka_tls(settings: Settings) -> bool:
    """Whether the broker serves a SASL_SSL listener only (clients ask for SASL_SSL)."""
    return settings.kafka.security_protocol == "SASL_SSL"


def postgres_tls(settings: Settings) -> bool:
    """Whether PostgreSQL runs with ``ssl=on`` and ``hostssl`` rules only."""
    return settings.postgres.sslmode in ("require", "verify-ca", "verify-full")


def redis_tls(settings: Settings) -> bool:
    """Whether Redis serves ``tls-port`` only, with the ACL user."""
    return settings.redis.url.get_secret_value().startswith("rediss://")


def smtp_tls(settings: Settings) -> bool:
    """Whether the SMTP sink requires STARTTLS and AUTH."""
    return settings.smtp.security == "starttls"


def smtp_sink_tls(settings: Settings, files: TlsFiles) -> tuple[list[str], dict[str, str]]:
    """The SMTP sink's (:mod:`streams.devtools.stack.smtp_sink`) command-line arguments
    and environment for clients of ``settings``: under the profile (:func:`smtp_tls`)
    STARTTLS with the server certificate of ``files`` and AUTH as ``settings.smtp``'s user,
    its password in ``SMTP_SINK_PASSWORD`` (a secret: pass it to the process, never log
    it); ``([], {})`` otherwise. The stack's sink and a sandbox's both start from these."""
    if not smtp_tls(settings):
        return [], {}
    args = ["--tls-cert", str(files.cert), "--tls-key", str(files.key)]
    args += ["--auth-user", settings.smtp.username or ""]
    password = settings.smtp.password.get_secret_value() if settings.smtp.password else ""
    return args, {"SMTP_SINK_PASSWORD": password}


def jaas(user: str, password: str) -> str:
    """Kafka's SCRAM JAAS line for ``user``."""
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{password}";'
    )


def kafka_client_properties(files: TlsFiles, prefix: str = "") -> list[str]:
    """A Java Kafka client's SASL_SSL properties (Connect's worker, and under the
    ``producer.``/``consumer.``/``admin.`` prefixes its clients)."""
    return [
        f"{prefix}security.protocol=SASL_SSL",
        f"{prefix}sasl.mechanism=SCRAM-SHA-512",
        f"{prefix}sasl.jaas.config={jaas(KAFKA_USER, KAFKA_PASSWORD)}",
        f"{prefix}ssl.truststore.type=PEM",
        f"{prefix}ssl.truststore.location={files.ca}",
    ]


def tls_settings(settings: Settings, *, fresh: bool) -> tuple[Settings, Path]:
    """``settings`` under the TLS profile, and the environment file its clients source.

    New certificates are made when ``fresh`` (the stack is not running: a new run) or
    none exist; the environment file is rewritten either way. The returned settings are
    ``settings`` with :func:`client_environment` applied over the process environment.

    Raises:
        pydantic.ValidationError: the combined environment is not valid settings.
    """
    files = tls_files(settings.stack.local_dir / "conf")
    if fresh or not files.ca.exists():
        make_certificates(files, os_user=settings.stack.postgres_os_user)
    env = client_environment(settings, files)
    path = write_environment(files, env)
    os.environ.update(env)
    return Settings(), path
