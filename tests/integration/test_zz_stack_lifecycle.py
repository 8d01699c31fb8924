"""`stack up` twice starts nothing; `stack down` stops exactly what it started, keeps data.

Runs last in the integration tier (file name) and alone (``serial``: `make test` runs the
serial tests after the others): it stops and restarts the stack.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psycopg
import pytest

from streams.devtools.stack.manager import SERVICE_ORDER, Stack
from streams.settings import Settings

pytestmark = pytest.mark.serial


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _pids(stack: Stack) -> dict[str, int]:
    return {str(row["service"]): int(row["pid"]) for row in stack.status() if row["pid"]}  # type: ignore[call-overload]


def test_up_twice_starts_nothing_the_second_time(settings: Settings) -> None:
    stack = Stack(settings)
    first = stack.up()
    before = _pids(stack)
    second = stack.up()
    assert second.started == []
    assert _pids(stack) == before
    assert set(before) == set(SERVICE_ORDER), first


def test_down_stops_only_its_processes_and_keeps_data(settings: Settings) -> None:
    stack = Stack(settings)
    stack.up()
    marker = f"lifecycle-{uuid.uuid4().hex}"
    with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS lifecycle_probe (note text PRIMARY KEY)")
        conn.execute("INSERT INTO lifecycle_probe VALUES (%s)", (marker,))
    pids = _pids(stack)
    # A process the stack did not start, of the same kind as one it did (a python).
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        stopped = stack.down()
        assert set(stopped) == set(SERVICE_ORDER)
        time.sleep(1)
        for name, pid in pids.items():
            assert not _alive(pid), name
        assert bystander.poll() is None, "down stopped a process it did not start"
        assert stack.status() and all(row["state"] == "STOPPED" for row in stack.status())
        assert (
            stack.layout.kafka_data.exists()
            and (stack.layout.kafka_data / "meta.properties").exists()
        )
        assert os.path.exists(stack.layout.postgres_data)

        result = stack.up()
        assert set(result.started) == set(SERVICE_ORDER)
        with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as conn:
            assert conn.execute(
                "SELECT 1 FROM lifecycle_probe WHERE note = %s", (marker,)
            ).fetchone()
            conn.execute("DELETE FROM lifecycle_probe WHERE note = %s", (marker,))
    finally:
        bystander.kill()
        bystander.wait()
        stack.up()
