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
from typing import Literal

from pydantic import BaseModel, Field, SecretStr
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


class PostgresSettings(BaseModel):
    """PostgreSQL connection and role settings.

    ``user`` owns the schema and is what the workers use; ``replication_user`` is
    the role Debezium connects with (REPLICATION, SELECT on the outbox).
    """

    host: str = "127.0.0.1"
    port: int = 15432
    database: str = "invoicing"
    user: str = "invoicing"
    password: SecretStr = SecretStr("invoicing")
    replication_user: str = "debezium"
    replication_password: SecretStr = SecretStr("debezium")
    #: Name of the publication Debezium streams (created by a migration).
    publication: str = "invoicing_outbox"
    #: Name of the logical replication slot Debezium uses.
    slot: str = "invoicing_outbox"
    #: Connection pool bounds per process.
    pool_min_size: int = 1
    pool_max_size: int = 8

    def dsn(self, *, database: str | None = None) -> str:
        """A libpq connection string for the application role."""
        return (
            f"host={self.host} port={self.port} dbname={database or self.database} "
            f"user={self.user} password={self.password.get_secret_value()} "
            "application_name=invoicing"
        )


class RedisSettings(BaseModel):
    """Redis (leases for singleton jobs, tax-rate cache)."""

    url: str = "redis://127.0.0.1:16379/0"
    socket_timeout_s: float = 2.0


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
    commit — the crash window of :mod:`streams.invoicing.commit`, made deterministic.

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
