"""Worker processes started from Python: the demo, the drill and the tests use it.

Each worker is a separate OS process (``invoicing worker invoicing|email``),
the way they are deployed: a consumer-group member per process. Settings reach
them through the environment (``INVOICING_…`` variables), so a caller can point
a group of workers at its own database, topics and consumer groups.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType


@dataclass
class WorkerProcess:
    """One running worker: its kind, index, process and log file."""

    kind: str
    index: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.index}"


@dataclass
class WorkerGroup:
    """Start and stop a set of worker processes (a context manager).

    Args:
        log_dir: where each process writes ``<kind>-<n>.log``.
        env: extra environment (``INVOICING_…`` overrides) for every process.
    """

    log_dir: Path
    #: May carry passwords (the sandbox's logins): kept out of ``repr``.
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    processes: list[WorkerProcess] = field(default_factory=list)

    def start(
        self,
        kind: str,
        count: int = 1,
        *,
        extra_env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
    ) -> list[WorkerProcess]:
        """Start ``count`` processes of ``kind`` (``invoicing``, ``email``, ``usage-view``,
        ``ingest``), each with the extra command-line ``args``."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = []
        for _ in range(count):
            index = sum(1 for p in self.processes if p.kind == kind) + 1
            log = self.log_dir / f"{kind}-{index}.log"
            env = {**os.environ, **self.env, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
            with log.open("ab") as fh:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "streams.entrypoints", "worker", kind, *args],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            worker = WorkerProcess(kind, index, proc, log)
            self.processes.append(worker)
            started.append(worker)
        return started

    def alive(self) -> list[WorkerProcess]:
        return [p for p in self.processes if p.process.poll() is None]

    def stop(self, timeout_s: float = 30.0) -> dict[str, int | None]:
        """SIGTERM every process, wait, SIGKILL what remains; returns exit codes by name."""
        for worker in self.alive():
            worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for worker in self.processes:
            remaining = max(0.1, deadline - time.monotonic())
            try:
                worker.process.wait(remaining)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(10)
        return {w.name: w.process.returncode for w in self.processes}

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
