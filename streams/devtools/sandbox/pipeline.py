"""An isolated pipeline on the shared real stack (the drill's safe mode, the tests).

Each sandbox gets its own PostgreSQL database (migrated, with Debezium's
publication), its own topics (a prefix), consumer groups, outbox connector and
replication slot, SMTP sink (own port and Maildir; under the TLS profile it requires
STARTTLS and AUTH, as the stack's does) and fake tax service (own port and request
records). Kafka, Connect, PostgreSQL and Redis are the real shared services. So tests can count invoices, events and emails exactly, and
two sandboxes never see each other's customers.

Roles: the database is created by the **provisioner** login (``CREATEDB``) and owned by
the **owner**; its migrations run as the owner and end with the grants of
:mod:`streams.adapters.postgres.grants` (grants are per database, roles per cluster), so every process of
a sandbox connects as its own role with exactly the privileges it has in production.
:meth:`Pipeline.connect` defaults to the owner: tests inspect (and the chaos harness
plants) rows that no runtime role may touch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from streams.adapters.connect import (
    local_secrets_dir,
    render_outbox_config,
    wait_running,
    write_connect_secrets,
)
from streams.adapters.kafka import ensure_topics, topic_specs
from streams.adapters.postgres import migrate
from streams.adapters.postgres.provision import provision_publication
from streams.devtools.sandbox.processes import WorkerGroup
from streams.devtools.sandbox.smtp import free_port, running_smtp_sink
from streams.devtools.stack.fake_tax import FakeTaxProcess, running_fake_tax
from streams.devtools.stack.tls import smtp_sink_tls, tls_files
from streams.settings import KafkaSettings, PostgresSettings, RoleName, Settings
from streams.topics import ACCOUNT_EVENTS, OUTBOX_HEARTBEAT

#: How long a sandbox's tax results stay in the stack's shared Redis (seconds). A sandbox
#: lives minutes; with the product's 7 days, a day of benchmark closes filled the local
#: stack's 256 MB (about 80 bytes per invoice line: docs/production.md "Redis").
SANDBOX_TAX_CACHE_TTL_S = 3600

#: librdkafka's log line for a refused or dropped connection (``%3|<time>|FAIL|…``).
_CONNECTION_NOISE = re.compile(
    r"^%\d\|[\d.]+\|FAIL\|.*(Connection refused|Disconnected|Connect to)"
)


@dataclass
class Pipeline:
    """One sandbox's pipeline: its settings, the same as environment for worker processes
    (``env``), its files (``workdir``, the SMTP sink's ``maildir``), its fake tax
    service and its worker processes (stopped when the sandbox is torn down)."""

    unique: str
    settings: Settings
    #: Environment of the sandbox's processes; holds the runtime logins' passwords
    #: (kept out of ``repr``).
    env: dict[str, str] = field(repr=False)
    workdir: Path
    maildir: Path
    tax: FakeTaxProcess
    workers: WorkerGroup = field(init=False)

    def __post_init__(self) -> None:
        self.workers = WorkerGroup(self.workdir / "logs", self.env)

    @property
    def topic(self) -> str:
        """The sandbox's ``billing.account-events.v1`` (under its topic prefix)."""
        return ACCOUNT_EVENTS.with_prefix(self.settings.kafka.topic_prefix).name

    def worker_logs(self) -> str:
        """The last 6,000 characters of every worker's log, with its name and exit code,
        the email senders first. librdkafka's connection lines (one a second per client
        while a broker is down) are counted, not printed, so that a failure after an
        outage shows what the workers did rather than the outage's noise."""
        parts = []
        for worker in sorted(self.workers.processes, key=lambda w: not w.name.startswith("email")):
            text = worker.log.read_text(errors="replace") if worker.log.exists() else ""
            kept = [line for line in text.splitlines() if not _CONNECTION_NOISE.match(line)]
            noise = len(text.splitlines()) - len(kept)
            parts.append(
                f"----- {worker.name} (exit {worker.process.poll()}; {noise} librdkafka "
                f"connection lines left out) -----\n" + "\n".join(kept)[-6000:]
            )
        return "\n".join(parts)

    def connect(self, role: RoleName = "owner") -> psycopg.Connection[Any]:
        """A new autocommit connection to the sandbox's database as ``role`` (the owner by
        default); the caller closes it."""
        return psycopg.connect(self.settings.postgres.dsn(role), autocommit=True)


#: The logins a sandbox's processes (workers, commands run by tests) may need.
PROCESS_ROLES: tuple[RoleName, ...] = (
    "worker",
    "email",
    "close",
    "replay",
    "operator",
    "admin",
    "portal",
    "pricing",
)


def process_env(settings: Settings) -> dict[str, str]:
    """The ``INVOICING_…`` variables that give a child process ``settings``' logins and
    Redis URL (secrets: pass them to a process, never print them)."""
    env = {"INVOICING_REDIS__URL": settings.redis.url.get_secret_value()}
    for role in PROCESS_ROLES:
        login = settings.postgres.role(role)
        env[f"INVOICING_POSTGRES__{role.upper()}__USER"] = login.user
        env[f"INVOICING_POSTGRES__{role.upper()}__PASSWORD"] = login.password.get_secret_value()
    return env


@contextlib.contextmanager
def isolated_pipeline(
    base: Settings,
    unique: str,
    workdir: Path,
    *,
    group_protocol: str | None = None,
    max_poll_interval_ms: int | None = None,
    session_timeout_ms: int | None = None,
    connector: bool = True,
    smtp: bool = True,
) -> Iterator[Pipeline]:
    """Create the test's database, topics, connector, SMTP sink and tax service; tear down after.

    ``connector=False``: no outbox connector and no replication slot (nothing reaches the
    sandbox's invoices topic; about 2 s less to set up and tear down). ``smtp=False``: no
    SMTP sink (an email worker of this sandbox cannot send). Both default to True.
    """
    database = f"inv_{unique}"
    prefix = f"t{unique}."
    maildir = workdir / "maildir"
    smtp_port = free_port()
    pg = base.postgres.model_copy(update={"database": database, "slot": f"slot_{unique}"})
    kafka_updates: dict[str, Any] = {"topic_prefix": prefix}
    if group_protocol:
        kafka_updates["group_protocol"] = group_protocol
    if max_poll_interval_ms:
        kafka_updates["max_poll_interval_ms"] = max_poll_interval_ms
    if session_timeout_ms:
        kafka_updates["session_timeout_ms"] = session_timeout_ms
        kafka_updates["heartbeat_interval_ms"] = max(500, session_timeout_ms // 5)
    kafka = base.kafka.model_copy(update=kafka_updates)
    worker = base.worker.model_copy(
        update={"invoicing_group": f"invoicing-{unique}", "email_group": f"email-{unique}"}
    )
    connect = base.connect.model_copy(update={"outbox_connector": f"outbox-{unique}"})
    smtp_settings = base.smtp.model_copy(update={"port": smtp_port})

    with psycopg.connect(base.postgres.dsn("provisioner"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(pg.owner.user)
            )
        )
    client = httpx.Client(base_url=base.connect.url, timeout=30)
    sink = contextlib.ExitStack()
    secrets: Path | None = None
    try:
        migrate.upgrade(pg)
        provision_publication(pg)
        with running_fake_tax(workdir / "tax") as tax:
            tax_settings = base.tax.model_copy(
                update={"url": tax.url, "cache_ttl_s": SANDBOX_TAX_CACHE_TTL_S}
            )
            # Derived from the caller's settings, not loaded again from the environment.
            settings = base.model_copy(
                update={
                    "postgres": pg,
                    "kafka": kafka,
                    "worker": worker,
                    "connect": connect,
                    "smtp": smtp_settings,
                    "tax": tax_settings,
                }
            )
            ensure_topics(kafka, topic_specs(kafka))
            if connector and settings.connect.secrets_dir is None:
                path = local_secrets_dir(settings) / f"{pg.replication.user}.properties"
                if not path.exists():  # a login of this sandbox's own: remove it afterwards
                    secrets = path
                write_connect_secrets(settings)
            if connector:
                config = render_outbox_config(settings, base.stack.home)
                # Own logical name: Debezium registers its JMX metrics under it, and a name
                # shared with another running connector delays streaming by ~2 minutes.
                config["topic.prefix"] = f"outbox-{unique}"
                # ... and so its own heartbeat topic (the registry's names the stack's)
                heartbeat = f"{config['topic.heartbeat.prefix']}.{config['topic.prefix']}"
                ensure_topics(kafka, (dataclasses.replace(OUTBOX_HEARTBEAT, name=heartbeat),))
                response = client.put(f"/connectors/{connect.outbox_connector}/config", json=config)
                assert response.status_code in (200, 201), response.text
                wait_running(client, connect.outbox_connector, 90)
            if smtp:
                # Under the TLS profile the sink requires STARTTLS and AUTH, as the stack's.
                sink_tls = smtp_sink_tls(base, tls_files(base.stack.local_dir / "conf"))
                sink.enter_context(running_smtp_sink(workdir, port=smtp_port, tls=sink_tls))
            else:
                maildir.mkdir(parents=True, exist_ok=True)
            env = {
                **process_env(settings),
                "INVOICING_POSTGRES__DATABASE": database,
                "INVOICING_POSTGRES__SLOT": pg.slot,
                "INVOICING_KAFKA__TOPIC_PREFIX": prefix,
                "INVOICING_KAFKA__GROUP_PROTOCOL": kafka.group_protocol,
                "INVOICING_KAFKA__MAX_POLL_INTERVAL_MS": str(kafka.max_poll_interval_ms),
                "INVOICING_KAFKA__SESSION_TIMEOUT_MS": str(kafka.session_timeout_ms),
                "INVOICING_KAFKA__HEARTBEAT_INTERVAL_MS": str(kafka.heartbeat_interval_ms),
                "INVOICING_WORKER__INVOICING_GROUP": worker.invoicing_group,
                "INVOICING_WORKER__EMAIL_GROUP": worker.email_group,
                "INVOICING_CONNECT__OUTBOX_CONNECTOR": connect.outbox_connector,
                "INVOICING_SMTP__PORT": str(smtp_port),
                "INVOICING_TAX__URL": tax.url,
                "INVOICING_TAX__CACHE_TTL_S": str(SANDBOX_TAX_CACHE_TTL_S),
            }
            pipeline = Pipeline(unique, settings, env, workdir, maildir, tax)
            try:
                yield pipeline
            finally:
                pipeline.workers.stop()
    finally:
        sink.close()
        if connector:
            client.delete(f"/connectors/{connect.outbox_connector}")
        client.close()
        if connector:
            _drop_slot(pg)
        _drop_database(base.postgres, database)
        _delete_topics(kafka)
        if secrets is not None:
            secrets.unlink(missing_ok=True)


def _delete_topics(kafka: KafkaSettings) -> None:
    """Delete the sandbox's topics (every topic under its prefix) so they do not pile up."""
    from streams.adapters.kafka import admin_client

    admin = admin_client(kafka)
    names = [t for t in admin.list_topics(timeout=10).topics if t.startswith(kafka.topic_prefix)]
    if names:
        for future in admin.delete_topics(names, operation_timeout=30).values():
            with contextlib.suppress(Exception):  # already gone: nothing to do
                future.result()


def _drop_database(base: PostgresSettings, database: str, timeout_s: float = 60.0) -> None:
    """Drop the sandbox database (as the provisioner) once Debezium's sessions have left it
    (its connector was deleted; ending its walsender by force would log an error in
    Connect); every other leftover session is ended by FORCE (``pg_signal_backend``)."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(base.dsn("provisioner"), autocommit=True) as conn:
        while True:
            others = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND usename = %s",
                (database, base.replication.user),
            ).fetchone()
            if others == (0,) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


def _drop_slot(pg: PostgresSettings) -> None:
    deadline = time.monotonic() + 30
    with psycopg.connect(pg.dsn("replication", database="postgres"), autocommit=True) as conn:
        while time.monotonic() < deadline:
            active = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (pg.slot,)
            ).fetchone()
            if active is None:
                return
            (slot_active,) = active
            if not slot_active:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (pg.slot,))
                return
            time.sleep(0.5)
