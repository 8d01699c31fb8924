"""The services of the local stack: how each is prepared, started and checked.

Order (each waits for the previous to be healthy): postgres, redis, kafka,
connect, smtp, tax. Ports come from :class:`streams.settings.Settings`.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlparse

from streams.devtools.stack import health, tls
from streams.devtools.stack.errors import MissingPackage, StackError
from streams.devtools.stack.layout import Layout
from streams.devtools.stack.supervisor import Program
from streams.settings import Settings

#: Debian packages the stack needs, by the binary that proves each is installed.
OS_PACKAGES = {"postgresql": "postgres", "redis-server": "redis-server"}


@dataclass(frozen=True)
class Service:
    """A service: its supervised program, a health check and its port."""

    name: str
    port: int
    program: Program
    check: Callable[[], str | None]


def _host_port(hostport: str) -> tuple[str, int]:
    host, _, port = hostport.rpartition(":")
    return host, int(port)


def postgres_bindir() -> Path | None:
    """Folder of the newest installed PostgreSQL server binaries, if any."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("postgres")
    return Path(found).parent if found else None


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise MissingPackage(
            "java not found: install a JDK 17+ (apt-get install -y openjdk-17-jre-headless)"
        )
    return found


def ensure_os_packages(*, install: bool = True) -> list[str]:
    """Install the Debian packages the stack needs when missing (as root).

    Returns the packages installed.

    Raises:
        MissingPackage: one is missing and we are not root (the message gives the
            exact command), or apt-get failed.
    """
    missing = [
        pkg
        for pkg, probe in OS_PACKAGES.items()
        if (postgres_bindir() if probe == "postgres" else redis_binary()) is None
    ]
    if not missing:
        return []
    command = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    if os.geteuid() != 0 or not install:
        raise MissingPackage(
            f"missing Debian packages: {' '.join(missing)}; install them with: "
            f"sudo apt-get update && sudo {' '.join(command)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
        result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise MissingPackage(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return missing


# --------------------------------------------------------------------------- postgres


@dataclass(frozen=True)
class PostgresPaths:
    """The cluster folder and socket folder, both owned by the OS user PostgreSQL runs as."""

    base: Path
    os_user: str

    @property
    def cluster(self) -> Path:
        return self.base / "cluster"

    @property
    def socket_dir(self) -> Path:
        return self.base / "socket"


def _run_as(
    user: str | None, command: list[str], **kwargs: object
) -> subprocess.CompletedProcess[str]:
    if user is not None:
        command = ["runuser", "-u", user, "--", *command]
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


def postgres_paths(layout: Layout, settings: Settings) -> PostgresPaths:
    """Where the cluster lives, creating the base folder owned by the right user.

    PostgreSQL refuses to run as root. As root we run it as
    ``settings.stack.postgres_os_user`` (created if absent). That user must be
    able to reach the folder: when the repo sits under a folder it cannot
    traverse (e.g. ``/root``), ``.local/data/postgres`` becomes a symlink to a
    folder under ``/var/tmp`` keyed by the stack folder's path.
    """
    link = layout.postgres_data
    if os.geteuid() != 0:
        link.mkdir(parents=True, exist_ok=True)
        return PostgresPaths(link, pwd.getpwuid(os.geteuid()).pw_name)
    user = settings.stack.postgres_os_user
    try:
        pwd.getpwnam(user)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user],
            check=True,
        )
    if link.is_symlink():
        target = Path(os.readlink(link))
        target.mkdir(parents=True, exist_ok=True)
        shutil.chown(target, user, None)
        return PostgresPaths(target, user)
    layout.data.mkdir(parents=True, exist_ok=True)
    if _run_as(user, ["test", "-x", str(layout.data)]).returncode == 0:
        link.mkdir(parents=True, exist_ok=True)
        shutil.chown(link, user, None)
        return PostgresPaths(link, user)
    digest = hashlib.sha256(str(layout.local).encode()).hexdigest()[:12]
    target = Path("/var/tmp") / f"invoicing-postgres-{digest}"
    target.mkdir(parents=True, exist_ok=True)
    shutil.chown(target, user, None)
    target.chmod(0o700)
    if link.exists():
        shutil.rmtree(link)
    link.symlink_to(target)
    return PostgresPaths(target, user)


def prepare_postgres(layout: Layout, settings: Settings) -> PostgresPaths:
    """initdb the cluster the first time (trust on the unix socket for the
    ``postgres`` superuser, scram-sha-256 over TCP)."""
    paths = postgres_paths(layout, settings)
    bindir = postgres_bindir()
    if bindir is None:
        raise MissingPackage("PostgreSQL server binaries not found (apt-get install -y postgresql)")
    run_as = paths.os_user if os.geteuid() == 0 else None
    _run_as(run_as, ["mkdir", "-p", str(paths.socket_dir)])
    if not (paths.cluster / "PG_VERSION").exists():
        result = _run_as(
            run_as,
            [
                str(bindir / "initdb"),
                "-D",
                str(paths.cluster),
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-locale",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ],
        )
        if result.returncode != 0:
            raise StackError(f"initdb failed:\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}")
    if tls.postgres_tls(settings):
        _postgres_tls_files(layout, paths)
    return paths


def _postgres_tls_files(layout: Layout, paths: PostgresPaths) -> None:
    """The TLS profile: the server certificate and key, and an ``hba`` file that admits
    TCP clients over TLS only (``hostssl``), copied into the cluster's base folder (owned
    by PostgreSQL's OS user, which may not reach the repo)."""
    files = tls.tls_files(layout.conf)
    if not files.key.exists():
        raise StackError("no TLS certificates: run `invoicing stack up --profile tls`")
    target = paths.base / "tls"
    target.mkdir(exist_ok=True)
    hba = "\n".join(
        [
            "local all all trust",
            "hostssl all all 127.0.0.1/32 scram-sha-256",
            "hostssl replication all 127.0.0.1/32 scram-sha-256",
            "",
        ]
    )
    for name, data in (
        ("server.pem", files.cert.read_bytes()),
        ("server.key", files.key.read_bytes()),
        ("pg_hba.conf", hba.encode()),
    ):
        path = target / name
        path.write_bytes(data)
        path.chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(path, paths.os_user, None)
    if os.geteuid() == 0:
        shutil.chown(target, paths.os_user, None)


def _postgres_tls_options(settings: Settings, paths: PostgresPaths) -> list[str]:
    if not tls.postgres_tls(settings):
        return []
    target = paths.base / "tls"
    options = ["ssl=on", f"ssl_cert_file={target / 'server.pem'}"]
    options += [f"ssl_key_file={target / 'server.key'}", f"hba_file={target / 'pg_hba.conf'}"]
    return [arg for option in options for arg in ("-c", option)]


def postgres_service(layout: Layout, settings: Settings, paths: PostgresPaths) -> Service:
    bindir = postgres_bindir() or Path("/usr/lib/postgresql/15/bin")
    pg = settings.postgres
    program = Program(
        name="postgres",
        command=[
            str(bindir / "postgres"),
            "-D",
            str(paths.cluster),
            "-c",
            f"port={pg.port}",
            "-c",
            f"listen_addresses={pg.host}",
            "-c",
            f"unix_socket_directories={paths.socket_dir}",
            "-c",
            "wal_level=logical",
            "-c",
            "max_wal_senders=10",
            "-c",
            "max_replication_slots=10",
            "-c",
            "max_connections=200",
            "-c",
            "shared_buffers=128MB",
            "-c",
            "log_min_messages=warning",
            *_postgres_tls_options(settings, paths),
        ],
        directory=paths.base,
        user=paths.os_user if os.geteuid() == 0 else None,
        stopsignal="INT",  # fast shutdown
        stopwaitsecs=60,
    )
    return Service(
        "postgres",
        pg.port,
        program,
        lambda: health.postgres_superuser_check(paths.socket_dir, pg.port),
    )


# --------------------------------------------------------------------------- redis


def prepare_redis(layout: Layout, settings: Settings) -> None:
    """Write redis.conf: loopback, non-default port, append-only data under .local/, a
    memory limit (``stack.redis_maxmemory``) at which writes are refused, never a key evicted
    (``noeviction``: a lease or the fencing counter evicted would let two holders run; the
    tax cache and the ingest claims tolerate a refused write, docs/security.md "Redis")."""
    parsed = urlparse(settings.redis.url.get_secret_value())
    port = parsed.port or 6379
    if tls.redis_tls(settings):
        files = tls.tls_files(layout.conf)
        password = settings.redis.password.get_secret_value() if settings.redis.password else ""
        listen = [
            "port 0",
            f"tls-port {port}",
            f"tls-cert-file {files.cert}",
            f"tls-key-file {files.key}",
            f"tls-ca-cert-file {files.ca}",
            "tls-auth-clients no",
            "user default off",
            f"user {settings.redis.username} on >{password} ~* &* +@all",
        ]
    else:
        listen = [f"port {port}"]
    (layout.conf / "redis.conf").write_text(
        "\n".join(
            [
                f"bind {parsed.hostname or '127.0.0.1'}",
                *listen,
                "protected-mode yes",
                "daemonize no",
                f"dir {layout.redis_data}",
                # The lease fencing counter (INCR) must survive a restart: append-only file.
                "appendonly yes",
                "appendfsync everysec",
                'save ""',
                f"maxmemory {settings.stack.redis_maxmemory}",
                "maxmemory-policy noeviction",
                "loglevel notice",
                "",
            ]
        )
    )


def redis_service(layout: Layout, settings: Settings) -> Service:
    port = urlparse(settings.redis.url.get_secret_value()).port or 6379
    binary = redis_binary() or "redis-server"
    program = Program(
        name="redis", command=[binary, str(layout.conf / "redis.conf")], directory=layout.redis_data
    )
    return Service("redis", port, program, lambda: health.redis_check(settings))


# --------------------------------------------------------------------------- kafka + connect


LOG4J2 = """\
status = warn
name = invoicing-stack
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d{ISO8601}] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = info
logger.kafkaorg.name = org.apache.kafka
logger.kafkaorg.level = info
logger.reflections.name = org.reflections
logger.reflections.level = error
logger.statechange.name = state.change.logger
logger.statechange.level = warn
"""


def _kafka_cluster_id() -> str:
    # Kafka's Uuid.randomUuid().toString(): 16 random bytes, base64url without padding,
    # drawn again when it starts with "-" (as Kafka's does): the storage tool would read
    # "-t -…" as a missing argument (1 format in 64 failed so).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def prepare_kafka(layout: Layout, settings: Settings) -> None:
    """Write the broker config and format its storage the first time (KRaft, standalone)."""
    host, port = _host_port(settings.kafka.bootstrap_servers.split(",")[0])
    ctl = settings.kafka.controller_port
    props = layout.conf / "server.properties"
    secure = tls.kafka_tls(settings)
    name = "SASL_SSL" if secure else "PLAINTEXT"
    files = tls.tls_files(layout.conf)
    if secure:
        # The TLS profile: one SASL_SSL listener for clients and the broker itself; the
        # KRaft controller listener stays plaintext on loopback (no client uses it).
        listener_security = [
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
            + tls.jaas(tls.KAFKA_USER, tls.KAFKA_PASSWORD),
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={files.kafka_keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={files.ca}",
        ]
    else:
        listener_security = [
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        ]
    props.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.bootstrap.servers={host}:{ctl}",
                f"listeners={name}://{host}:{port},CONTROLLER://{host}:{ctl}",
                f"advertised.listeners={name}://{host}:{port},CONTROLLER://{host}:{ctl}",
                "controller.listener.names=CONTROLLER",
                f"inter.broker.listener.name={name}",
                *listener_security,
                f"log.dirs={layout.kafka_data}",
                "num.partitions=1",
                "default.replication.factor=1",
                "offsets.topic.replication.factor=1",
                "offsets.topic.num.partitions=12",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "share.coordinator.state.topic.replication.factor=1",
                "share.coordinator.state.topic.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "group.coordinator.rebalance.protocols=classic,consumer",
                # Group timers of the local (development and test) broker, shorter than a
                # production broker's so that fault scenarios take seconds, not minutes
                # (docs/testing.md "The test broker"): the classic floor 6 s → 2 s; KIP-848
                # (group.protocol=consumer, where the broker, not the client, sets the
                # session timeout) 45 s → 10 s, heartbeats 5 s → 2 s. Clients' own defaults
                # (session.timeout.ms 45 s) are unchanged.
                "group.min.session.timeout.ms=2000",
                "group.consumer.min.session.timeout.ms=2000",
                "group.consumer.session.timeout.ms=10000",
                "group.consumer.min.heartbeat.interval.ms=500",
                "group.consumer.heartbeat.interval.ms=2000",
                # Topics come from streams.topics.REGISTRY (and Connect's own): no silent auto-creation.
                "auto.create.topics.enable=false",
                "log.retention.check.interval.ms=300000",
                "",
            ]
        )
    )
    (layout.conf / "log4j2.properties").write_text(LOG4J2)
    scram_marker = layout.kafka_data / ".scram-users"
    formatted = (layout.kafka_data / "meta.properties").exists()
    if secure and formatted and not scram_marker.exists():
        raise StackError(
            "the broker's storage was formatted without the TLS profile's SCRAM user: "
            "`invoicing stack down --wipe` first"
        )
    if not formatted:
        scram = (
            ["--add-scram", f"SCRAM-SHA-512=[name={tls.KAFKA_USER},password={tls.KAFKA_PASSWORD}]"]
            if secure
            else []
        )
        result = subprocess.run(
            [
                java_binary(),
                "-cp",
                f"{layout.java_lib}/*",
                f"-Dlog4j2.configurationFile={layout.conf / 'log4j2.properties'}",
                "kafka.tools.StorageTool",
                "format",
                "--standalone",
                "-t",
                _kafka_cluster_id(),
                "-c",
                str(props),
                *scram,
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(
                f"kafka storage format failed:\n{result.stdout[-1500:]}\n{result.stderr[-1500:]}"
            )
        if secure:
            scram_marker.write_text(f"SCRAM-SHA-512 {tls.KAFKA_USER}\n")


def _java_program(layout: Layout, name: str, heap: str, main: str, conf: Path) -> Program:
    return Program(
        name=name,
        command=[
            java_binary(),
            *heap.split(),
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={layout.conf / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={layout.logs}",
            "-cp",
            f"{layout.java_lib}/*",
            main,
            str(conf),
        ],
        directory=layout.root,
        stopwaitsecs=60,
        startsecs=3,
    )


def kafka_service(layout: Layout, settings: Settings) -> Service:
    _, port = _host_port(settings.kafka.bootstrap_servers.split(",")[0])
    conf = layout.conf / "server.properties"
    program = _java_program(layout, "kafka", settings.stack.kafka_heap, "kafka.Kafka", conf)
    # As for Connect: a changed broker config changes the program, so `stack up` restarts
    # the broker with it.
    digest = hashlib.sha256(conf.read_bytes() if conf.exists() else b"").hexdigest()
    program = replace(program, environment={"INVOICING_BROKER_CONFIG_SHA256": digest})
    return Service("kafka", port, program, lambda: health.kafka_check(settings))


def prepare_connect(layout: Layout, settings: Settings) -> None:
    """Write the Connect worker config, with the file config provider that resolves
    Debezium's password (``allowed.paths``: the secrets folder only), and the secrets
    file itself (mode 0600; :func:`streams.adapters.connect.write_connect_secrets`)."""
    from streams.adapters.connect import worker_provider_config, write_connect_secrets

    url = urlparse(settings.connect.url)
    write_connect_secrets(settings)
    providers = [f"{k}={v}" for k, v in worker_provider_config(settings).items()]
    # The TLS profile: the worker and its producer (Debezium writes through it), consumer
    # and admin reach the SASL_SSL listener. The REST API stays HTTP on loopback.
    security = (
        [
            line
            for prefix in ("", "producer.", "consumer.", "admin.")
            for line in tls.kafka_client_properties(tls.tls_files(layout.conf), prefix)
        ]
        if tls.kafka_tls(settings)
        else []
    )
    (layout.conf / "connect-distributed.properties").write_text(
        "\n".join(
            [
                f"bootstrap.servers={settings.kafka.bootstrap_servers}",
                *security,
                f"group.id={settings.connect.group_id}",
                "key.converter=org.apache.kafka.connect.json.JsonConverter",
                "value.converter=org.apache.kafka.connect.json.JsonConverter",
                "key.converter.schemas.enable=false",
                "value.converter.schemas.enable=false",
                "config.storage.topic=_invoicing-connect-configs",
                "offset.storage.topic=_invoicing-connect-offsets",
                "status.storage.topic=_invoicing-connect-status",
                # One broker: every internal topic has replication factor 1.
                "config.storage.replication.factor=1",
                "offset.storage.replication.factor=1",
                "status.storage.replication.factor=1",
                "offset.storage.partitions=5",
                "status.storage.partitions=3",
                "offset.flush.interval.ms=1000",
                # One worker: a connector it lost while the broker was away (its group
                # membership expired) is given back at once, not after the 5 min that
                # incremental cooperative rebalancing waits for a departed worker by
                # default (docs/architecture.md "Kafka Connect after a broker outage").
                "scheduled.rebalance.max.delay.ms=0",
                f"listeners=http://{url.hostname}:{url.port}",
                f"rest.advertised.host.name={url.hostname}",
                f"rest.advertised.port={url.port}",
                # plugin.path names the parent of the plugin folder.
                f"plugin.path={layout.plugins}",
                "plugin.discovery=hybrid_warn",
                "topic.creation.enable=true",
                # Connector configs reference secrets (${file:<path>:<key>}), never hold them.
                *providers,
                "",
            ]
        )
    )


def connect_service(layout: Layout, settings: Settings) -> Service:
    url = urlparse(settings.connect.url)
    conf = layout.conf / "connect-distributed.properties"
    program = _java_program(
        layout,
        "connect",
        settings.stack.connect_heap,
        "org.apache.kafka.connect.cli.ConnectDistributed",
        conf,
    )
    # The worker reads its config once: a changed config (e.g. the config provider added)
    # changes the program, so `stack up` restarts Connect with it.
    digest = hashlib.sha256(conf.read_bytes() if conf.exists() else b"").hexdigest()
    program = replace(program, environment={"INVOICING_WORKER_CONFIG_SHA256": digest})
    return Service("connect", url.port or 8083, program, lambda: health.connect_check(settings))


# --------------------------------------------------------------------------- the project's fakes


def smtp_service(layout: Layout, settings: Settings) -> Service:
    # The TLS profile: STARTTLS required, AUTH required (its password by environment).
    smtp_tls_args, tls_environment = tls.smtp_sink_tls(settings, tls.tls_files(layout.conf))
    environment = {"PYTHONUNBUFFERED": "1", **tls_environment}
    program = Program(
        name="smtp",
        command=[
            sys.executable,
            "-m",
            "streams.devtools.stack.smtp_sink",
            "--host",
            settings.smtp.host,
            "--port",
            str(settings.smtp.port),
            "--maildir",
            str(layout.maildir),
            *smtp_tls_args,
        ],
        directory=layout.root,
        environment=environment,
    )
    return Service("smtp", settings.smtp.port, program, lambda: health.smtp_check(settings))


def tax_service(layout: Layout, settings: Settings) -> Service:
    url = urlparse(settings.tax.url)
    fakes = settings.fakes
    program = Program(
        name="tax",
        command=[
            sys.executable,
            "-m",
            "streams.devtools.stack.fake_tax",
            "--host",
            url.hostname or "127.0.0.1",
            "--port",
            str(url.port),
            "--record-file",
            str(layout.tax_records),
            "--base-latency-s",
            str(fakes.tax_base_latency_s),
            "--per-line-latency-s",
            str(fakes.tax_per_line_latency_s),
            "--spike-probability",
            str(fakes.tax_spike_probability),
            "--spike-latency-s",
            str(fakes.tax_spike_latency_s),
            "--error-rate",
            str(fakes.tax_error_rate),
        ],
        directory=layout.root,
        environment={"PYTHONUNBUFFERED": "1"},
    )
    return Service("tax", url.port or 80, program, lambda: health.tax_check(settings))
