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

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_home() -> Path:
    """The project root: the folder holding ``pyproject.toml`` above this package.

    Falls back to the current directory for an installed (non-editable) package.
    """
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").exists():
        return here
    return Path.cwd()


class KafkaSettings(BaseModel):
    """Kafka client settings shared by producers, consumers and the admin client."""

    bootstrap_servers: str = "127.0.0.1:19092"
    #: Port of the KRaft controller listener of the local single-node broker.
    controller_port: int = 19093
    #: Consumer group protocol: "classic" (generation = group generation id) or
    #: "consumer" (KIP-848; librdkafka reports the member epoch in its place).
    group_protocol: Literal["classic", "consumer"] = "classic"
    #: Classic protocol only: a member silent for this long is removed (milliseconds).
    session_timeout_ms: int = 10_000
    #: Classic protocol only: heartbeat period (milliseconds).
    heartbeat_interval_ms: int = 2_000
    #: A member that does not poll for this long leaves the group (milliseconds).
    max_poll_interval_ms: int = 60_000
    #: Topic-name prefix, so that tests can run on their own topics ("" in production).
    topic_prefix: str = ""


class ConnectSettings(BaseModel):
    """Kafka Connect (distributed mode) REST endpoint and the outbox connector's name."""

    url: str = "http://127.0.0.1:18083"
    outbox_connector: str = "invoicing-outbox"
    group_id: str = "invoicing-connect"
    #: PostgreSQL as Connect reaches it, when that differs from ``postgres.host`` /
    #: ``postgres.port`` (a Connect container on a compose network: ``postgres``, 5432).
    database_host: str | None = None
    database_port: int | None = None
    #: The folder of the properties files Connect's ``FileConfigProvider`` reads
    #: Debezium's password from, as Connect sees it (``config.providers.file`` in the
    #: worker config, ``allowed.paths`` restricted to it). None: the local stack's
    #: ``.local/conf/connect-secrets``, which ``stack up`` writes (mode 0600).
    secrets_dir: str | None = None


#: PostgreSQL role names the settings accept: lower-case letters, digits and ``_``, at
#: most 63 characters (PostgreSQL's limit), so that a name is also a safe file name
#: (Connect's secrets file, :mod:`streams.adapters.connect`) and never needs quoting.
ROLE_NAME_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"

#: The login roles of :class:`PostgresSettings`, one per process kind (``docs/roles.md``).
RoleName = Literal[
    "owner", "worker", "email", "close", "replay", "operator", "admin", "replication", "provisioner"
]


class DatabaseRole(BaseModel):
    """One PostgreSQL login role: its user name and password (a :class:`SecretStr`: never
    shown by ``repr``, logs or errors; read it with ``get_secret_value()`` where a
    connection is made)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    user: str = Field(pattern=ROLE_NAME_PATTERN)
    password: SecretStr


#: The local stack's login of each role: user name, and the password (equal to it).
DEFAULT_LOGINS: dict[str, str] = {
    "owner": "invoicing",
    "worker": "invoicing_worker_login",
    "email": "invoicing_email_login",
    "close": "invoicing_close_login",
    "replay": "invoicing_replay_login",
    "operator": "invoicing_operator_login",
    "admin": "invoicing_admin_login",
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
    granted per table and column by migration 0006 from :mod:`streams.grants`);
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

    host: str = "127.0.0.1"
    port: int = 15432
    database: str = "invoicing"
    owner: DatabaseRole = _role("owner")
    worker: DatabaseRole = _role("worker")
    email: DatabaseRole = _role("email")
    close: DatabaseRole = _role("close")
    replay: DatabaseRole = _role("replay")
    operator: DatabaseRole = _role("operator")
    admin: DatabaseRole = _role("admin")
    replication: DatabaseRole = _role("replication")
    provisioner: DatabaseRole = _role("provisioner")
    #: Name of the publication Debezium streams (created by a migration).
    publication: str = "invoicing_outbox"
    #: Name of the logical replication slot Debezium uses.
    slot: str = "invoicing_outbox"
    #: Connection pool bounds per process.
    pool_min_size: int = 1
    pool_max_size: int = 8

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
        }
        if connect_timeout is not None:
            params["connect_timeout"] = connect_timeout
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

    url: SecretStr = SecretStr("redis://127.0.0.1:16379/0")
    socket_timeout_s: float = 2.0

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

    url: str = "http://127.0.0.1:18090"
    connect_timeout_s: float = 2.0
    #: Read timeout of one document request (seconds).
    read_timeout_s: float = 30.0
    #: Attempts per document, the first included, all with the same idempotency key.
    max_attempts: int = 5
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    #: Concurrent requests per process.
    max_concurrency: int = 4
    #: The service's limit on lines per document request.
    max_lines_per_request: int = 1000
    #: How long a tax result stays in the Redis cache (seconds).
    cache_ttl_s: int = 7 * 24 * 3600


class SmtpSettings(BaseModel):
    """SMTP relay the email sender delivers through."""

    host: str = "127.0.0.1"
    port: int = 12525
    from_address: str = "billing@invoicing.example"
    timeout_s: float = 10.0


class FakeServicesSettings(BaseModel):
    """The project's own fake tax service and SMTP sink, as run by the local stack."""

    #: Tax latency model: base + per line, plus a spike with some probability.
    tax_base_latency_s: float = 0.02
    tax_per_line_latency_s: float = 0.0
    tax_spike_probability: float = 0.0
    tax_spike_latency_s: float = 0.0
    #: Share of requests answered 503 (0..1).
    tax_error_rate: float = 0.0


class StackSettings(BaseModel):
    """Where the local stack keeps its files (data, logs, jars), all under the repo's ``.local/``."""

    home: Path = Field(default_factory=_default_home)
    #: Unprivileged OS user PostgreSQL runs as when the stack is started by root.
    postgres_os_user: str = "postgres"
    #: Seconds each service gets to become healthy in ``stack up``.
    health_timeout_s: float = 120.0
    #: JVM heap per Java service.
    kafka_heap: str = "-Xms256m -Xmx768m"
    connect_heap: str = "-Xms256m -Xmx768m"

    @property
    def local_dir(self) -> Path:
        return self.home / ".local"


class WorkerSettings(BaseModel):
    """Invoicing and email worker behaviour."""

    invoicing_group: str = "invoicing"
    email_group: str = "email-sender"
    #: Port for the Prometheus metrics endpoint of a worker (0 = none).
    metrics_port: int = 0
    #: Largest number of records handled per poll.
    batch_size: int = 500
    #: Invoice jobs running at once per worker process.
    max_jobs: int = 4


class UsageViewSettings(BaseModel):
    """The usage view (``invoicing worker usage-view``, a faust-streaming app) and the
    address ``invoicing usage`` asks it at."""

    #: faust app id: the view's consumer group and its changelog topics' prefix.
    group: str = "usage-view"
    host: str = "127.0.0.1"
    #: Web port of an instance (``--port`` overrides; each instance needs its own).
    port: int = 18700
    #: Where ``invoicing usage`` sends its requests (any instance answers).
    url: str = "http://127.0.0.1:18700"
    #: Table store: "rocksdb" (rocksdict, on disk: production) or "memory".
    store: Literal["rocksdb", "memory"] = "rocksdb"
    #: Folder of the RocksDB files (default ``.local/data/usage-view``), one per instance port.
    data_dir: Path | None = None
    #: Standby copies of each table partition kept by other instances (faster failover,
    #: more memory per instance).
    standby_replicas: int = Field(default=0, ge=0)
    #: Price book file until published versions are read from their topic (none: the
    #: empty book, enough for pass-through customers).
    price_book: Path | None = None
    #: A closed period stays queryable this long after its close marker (days).
    retain_closed_days: int = Field(default=35, ge=0)
    #: A period never closed is dropped this long after its month ended (days).
    retain_open_days: int = Field(default=400, ge=0)
    #: How often the retention runs (seconds).
    cleanup_interval_s: float = Field(default=3600.0, gt=0)


class IngestSettings(BaseModel):
    """The HTTP ingest edge (``invoicing worker ingest``): CloudEvents in, Kafka records out."""

    host: str = "127.0.0.1"
    port: int = 18800
    #: File of the hashed API keys (default ``.local/data/api-keys.json``), written by
    #: ``invoicing api-keys create|revoke``.
    api_keys_file: Path | None = None
    #: Largest request body (bytes); larger requests are answered 413.
    max_body_bytes: int = Field(default=1_048_576, gt=0)
    #: Most events in one batch request.
    max_batch_events: int = Field(default=1000, gt=0)
    #: How long the edge remembers an event id for idempotency (seconds, Redis).
    idempotency_ttl_s: int = Field(default=7 * 24 * 3600, gt=0)
    #: Longest wait for the broker's delivery reports of one request (seconds).
    delivery_timeout_s: float = Field(default=30.0, gt=0)


class FaultSettings(BaseModel):
    """Fault-injection hooks for the chaos tests (tests/chaos). All off by default;
    never set them in production.

    ``INVOICING_FAULT__KILL_AFTER_DB_COMMIT=1``: the invoicing worker SIGKILLs itself
    right after an invoice job's database commit and before the marker's offset
    commit — the crash window of :mod:`streams.billing.commit`, made deterministic.

    ``INVOICING_FAULT__KILL_REPLAY_AFTER_WRITES=N`` (N > 0): ``invoicing replay
    --apply`` SIGKILLs itself once N customers' corrections are committed — a real
    crash: its Redis lease is not released and its run stays ``running``.
    """

    kill_after_db_commit: bool = False
    kill_replay_after_writes: int = Field(default=0, ge=0)


class Settings(BaseSettings):
    """All settings, nested by section. See the module docstring for the environment names."""

    model_config = SettingsConfigDict(
        env_prefix="INVOICING_",
        env_nested_delimiter="__",
        extra="forbid",
        # A validation error never echoes a value: it may be a password.
        hide_input_in_errors=True,
    )

    kafka: KafkaSettings = KafkaSettings()
    connect: ConnectSettings = ConnectSettings()
    postgres: PostgresSettings = PostgresSettings()
    redis: RedisSettings = RedisSettings()
    tax: TaxSettings = TaxSettings()
    smtp: SmtpSettings = SmtpSettings()
    fakes: FakeServicesSettings = FakeServicesSettings()
    stack: StackSettings = StackSettings()
    worker: WorkerSettings = WorkerSettings()
    view: UsageViewSettings = UsageViewSettings()
    ingest: IngestSettings = IngestSettings()
    fault: FaultSettings = FaultSettings()
