"""Where the local stack keeps its files: everything under the repo's ``.local/``.

::

    .local/
      java/lib/            Kafka broker + Connect + log4j2 binding (Maven Central)
      java/plugins/        Debezium PostgreSQL connector plugin (unpacked archive)
      conf/                rendered configs (server.properties, connect, log4j2, supervisord)
      data/kafka/          KRaft log dirs          data/redis/   Redis AOF
      data/postgres/       PostgreSQL cluster (or a symlink: services.postgres_paths)
      data/maildir/        messages the SMTP sink received
      data/tax/            requests the fake tax service recorded (JSON lines)
      logs/<service>.log   each service's output
      run/                 supervisord socket and pid, PostgreSQL socket
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Layout:
    """Paths of the local stack, derived from the project root.

    ``state`` moves everything but the jars (``conf``, ``data``, ``logs``, ``run``) to
    another folder, so that a second stack (on other ports) runs from the same
    checkout: the test runner starts one for the chaos tier beside the integration
    tier's (docs/testing.md "How `make test` runs"). The jars stay in the checkout's
    ``.local/java`` and are shared.
    """

    root: Path
    state: Path | None = None

    @property
    def local(self) -> Path:
        return self.state if self.state is not None else self.root / ".local"

    @property
    def java(self) -> Path:
        return self.root / ".local" / "java"

    @property
    def java_lib(self) -> Path:
        return self.java / "lib"

    @property
    def plugins(self) -> Path:
        return self.java / "plugins"

    @property
    def conf(self) -> Path:
        return self.local / "conf"

    @property
    def data(self) -> Path:
        return self.local / "data"

    @property
    def logs(self) -> Path:
        return self.local / "logs"

    @property
    def run(self) -> Path:
        return self.local / "run"

    @property
    def kafka_data(self) -> Path:
        return self.data / "kafka"

    @property
    def postgres_data(self) -> Path:
        return self.data / "postgres"

    @property
    def redis_data(self) -> Path:
        return self.data / "redis"

    @property
    def maildir(self) -> Path:
        return self.data / "maildir"

    @property
    def tax_records(self) -> Path:
        return self.data / "tax" / "requests.jsonl"

    @property
    def supervisor_conf(self) -> Path:
        return self.conf / "supervisord.conf"

    @property
    def supervisor_socket(self) -> Path:
        return self.run / "supervisord.sock"

    @property
    def supervisor_pid(self) -> Path:
        return self.run / "supervisord.pid"

    def log(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def ensure(self) -> None:
        """Create the folders (not the PostgreSQL data folder: initdb does)."""
        for path in (
            self.conf,
            self.data,
            self.logs,
            self.run,
            self.kafka_data,
            self.redis_data,
            self.maildir,
            self.tax_records.parent,
        ):
            path.mkdir(parents=True, exist_ok=True)
