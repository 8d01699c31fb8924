"""The sections of :class:`streams.settings.Settings` that configure the project's own
processes and the local stack: the fake services, the stack, the workers, the usage
view, the ingest edge, the portal and the chaos tests' fault injection. Imported and
re-exported by :mod:`streams.settings`; the environment names are the same
(``INVOICING_<SECTION>__<FIELD>``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


def _default_home() -> Path:
    """The project root: the folder holding ``pyproject.toml`` above this package.

    Falls back to the current directory for an installed (non-editable) package.
    """
    here = Path(__file__).resolve().parents[2]
    if (here / "pyproject.toml").exists():
        return here
    return Path.cwd()


class FakeServicesSettings(BaseModel):
    """The project's own fake tax service and SMTP sink, as run by the local stack."""

    tax_base_latency_s: float = Field(
        0.02,
        description="Fake tax service: base latency of every request (seconds); the latency model is base + per line, plus a spike with some probability.",
    )
    tax_per_line_latency_s: float = Field(
        0.0, description="Fake tax service: added latency per document line (seconds)."
    )
    tax_spike_probability: float = Field(
        0.0, description="Fake tax service: probability of a latency spike per request (0..1)."
    )
    tax_spike_latency_s: float = Field(
        0.0, description="Fake tax service: latency of a spike (seconds)."
    )
    tax_error_rate: float = Field(0.0, description="Share of requests answered 503 (0..1).")


class StackSettings(BaseModel):
    """Where the local stack keeps its files (data, logs, jars), all under the repo's ``.local/``."""

    home: Path = Field(
        default_factory=_default_home,
        description="Project root; the local stack's files live in its `.local/`.",
    )
    state_dir: Path | None = Field(
        None,
        description="Folder of the stack's configs, data, logs and sockets (default "
        "`<home>/.local`); another one runs a second stack from the same checkout "
        "(the jars stay shared).",
    )
    postgres_os_user: str = Field(
        "postgres",
        description="Unprivileged OS user PostgreSQL runs as when the stack is started by root.",
    )
    health_timeout_s: float = Field(
        120.0, description="Seconds each service gets to become healthy in `stack up`."
    )
    redis_maxmemory: str = Field(
        default="256mb",
        pattern=r"^[0-9]+(kb|mb|gb)?$",
        description="Redis's memory limit (`maxmemory`). At the limit Redis refuses writes "
        "(`maxmemory-policy noeviction`) rather than evict a key: the leases and their "
        'fencing counter must never be evicted (docs/security.md "Redis").',
    )
    allow_default_passwords: bool = Field(
        False,
        description="Accept the shipped default passwords although a service address is not "
        "loopback. Only for a private network of throwaway containers (docker-compose.yml "
        "sets it); never in a deployment.",
    )
    kafka_heap: str = Field(
        "-Xms256m -Xmx768m", description="JVM heap options of the local Kafka broker."
    )
    connect_heap: str = Field(
        "-Xms256m -Xmx768m", description="JVM heap options of the local Kafka Connect worker."
    )

    @property
    def local_dir(self) -> Path:
        return self.state_dir if self.state_dir is not None else self.home / ".local"


class WorkerSettings(BaseModel):
    """Invoicing and email worker behaviour."""

    invoicing_group: str = Field("invoicing", description="Consumer group of the invoicing worker.")
    email_group: str = Field("email-sender", description="Consumer group of the email sender.")
    metrics_port: int = Field(
        0, description="Port for the Prometheus metrics endpoint of a worker (0 = none)."
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="Address the metrics endpoint of the invoicing worker and the email "
        "sender listens on (0.0.0.0 in a container, so that Prometheus and probes reach it).",
    )
    batch_size: int = Field(
        5000,
        description="Largest number of records the invoicing worker handles per poll: one transaction and one offset commit per poll batch (docs/decisions/0010-batch-first-ingest.md).",
    )
    max_jobs: int = Field(
        8,
        ge=1,
        description='Invoice jobs running at once per worker process. Twice `tax.max_concurrency` by default, so that jobs reading or writing the database overlap the tax calls of others and the tax slots stay busy (docs/architecture.md "Long jobs").',
    )
    markers_in_flight: int = Field(
        4,
        ge=1,
        description='Close markers of one partition whose invoice jobs run at once, when they follow one another on the partition (distinct customers, no other record between them); the partition moves on once all of them have reported. 1 runs one marker at a time (docs/architecture.md "Long jobs").',
    )
    email_render_processes: int = Field(
        2,
        ge=0,
        description="Processes in which the email sender renders the PDFs of the records it polled next while it sends the one in hand (a PDF is most of an email's cost, and WeasyPrint holds the GIL); 0 renders each PDF in the sender's own process, one after another (docs/email.md, \"Rendering ahead\").",
    )
    email_render_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Longest the email sender waits for a PDF rendered ahead (seconds, "
        "> 0; with `email_render_processes` > 0). Past it the render processes are taken "
        "as hung: an ERROR is logged and `invoicing_email_render_timeouts_total` counted, "
        "the processes are killed and started again, and the sender renders that PDF "
        "itself; at the sender's stop, a render still running that long after is killed. "
        "Must cover a fresh process's start (about a second: WeasyPrint loading) and a "
        'render (docs/email.md, "Rendering ahead").',
    )
    email_render_ahead: int = Field(
        8,
        ge=1,
        description="Most records the email sender takes in one poll and renders ahead (with `email_render_processes` > 0); a record is still claimed, sent and its offset committed one at a time, in order.",
    )
    gc_threshold: int = Field(
        20_000,
        ge=0,
        description="First-generation threshold of Python's cyclic garbage collector (allocations between collections; Python's default is 700) in the invoicing worker, the usage view and the FOCUS import and replay commands, set once started with the start-up objects frozen out of every collection; 0 keeps Python's defaults. Their batches allocate tens of thousands of short-lived objects, none of them in cycles (docs/decisions/0010-batch-first-ingest.md \"The garbage collector\").",
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        gt=0,
        description="On SIGTERM, how long the invoicing worker lets running invoice jobs "
        "finish before cancelling them (seconds; queued jobs are cancelled at once and "
        "their markers redelivered to the next owner).",
    )


class UsageViewSettings(BaseModel):
    """The usage view (``invoicing worker usage-view``, a faust-streaming app) and the
    address ``invoicing usage`` asks it at."""

    group: str = Field(
        "usage-view",
        description="faust app id: the view's consumer group and its changelog topics' prefix.",
    )
    host: str = Field("127.0.0.1", description="Address the usage view's web server listens on.")
    advertised_host: str | None = Field(
        None,
        description="Address the other instances reach this one at, when that is not `host` "
        "(a pod listening on 0.0.0.0 advertises its pod IP): requests for a customer are "
        "forwarded to the owner's `http://advertised_host:port`. None: `host`.",
    )
    port: int = Field(
        18700,
        description="Web port of an instance (`--port` overrides; each instance needs its own).",
    )
    url: str = Field(
        "http://127.0.0.1:18700",
        description="Where `invoicing usage` sends its requests (any instance answers).",
    )
    store: Literal["rocksdb", "memory"] = Field(
        "rocksdb",
        description='Table store: "rocksdb" (rocksdict, on disk: production) or "memory".',
    )
    data_dir: Path | None = Field(
        None,
        description="Folder of the RocksDB files (default `.local/data/usage-view`), one per instance port.",
    )
    standby_replicas: int = Field(
        default=0,
        ge=0,
        description="Standby copies of each table partition kept by other instances (faster failover, more memory per instance).",
    )
    price_book: Path | None = Field(
        None,
        description="Price book file until published versions are read from their topic (none: the empty book, enough for pass-through customers).",
    )
    retain_closed_days: int = Field(
        default=35,
        ge=0,
        description="A closed period stays queryable this long after its close marker (days).",
    )
    retain_open_days: int = Field(
        default=400,
        ge=0,
        description="A period never closed is dropped this long after its month ended (days).",
    )
    cleanup_interval_s: float = Field(
        default=3600.0, gt=0, description="How often the retention runs (seconds)."
    )
    forward_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="Longest wait for a partition's owner to answer a forwarded request "
        '(seconds; then 504), docs/usage-api.md "Forwarding".',
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="The API key (`usage:read` scope) `invoicing usage` sends; the view checks "
        'keys against `ingest.api_keys_file` (docs/usage-api.md "Authentication"). '
        "None: no Authorization header.",
    )
    changelog_linger_s: float = Field(
        default=0.010,
        ge=0,
        description="How long the changelog producer waits to fill a batch (seconds); "
        "batches are lz4-compressed.",
    )
    changelog_batch_bytes: int = Field(
        default=524_288,
        gt=0,
        description="Largest changelog producer batch (bytes; keep it under the broker's "
        "1 MB message limit).",
    )
    batch_max_records: int = Field(
        default=2_000,
        gt=0,
        description="Most source records the view applies as one batch, writing each "
        'changed table key once (docs/usage-api.md "Throughput").',
    )
    batch_wait_s: float = Field(
        default=0.100,
        gt=0,
        description="Longest wait to fill a batch (seconds): what an idle view adds to "
        "an answer's freshness.",
    )
    rocksdb_block_cache_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=64 * 1024,
        description="Block cache of each RocksDB database of the view (bytes; one database per "
        "table partition an instance holds, standbys included; faust's default is 2 GiB each). "
        'docs/usage-api.md "Memory bounds".',
    )
    rocksdb_write_buffer_bytes: int = Field(
        default=2 * 1024 * 1024,
        ge=64 * 1024,
        description="Size of one memtable (write buffer) of each RocksDB database of the view "
        "(bytes; faust's default is 64 MiB).",
    )
    rocksdb_max_write_buffers: int = Field(
        default=2,
        ge=2,
        description="Memtables each RocksDB database of the view may hold at once, the one "
        "being filled and those being flushed (faust's default is 3).",
    )


class IngestSettings(BaseModel):
    """The HTTP ingest edge (``invoicing worker ingest``): CloudEvents in, Kafka records out."""

    host: str = Field("127.0.0.1", description="Address the ingest edge listens on.")
    port: int = Field(18800, description="Port the ingest edge listens on.")
    api_keys_file: Path | None = Field(
        None,
        description="File of the hashed API keys (default `.local/data/api-keys.json`), written by `invoicing keys create|revoke`.",
    )
    max_body_bytes: int = Field(
        default=1_048_576,
        gt=0,
        description="Largest request body (bytes); larger requests are answered 413.",
    )
    max_batch_events: int = Field(
        default=1000, gt=0, description="Most events in one batch request."
    )
    idempotency_ttl_s: int = Field(
        default=7 * 24 * 3600,
        gt=0,
        description="How long the edge remembers an event id for idempotency (seconds, Redis).",
    )
    delivery_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest wait for the broker's delivery reports of one request "
        "(seconds); past it the events' outcome is answered `unknown` (504), "
        'docs/security.md "Back-pressure".',
    )
    max_in_flight: int = Field(
        default=256,
        gt=0,
        description="Requests in flight per edge process, all keys together; beyond: 503 at once.",
    )
    max_in_flight_per_key: int = Field(
        default=32,
        gt=0,
        description="Requests in flight per edge process and key; beyond: 429 at once.",
    )
    key_rate_limit: str = Field(
        "200/second",
        description="Rate limit of a key without one of its own, per edge process, in the "
        "`limits` library's notation (`200/second`, `10000/minute`); beyond: 429 with "
        "Retry-After.",
    )

    @field_validator("key_rate_limit")
    @classmethod
    def _rate_limit(cls, value: str) -> str:
        from limits import parse

        parse(value)  # a ValueError names what it could not read
        return value


class PortalSettings(BaseModel):
    """The hosted invoice page (``invoicing worker portal``) and the links to it that
    every email carries (docs/email.md, docs/decisions/0051-hosted-page-tokens.md)."""

    host: str = Field("127.0.0.1", description="Address the hosted invoice page listens on.")
    port: int = Field(
        18900, description="Port the hosted invoice page listens on (--port overrides)."
    )
    public_url: str = Field(
        "http://127.0.0.1:18900",
        description="The page's address as customers reach it; links are `{public_url}/invoices/{id}?t=…`.",
    )
    token_secret: SecretStr | None = Field(
        None,
        description="The signing secret of the links (at least 32 bytes). Unset: read from `token_secret_file`, which is created (32 random bytes, mode 0600) when missing.",
    )
    token_secret_file: Path | None = Field(
        None,
        description="File of the secret when `token_secret` is unset (default `.local/data/portal-token.key`).",
    )
    previous_secrets: tuple[SecretStr, ...] = Field(
        (),
        description="Older secrets that still verify links already sent (rotation), newest first.",
    )
    token_ttl_days: int = Field(
        default=90,
        gt=0,
        description="A link opens its document for this long after the document was issued (days).",
    )
    pool_max_size: int = Field(
        default=4,
        gt=0,
        description="Connections of the portal's pool (read-only role `postgres.portal`).",
    )


class FaultSettings(BaseModel):
    """Fault-injection hooks for the chaos tests (tests/chaos). All off by default;
    never set them in production.

    ``INVOICING_FAULT__KILL_AFTER_DB_COMMIT=1``: the invoicing worker SIGKILLs itself
    right after an invoice job's database commit and before the marker's offset
    commit — the crash window of :mod:`streams.core.billing.commit`, made deterministic.

    ``INVOICING_FAULT__KILL_REPLAY_AFTER_WRITES=N`` (N > 0): ``invoicing replay
    --apply`` SIGKILLs itself once N customers' corrections are committed — a real
    crash: its Redis lease is not released and its run stays ``running``.
    """

    kill_after_db_commit: bool = Field(
        False,
        description="Chaos tests only: the invoicing worker SIGKILLs itself after an invoice "
        "job's database commit, before the offset commit.",
    )
    kill_replay_after_writes: int = Field(
        default=0,
        ge=0,
        description="Chaos tests only: replay --apply SIGKILLs itself once this many "
        "customers' corrections are committed (0: off).",
    )
