"""The one settings object of the project.

Loaded once at an entry point (`Settings()`), then passed down; nothing else in
the package reads the environment. Every field can be set from the environment
with the prefix ``INVOICING_`` and ``__`` between section and field, e.g.
``INVOICING_POSTGRES__PORT=5432`` or ``INVOICING_KAFKA__BOOTSTRAP_SERVERS=host:9092``.

The defaults point at the local stack that ``invoicing stack up`` starts on
127.0.0.1 (non-default ports, so that it never collides with a system service).
``docker-compose.yml`` publishes the same ports; a unit test keeps the two in step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from streams.settings.processes import (
    FakeServicesSettings,
    FaultSettings,
    IngestSettings,
    PortalSettings,
    StackSettings,
    UsageViewSettings,
    WorkerSettings,
)

#: How the project runs: "local" (the local stack and tests: one broker, replication 1,
#: fault injection allowed) or "production" (replication 3 and min.insync.replicas 2 by
#: default and at least, topics checked at start, no fault injection).
Profile = Literal["local", "production"]

#: Replication factor and min.insync.replicas of each profile: the default, and in
#: production also the floor.
PROFILE_REPLICATION: dict[str, tuple[int, int]] = {"local": (1, 1), "production": (3, 2)}


class TopicReplication(BaseModel):
    """The replication a topic is created with and checked against."""

    model_config = ConfigDict(extra="forbid")

    replication_factor: int = Field(ge=1, description="Replicas of each partition.")
    min_insync_replicas: int = Field(
        ge=1, description="`min.insync.replicas`: with acks=all, the replicas a write must reach."
    )

    @model_validator(mode="after")
    def _fits(self) -> TopicReplication:
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas {self.min_insync_replicas} exceeds replication_factor "
                f"{self.replication_factor}: no write could succeed"
            )
        return self


class KafkaSettings(BaseModel):
    """Kafka client settings shared by producers, consumers and the admin client."""

    #: The profile of the enclosing :class:`Settings` (set by its validator; "local" for a
    #: KafkaSettings made alone).
    _profile: Profile = PrivateAttr("local")

    bootstrap_servers: str = Field(
        "127.0.0.1:19092",
        description="Comma-separated host:port list of the brokers every Kafka client connects to first.",
    )
    controller_port: int = Field(
        19093, description="Port of the KRaft controller listener of the local single-node broker."
    )
    group_protocol: Literal["classic", "consumer"] = Field(
        "classic",
        description='Consumer group protocol: "classic" (generation = group generation id) or "consumer" (KIP-848; librdkafka reports the member epoch in its place).',
    )
    session_timeout_ms: int = Field(
        10_000,
        description="Classic protocol only: a member silent for this long is removed (milliseconds).",
    )
    heartbeat_interval_ms: int = Field(
        2_000, description="Classic protocol only: heartbeat period (milliseconds)."
    )
    max_poll_interval_ms: int = Field(
        60_000,
        description="A member that does not poll for this long leaves the group (milliseconds).",
    )
    topic_prefix: str = Field(
        "",
        description='Topic-name prefix, so that tests can run on their own topics ("" in production).',
    )
    replication_factor: int | None = Field(
        None,
        ge=1,
        description="Replication factor of every topic `topics create` makes and of the usage "
        "view's changelog topics, unless `topic_replication` names the topic. None: the "
        "profile's (local 1, production 3).",
    )
    min_insync_replicas: int | None = Field(
        None,
        ge=1,
        description="`min.insync.replicas` of those topics (producers use acks=all). None: "
        "the profile's (local 1, production 2).",
    )
    topic_replication: dict[str, TopicReplication] = Field(
        {},
        description="Per topic, by registry name without `topic_prefix`, as JSON: "
        '{"billing.invoices.v1": {"replication_factor": 5, "min_insync_replicas": 3}}.',
    )

    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_SSL"] = Field(
        "PLAINTEXT",
        description='How every Kafka client (confluent-kafka, the usage view\'s aiokafka, the admin) talks to the brokers: "PLAINTEXT" (the local stack), "SSL" (TLS, with `ssl_cert_file`/`ssl_key_file` for mTLS) or "SASL_SSL" (TLS and a SASL login).',
    )
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism under SASL_SSL."
    )
    sasl_username: str | None = Field(None, description="SASL user name (SASL_SSL: required).")
    sasl_password: SecretStr | None = Field(
        None, description="SASL password (SASL_SSL: required); secret."
    )
    ssl_ca_file: Path | None = Field(
        None,
        description="PEM file of the CA(s) the brokers' certificates are checked against (SSL, SASL_SSL). None: the system's trust store.",
    )
    ssl_cert_file: Path | None = Field(None, description="PEM client certificate (mTLS).")
    ssl_key_file: Path | None = Field(
        None, description="PEM private key of `ssl_cert_file` (unencrypted; mode 0600)."
    )

    @model_validator(mode="after")
    def _security_complete(self) -> KafkaSettings:
        if self.security_protocol == "SASL_SSL" and not (self.sasl_username and self.sasl_password):
            raise ValueError("kafka SASL_SSL needs sasl_username and sasl_password")
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise ValueError("kafka.ssl_cert_file and kafka.ssl_key_file go together (mTLS)")
        return self

    @property
    def profile(self) -> Profile:
        """The profile these settings were loaded under (:attr:`Settings.profile`)."""
        return self._profile

    def replication(self, topic: str) -> TopicReplication:
        """The replication of ``topic`` (a registry name, without the prefix): its entry
        of :attr:`topic_replication`, else :attr:`replication_factor` /
        :attr:`min_insync_replicas`, else the profile's (:data:`PROFILE_REPLICATION`)."""
        if topic in self.topic_replication:
            return self.topic_replication[topic]
        rf, isr = PROFILE_REPLICATION[self._profile]
        return TopicReplication(
            replication_factor=self.replication_factor or rf,
            min_insync_replicas=self.min_insync_replicas or isr,
        )


class ConnectSettings(BaseModel):
    """Kafka Connect (distributed mode) REST endpoint and the outbox connector's name."""

    url: str = Field(
        "http://127.0.0.1:18083",
        description="Base URL of the Kafka Connect REST API (distributed mode).",
    )
    outbox_connector: str = Field(
        "invoicing-outbox",
        description="Name of the Debezium connector that streams the outbox table to Kafka.",
    )
    group_id: str = Field(
        "invoicing-connect",
        description="group.id of the Connect worker cluster (the local stack's worker config).",
    )
    database_host: str | None = Field(
        None,
        description="PostgreSQL host as Connect reaches it, when that differs from `postgres.host` (a Connect container on a compose network: `postgres`). None: postgres.host.",
    )
    database_port: int | None = Field(
        None,
        description="PostgreSQL port as Connect reaches it, when that differs from `postgres.port` (5432 on a compose network). None: postgres.port.",
    )
    secrets_dir: str | None = Field(
        None,
        description="The folder of the properties files Connect's `FileConfigProvider` reads Debezium's password from, as Connect sees it (`config.providers.file` in the worker config, `allowed.paths` restricted to it). None: the local stack's `.local/conf/connect-secrets`, which `stack up` writes (mode 0600).",
    )


#: PostgreSQL role names the settings accept: lower-case letters, digits and ``_``, at
#: most 63 characters (PostgreSQL's limit), so that a name is also a safe file name
#: (Connect's secrets file, :mod:`streams.adapters.connect`) and never needs quoting.
ROLE_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"

#: The login roles of :class:`PostgresSettings`, one per process kind (``docs/roles.md``).
RoleName = Literal[
    "owner",
    "worker",
    "email",
    "close",
    "replay",
    "operator",
    "admin",
    "portal",
    "pricing",
    "replication",
    "provisioner",
]


class DatabaseRole(BaseModel):
    """One PostgreSQL login role: its user name and password (a :class:`SecretStr`: never
    shown by ``repr``, logs or errors; read it with ``get_secret_value()`` where a
    connection is made)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    user: str = Field(
        pattern=ROLE_NAME_PATTERN,
        description="user name (lower-case letters, digits, `_`; at most 63 characters).",
    )
    password: SecretStr = Field(description="password.")


#: The local stack's login of each role: user name, and the password (equal to it).
DEFAULT_LOGINS: dict[str, str] = {
    "owner": "invoicing",
    "worker": "invoicing_worker_login",
    "email": "invoicing_email_login",
    "close": "invoicing_close_login",
    "replay": "invoicing_replay_login",
    "operator": "invoicing_operator_login",
    "admin": "invoicing_admin_login",
    "portal": "invoicing_portal_login",
    "pricing": "invoicing_pricing_login",
    "replication": "debezium",
    "provisioner": "invoicing_provisioner",
}


def _role(name: str) -> DatabaseRole:
    """The local stack's default login of role ``name`` (its password is its user name)."""
    user = DEFAULT_LOGINS[name]
    return DatabaseRole(user=user, password=SecretStr(user))


class PostgresSettings(BaseModel):
    """PostgreSQL: where it is, and one login role per process kind.

    Each login is a member of exactly one privilege role (``NOLOGIN``, fixed names,
    granted per table and column by migration 0006 from :mod:`streams.adapters.postgres.grants`);
    ``docs/roles.md`` is the role-by-table matrix. Environment names:
    ``INVOICING_POSTGRES__<ROLE>__USER`` and ``INVOICING_POSTGRES__<ROLE>__PASSWORD``,
    e.g. ``INVOICING_POSTGRES__WORKER__PASSWORD``.

    - ``owner`` owns the database, the tables and the functions; migrations run as it
      (``invoicing db migrate``, ``stack up``). No process runs as it.
    - ``worker``: the invoicing worker. ``email``: the email sender.
      ``close``: ``close-period``. ``replay``: ``replay`` (dry run and apply).
    - ``operator``: read-only; ``status``, ``holds list``, ``fences list``, ``reconcile``
      (the report) and the demo's reconciliation.
    - ``admin``: the operator commands that write: ``holds release``, ``fences reset``,
      ``outbox prune``, ``reconcile --republish``.
    - ``pricing``: ``plans publish`` (appends price book entries; the database stamps who
      and when).
    - ``portal``: read-only; the hosted invoice page (``invoicing worker portal``) reads
      issued documents (names included, no email address) and nothing else.
    - ``replication``: Debezium (``REPLICATION``; reads the outbox). Its password reaches
      Kafka Connect through a config provider, never the connector config.
    - ``provisioner``: creates and drops the per-test sandbox databases (``CREATEDB``, a
      member of ``owner``); the local stack and tests only, no process runs as it.

    The defaults are the local stack's (each password equals its user name). Connection
    strings are built with :func:`psycopg.conninfo.make_conninfo` (:meth:`dsn`), so any
    character in a password is quoted, never parsed as another parameter.
    """

    #: Unknown names fail loudly: the single ``user`` / ``password`` /
    #: ``replication_user`` / ``replication_password`` of before are one section per login.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    host: str = Field("127.0.0.1", description="Host name or address of the PostgreSQL server.")
    port: int = Field(15432, description="TCP port of the PostgreSQL server.")
    database: str = Field("invoicing", description="Name of the invoicing database.")
    owner: DatabaseRole = Field(
        _role("owner"),
        description="Owner login (owns the schema; migrations run as it, db migrate and stack up; no process runs as it).",
    )
    worker: DatabaseRole = Field(_role("worker"), description="Login of the invoicing worker.")
    email: DatabaseRole = Field(_role("email"), description="Login of the email sender.")
    close: DatabaseRole = Field(_role("close"), description="Login of close-period.")
    replay: DatabaseRole = Field(
        _role("replay"), description="Login of replay (dry run and apply)."
    )
    operator: DatabaseRole = Field(
        _role("operator"),
        description="Read-only login of status, holds list, fences list, reconcile (report).",
    )
    admin: DatabaseRole = Field(
        _role("admin"),
        description="Login of the operator commands that write: holds release, fences reset, outbox prune, reconcile --republish.",
    )
    portal: DatabaseRole = Field(
        _role("portal"), description="Read-only login of the hosted invoice page (worker portal)."
    )
    pricing: DatabaseRole = Field(
        _role("pricing"),
        description="Login of price-book publishing (the only login that may publish).",
    )
    replication: DatabaseRole = Field(
        _role("replication"),
        description="Debezium's REPLICATION login (reads the outbox); its password reaches Connect through a config provider.",
    )
    provisioner: DatabaseRole = Field(
        _role("provisioner"),
        description="CREATEDB login that makes and drops per-test sandbox databases (local stack and tests only).",
    )
    publication: str = Field(
        "invoicing_outbox",
        description="Name of the publication Debezium streams (created by a migration).",
    )
    slot: str = Field(
        "invoicing_outbox", description="Name of the logical replication slot Debezium uses."
    )
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = Field(
        "prefer",
        description='libpq `sslmode` of every connection (pools, migrations, Debezium): "prefer" (TLS when the server offers it, unchecked), "verify-full" (TLS, certificate checked against `sslrootcert` and the host name: production).',
    )
    sslrootcert: Path | None = Field(
        None,
        description="PEM file of the CA the server certificate is checked against (verify-ca, verify-full). None: libpq's default (`~/.postgresql/root.crt`; `system` accepted by libpq 16+).",
    )
    pool_min_size: int = Field(1, description="Smallest number of connections of a process's pool.")
    pool_max_size: int = Field(8, description="Largest number of connections of a process's pool.")

    @model_validator(mode="before")
    @classmethod
    def _default_users(cls, data: Any) -> Any:
        """A login given in part (``INVOICING_POSTGRES__WORKER__PASSWORD`` alone, the usual
        case) keeps its default user name; the password has no partial default: a role
        given a user but no password fails validation."""
        if isinstance(data, dict):
            for name, user in DEFAULT_LOGINS.items():
                given = data.get(name)
                if isinstance(given, dict) and "user" not in given:
                    data = {**data, name: {"user": user, **given}}
        return data

    def role(self, name: RoleName) -> DatabaseRole:
        """The login of ``name`` (``"worker"``, ``"operator"``, ...)."""
        found: DatabaseRole = getattr(self, name)
        return found

    def conninfo_params(
        self, role: RoleName, *, database: str | None = None, connect_timeout: int | None = None
    ) -> dict[str, str | int]:
        """The libpq parameters of a connection as ``role`` (password included), for
        ``psycopg.connect(**params)`` or :func:`psycopg.conninfo.make_conninfo`."""
        login = self.role(role)
        params: dict[str, str | int] = {
            "host": self.host,
            "port": self.port,
            "dbname": database or self.database,
            "user": login.user,
            "password": login.password.get_secret_value(),
            "application_name": f"invoicing-{role}",
            **self.tls_params(),
        }
        if connect_timeout is not None:
            params["connect_timeout"] = connect_timeout
        return params

    def tls_params(self) -> dict[str, str]:
        """libpq's TLS parameters: ``sslmode``, and ``sslrootcert`` when set."""
        params: dict[str, str] = {"sslmode": self.sslmode}
        if self.sslrootcert is not None:
            params["sslrootcert"] = str(self.sslrootcert)
        return params

    def dsn(
        self, role: RoleName, *, database: str | None = None, connect_timeout: int | None = None
    ) -> str:
        """A libpq connection string for ``role`` (``database`` defaults to :attr:`database`;
        ``connect_timeout`` in seconds, libpq's default when None).

        Built with :func:`psycopg.conninfo.make_conninfo`: every value is quoted and
        escaped as libpq requires, so a password holding spaces, ``=``, quotes,
        backslashes or ``hostaddr=…`` stays the password. The string holds the password:
        pass it to a connect call, never log or show it.
        """
        from psycopg.conninfo import make_conninfo

        params = self.conninfo_params(role, database=database, connect_timeout=connect_timeout)
        return make_conninfo("", **params)


class RedisSettings(BaseModel):
    """Redis (leases for singleton jobs, tax-rate cache).

    ``url`` is a :class:`SecretStr`: a Redis URL may carry a password
    (``redis://:password@host:port/0``). Read it with ``get_secret_value()`` where the
    client is built; show :meth:`display_url`.
    """

    model_config = ConfigDict(hide_input_in_errors=True)

    url: SecretStr = Field(
        SecretStr("redis://127.0.0.1:16379/0"),
        description="Redis URL (redis://[:password@]host:port/db); secret, as it may carry a password.",
    )
    socket_timeout_s: float = Field(
        2.0, description="Socket timeout of every Redis call (seconds)."
    )
    ssl_ca_file: Path | None = Field(
        None,
        description="With a `rediss://` URL (TLS): PEM file of the CA the server certificate is checked against (host name checked too). None: the system's trust store.",
    )
    username: str | None = Field(
        None, description="ACL user name (Redis 6+ `AUTH user password`), unless the URL names one."
    )
    password: SecretStr | None = Field(None, description="ACL password, unless in the URL.")

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.Redis.from_url`` for TLS (``rediss://`` only:
        ``ssl_ca_certs``, certificate and host name required) and the ACL login."""
        kwargs: dict[str, Any] = {}
        if urlsplit(self.url.get_secret_value()).scheme == "rediss":
            kwargs.update(ssl_cert_reqs="required", ssl_check_hostname=True)
            if self.ssl_ca_file is not None:
                kwargs["ssl_ca_certs"] = str(self.ssl_ca_file)
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password.get_secret_value()
        return kwargs

    def display_url(self) -> str:
        """The URL with any user name and password replaced by ``***`` (for messages)."""
        parsed = urlsplit(self.url.get_secret_value())
        if parsed.username is None and parsed.password is None:
            return parsed.geturl()
        host = parsed.hostname or ""
        netloc = f"***@{host}" + (f":{parsed.port}" if parsed.port else "")
        return parsed._replace(netloc=netloc).geturl()


class TaxSettings(BaseModel):
    """Tax service client: timeouts, retries, concurrency, document size."""

    url: str = Field("http://127.0.0.1:18090", description="Base URL of the tax service.")
    connect_timeout_s: float = Field(2.0, description="Connect timeout of a tax request (seconds).")
    read_timeout_s: float = Field(
        30.0, description="Read timeout of one document request (seconds)."
    )
    max_attempts: int = Field(
        5,
        description="Attempts per document, the first included, all with the same idempotency key.",
    )
    backoff_initial_s: float = Field(
        0.2, description="First wait between attempts (seconds); doubles per attempt."
    )
    backoff_max_s: float = Field(5.0, description="Longest wait between attempts (seconds).")
    max_concurrency: int = Field(4, description="Concurrent requests per process.")
    max_lines_per_request: int = Field(
        1000, description="The service's limit on lines per document request."
    )
    cache_ttl_s: int = Field(
        7 * 24 * 3600, description="How long a tax result stays in the Redis cache (seconds)."
    )


class SmtpSettings(BaseModel):
    """SMTP relay the email sender delivers through."""

    host: str = Field("127.0.0.1", description="Host of the SMTP relay.")
    port: int = Field(12525, description="Port of the SMTP relay.")
    from_address: str = Field(
        "billing@invoicing.example", description="From: address of every invoice email."
    )
    timeout_s: float = Field(
        10.0, description="Timeout of one SMTP connection and command (seconds)."
    )
    security: Literal["none", "starttls", "tls"] = Field(
        "none",
        description='"none" (the local sink), "starttls" (plain connect, then STARTTLS: port 587) or "tls" (implicit TLS, `SMTP_SSL`: port 465). The relay\'s certificate and host name are checked.',
    )
    ca_file: Path | None = Field(None, description="PEM CA file of the relay (None: system's).")
    username: str | None = Field(None, description="AUTH LOGIN user name (None: no AUTH).")
    password: SecretStr | None = Field(None, description="AUTH password of `username`; secret.")

    @model_validator(mode="after")
    def _auth_over_tls(self) -> SmtpSettings:
        if self.username is not None and self.security == "none":
            raise ValueError("smtp.username (AUTH) needs smtp.security starttls or tls")
        return self


class Settings(BaseSettings):
    """All settings, nested by section. See the module docstring for the environment names."""

    model_config = SettingsConfigDict(
        env_prefix="INVOICING_",
        env_nested_delimiter="__",
        extra="forbid",
        # A validation error never echoes a value: it may be a password.
        hide_input_in_errors=True,
    )

    profile: Profile = Field(
        "local",
        description='"local" (the local stack and tests) or "production": replication 3 and '
        "min.insync.replicas 2 by default and at least, every long-running process refuses "
        "to start while a topic has less, and no fault injection.",
    )
    kafka: KafkaSettings = Field(KafkaSettings(), description="Kafka clients.")
    connect: ConnectSettings = Field(
        ConnectSettings(), description="Kafka Connect and the outbox connector."
    )
    postgres: PostgresSettings = Field(
        PostgresSettings(), description="PostgreSQL and its login roles."
    )
    redis: RedisSettings = Field(
        RedisSettings(), description="Redis (leases, tax cache, ingest idempotency)."
    )
    tax: TaxSettings = Field(TaxSettings(), description="Tax service client.")
    smtp: SmtpSettings = Field(SmtpSettings(), description="SMTP relay of the email sender.")
    fakes: FakeServicesSettings = Field(
        FakeServicesSettings(), description="The local stack's fake tax service and SMTP sink."
    )
    stack: StackSettings = Field(
        StackSettings(), description="The local stack (invoicing stack up)."
    )
    worker: WorkerSettings = Field(
        WorkerSettings(), description="Invoicing worker and email sender."
    )
    view: UsageViewSettings = Field(
        UsageViewSettings(), description="The usage view and where invoicing usage asks it."
    )
    ingest: IngestSettings = Field(IngestSettings(), description="The HTTP ingest edge.")
    portal: PortalSettings = Field(
        PortalSettings(), description="The hosted invoice page and its links."
    )
    fault: FaultSettings = Field(
        FaultSettings(), description="Fault injection for the chaos tests; never set in production."
    )

    @model_validator(mode="after")
    def _profile_rules(self) -> Settings:
        """Give the Kafka section its profile; under "production", refuse replication below
        the profile's floor and any fault-injection setting.

        Raises:
            ValueError: (as a validation error) a rule of the profile is broken.
        """
        # The section may be a shared default instance: give this Settings its own copy.
        self.kafka = self.kafka.model_copy()
        self.kafka._profile = self.profile
        if self.profile != "production":
            return self
        floor_rf, floor_isr = PROFILE_REPLICATION["production"]
        checked = {"(default)": self.kafka.replication("")}
        checked.update(self.kafka.topic_replication)
        for topic, replication in checked.items():
            if (
                replication.replication_factor < floor_rf
                or replication.min_insync_replicas < floor_isr
            ):
                raise ValueError(
                    f"profile production needs replication_factor >= {floor_rf} and "
                    f"min_insync_replicas >= {floor_isr}; topic {topic} has "
                    f"{replication.replication_factor} and {replication.min_insync_replicas}"
                )
        if self.fault != FaultSettings():
            raise ValueError(
                "fault injection (INVOICING_FAULT__*) is for the chaos tests only: "
                "unavailable under profile production"
            )
        return self
