"""``invoicing stack up | down | status | logs``: the local stack, without Docker.

``up`` is idempotent: it installs what is missing (Debian packages as root, Java
artifacts through Maven once), prepares each service the first time (initdb,
KRaft storage format), starts supervisord and then each service in dependency
order, waits for a real health answer, and provisions (roles, database,
migrations, topics, the outbox connector). Run twice, the second run starts
nothing and changes nothing.

``down`` stops exactly the processes supervisord started, then supervisord;
data is kept unless ``wipe=True``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streams.devtools.stack import services as svc
from streams.devtools.stack.errors import StackError
from streams.devtools.stack.health import wait_healthy
from streams.devtools.stack.layout import Layout
from streams.devtools.stack.supervisor import Supervisor
from streams.settings import Settings

Report = Callable[[str], None]

SERVICE_ORDER = ("postgres", "redis", "kafka", "connect", "smtp", "tax")


def _quiet(_: str) -> None:
    return None


@dataclass
class UpResult:
    """What ``up`` did: services started and seconds per step."""

    started: list[str]
    timings: dict[str, float]


class Stack:
    """The local stack of one project checkout."""

    def __init__(self, settings: Settings, report: Report = _quiet) -> None:
        self.settings = settings
        self.layout = Layout(settings.stack.home, settings.stack.state_dir)
        self.supervisor = Supervisor(self.layout)
        self.report = report

    # ------------------------------------------------------------------ fetch

    def _pom(self) -> Path:
        return self.layout.root / "connectors" / "pom.xml"

    def _stamp(self) -> Path:
        return self.layout.java / ".fetched"

    def fetch(self) -> bool:
        """Fetch the Java artifacts with Maven unless the pom is unchanged since the
        last successful fetch. Returns True when Maven ran.

        Raises:
            StackError: Maven is missing or failed.
        """
        pom = self._pom()
        digest = hashlib.sha256(pom.read_bytes()).hexdigest()
        stamp = self._stamp()
        if stamp.exists() and stamp.read_text().strip() == digest and self.layout.java_lib.is_dir():
            return False
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError("mvn not found: install Maven (apt-get install -y maven)")
        self.report(
            "fetching Kafka, Kafka Connect and Debezium from Maven Central (first time only)"
        )
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom),
                "process-resources",
                f"-Dstack.dir={self.layout.java}",
            ],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(
                f"maven fetch failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest + "\n")
        return True

    # ------------------------------------------------------------------ services

    def services(self, *, prepare: bool) -> list[svc.Service]:
        """The services in start order; ``prepare`` also writes configs and runs
        first-time initialisation (initdb, storage format)."""
        layout, settings = self.layout, self.settings
        if prepare:
            layout.ensure()
            pg_paths = svc.prepare_postgres(layout, settings)
            svc.prepare_kafka(layout, settings)
            svc.prepare_connect(layout, settings)
            svc.prepare_redis(layout, settings)
        else:
            pg_paths = (
                svc.postgres_paths(layout, settings)
                if layout.postgres_data.exists()
                else svc.PostgresPaths(layout.postgres_data, settings.stack.postgres_os_user)
            )
        return [
            svc.postgres_service(layout, settings, pg_paths),
            svc.redis_service(layout, settings),
            svc.kafka_service(layout, settings),
            svc.connect_service(layout, settings),
            svc.smtp_service(layout, settings),
            svc.tax_service(layout, settings),
        ]

    def postgres_socket_dir(self) -> Path:
        return svc.postgres_paths(self.layout, self.settings).socket_dir

    # ------------------------------------------------------------------ up

    def up(self, *, provision: bool = True) -> UpResult:
        """Bring every service up and healthy, then provision. Idempotent.

        Raises:
            MissingPackage: an OS package is missing and cannot be installed.
            ServiceUnhealthy: a service did not become healthy (names its log).
            StackError: any other step failed, with the reason.
        """
        timings: dict[str, float] = {}
        started: list[str] = []
        t0 = time.monotonic()
        installed = svc.ensure_os_packages()
        if installed:
            self.report(f"installed Debian packages: {', '.join(installed)}")
        self.fetch()
        timings["install+fetch"] = time.monotonic() - t0

        t0 = time.monotonic()
        services = self.services(prepare=True)
        timings["prepare"] = time.monotonic() - t0
        changed = self.supervisor.write_config([s.program for s in services])
        if not self.supervisor.running():
            self.supervisor.start_daemon()
        elif changed:
            self.supervisor.apply_config_changes()

        for service in services:
            t0 = time.monotonic()
            if not self.supervisor.is_running(service.name) or service.check() is not None:
                if not self.supervisor.is_running(service.name):
                    self.report(f"starting {service.name} on port {service.port}")
                    self.supervisor.start(service.name)
                    started.append(service.name)
                wait_healthy(
                    service.name,
                    service.check,
                    timeout_s=self.settings.stack.health_timeout_s,
                    log=self.layout.log(service.name),
                    alive=lambda name=service.name: self.supervisor.is_running(name),  # type: ignore[misc]
                )
            timings[service.name] = time.monotonic() - t0

        if provision:
            t0 = time.monotonic()
            self.provision()
            timings["provision"] = time.monotonic() - t0
        return UpResult(started=started, timings=timings)

    def provision(self) -> None:
        """Roles, database, migrations, publication, topics, outbox connector. Idempotent."""
        from streams.adapters.kafka import ensure_topics
        from streams.adapters.postgres import migrate, provision
        from streams.devtools.stack.health import postgres_app_check

        socket_dir = self.postgres_socket_dir()
        provision.provision_cluster(self.settings.postgres, socket_dir)
        wait_healthy(
            "postgres (owner role)",
            lambda: postgres_app_check(self.settings),
            timeout_s=30,
            log=self.layout.log("postgres"),
        )
        migrate.upgrade(self.settings.postgres)
        provision.provision_publication(self.settings.postgres)
        created = ensure_topics(self.settings.kafka)
        if created:
            self.report(f"created topics: {', '.join(created)}")
        self._apply_connectors()

    def _apply_connectors(self) -> None:
        try:
            from streams.adapters.connect import apply_outbox_connector
        except ImportError:  # the outbox connector arrives with the main job
            return
        if apply_outbox_connector(self.settings, self.layout.root):
            self.report(f"registered connector {self.settings.connect.outbox_connector}")

    # ------------------------------------------------------------------ down / status / logs

    def down(self, *, wipe: bool = False) -> list[str]:
        """Stop the services this stack started (and supervisord); keep data unless ``wipe``.

        Returns the names of the services that were running.
        """
        was_running: list[str] = []
        if self.supervisor.running():
            was_running = [
                p["name"] for p in self.supervisor.all_info() if p.get("statename") == "RUNNING"
            ]
            # Stop in reverse dependency order so that Connect and the broker stop cleanly.
            for name in reversed(SERVICE_ORDER):
                if name in was_running:
                    self.report(f"stopping {name}")
                    self.supervisor.stop(name)
            self.supervisor.shutdown()
        if wipe:
            self._wipe()
        return was_running

    def _wipe(self) -> None:
        pg = self.layout.postgres_data
        if pg.is_symlink():
            target = Path(pg.readlink())
            shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(self.layout.data, ignore_errors=True)
        shutil.rmtree(self.layout.conf, ignore_errors=True)
        self.report(f"wiped {self.layout.data}")

    def status(self) -> list[dict[str, object]]:
        """One row per service: name, port, pid, state, health (a reason or "ok")."""
        rows: list[dict[str, object]] = []
        sup_running = self.supervisor.running()
        for service in self.services(prepare=False):
            state, pid = "STOPPED", None
            if sup_running:
                try:
                    info = self.supervisor.info(service.name)
                    state, pid = str(info.get("statename")), info.get("pid") or None
                except Exception:  # unknown to this supervisord (config not applied yet)
                    state = "UNKNOWN"
            reason = service.check()
            rows.append(
                {
                    "service": service.name,
                    "port": service.port,
                    "pid": pid,
                    "state": state,
                    "health": "ok" if reason is None else reason,
                    "log": str(self.layout.log(service.name)),
                }
            )
        return rows

    def log_path(self, service: str) -> Path:
        """The log file of ``service`` (or of supervisord itself).

        Raises:
            StackError: no such service.
        """
        if service not in (*SERVICE_ORDER, "supervisord"):
            raise StackError(f"unknown service {service!r}; one of: {', '.join(SERVICE_ORDER)}")
        return self.layout.log(service)
