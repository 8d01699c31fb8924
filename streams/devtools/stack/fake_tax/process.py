"""The fake tax service as a child process, for tests and drills: :func:`running_fake_tax`
starts it on a free port and :class:`FakeTaxAdmin` drives its admin API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from streams.devtools.stack.fake_tax.server import FakeTaxConfig, RequestRecord

__all__ = ["FakeTaxAdmin", "FakeTaxProcess", "running_fake_tax"]


class FakeTaxAdmin:
    """Client of the fake's admin API (synchronous, httpx)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url = url
        self._client = httpx.Client(base_url=url, timeout=timeout_s, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def _json(self, response: httpx.Response) -> Any:
        response.raise_for_status()
        return response.json()

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json(self._client.get("/health"))
        return result

    def requests(
        self, *, kind: str | None = "document", key_prefix: str | None = None
    ) -> list[RequestRecord]:
        """Records in arrival order, of ``kind`` (``None`` = all) and key prefix."""
        params = {k: v for k, v in (("kind", kind), ("key_prefix", key_prefix)) if v is not None}
        data = self._json(self._client.get("/admin/requests", params=params))
        return [RequestRecord.model_validate(r) for r in data["requests"]]

    def clear(self) -> int:
        """Forget the records in memory; returns how many there were."""
        return int(self._json(self._client.delete("/admin/requests"))["cleared"])

    def config(self) -> FakeTaxConfig:
        return FakeTaxConfig.model_validate(self._json(self._client.get("/admin/config")))

    def configure(self, **changes: Any) -> FakeTaxConfig:
        """Change knobs at runtime, e.g. ``configure(error_rate=0.5, seed=1)``.

        Raises:
            httpx.HTTPStatusError: 422 for an unknown knob or a value out of range.
        """
        return FakeTaxConfig.model_validate(
            self._json(self._client.put("/admin/config", json=changes))
        )


@dataclass
class FakeTaxProcess:
    """A running fake started by :func:`running_fake_tax`."""

    url: str
    port: int
    admin: FakeTaxAdmin
    process: subprocess.Popen[bytes]
    record_file: Path
    log_file: Path


@contextmanager
def running_fake_tax(
    workdir: Path,
    *,
    config: FakeTaxConfig | None = None,
    startup_timeout_s: float = 20.0,
) -> Iterator[FakeTaxProcess]:
    """Start the fake as a subprocess on a free port of 127.0.0.1, wait until healthy,
    yield it, then stop it with SIGTERM (SIGKILL after 10 s).

    Files in ``workdir``: ``fake_tax.jsonl`` (records), ``fake_tax.log`` (stderr).

    Raises:
        RuntimeError: the server did not become healthy in ``startup_timeout_s``
            (the message carries the end of its log).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / "fake_tax.port"
    port_file.unlink(missing_ok=True)
    record_file = workdir / "fake_tax.jsonl"
    log_file = workdir / "fake_tax.log"
    argv = [
        sys.executable,
        "-m",
        "streams.devtools.stack.fake_tax",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--record-file",
        str(record_file),
    ]
    for name, value in (config or FakeTaxConfig()).model_dump().items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        elif value is not None:
            text = json.dumps(value) if isinstance(value, dict) else str(value)
            argv += [flag, text]
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(os.environ)
        )
    admin: FakeTaxAdmin | None = None
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"fake tax service did not start (exit {process.poll()}):\n{tail}"
                )
            if port_file.exists():
                port = int(port_file.read_text())
                url = f"http://127.0.0.1:{port}"
                admin = FakeTaxAdmin(url)
                try:
                    admin.health()
                    break
                except httpx.HTTPError:
                    admin.close()
                    admin = None
            time.sleep(0.05)
        yield FakeTaxProcess(url, port, admin, process, record_file, log_file)
    finally:
        if admin is not None:
            admin.close()
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
