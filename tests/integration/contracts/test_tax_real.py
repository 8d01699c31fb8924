"""The tax port's contract (tests/contracts/tax.py) on the real client,
:class:`~streams.adapters.tax.client.HttpTaxService`, against a real fake tax service
process (``python -m streams.devtools.stack.fake_tax``, the project's own) on a free port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.adapters.tax.client import HttpTaxService
from streams.core.billing.ports import TaxService
from streams.devtools.stack.fake_tax import FakeTaxConfig, FakeTaxProcess, running_fake_tax
from streams.settings import TaxSettings
from tests.contracts.tax import SeenRequest, TaxHarness, TaxServiceContract

MAX_ATTEMPTS = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_for(url: str) -> TaxSettings:
    return TaxSettings(
        url=url,
        max_attempts=MAX_ATTEMPTS,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        connect_timeout_s=1.0,
    )


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeTaxProcess]:
    workdir: Path = tmp_path_factory.mktemp("fake_tax")
    with running_fake_tax(workdir, config=FakeTaxConfig(base_latency_s=0.0)) as server:
        yield server


class TestHttpTaxService(TaxServiceContract):
    @pytest.fixture
    def harness(self, fake_server: FakeTaxProcess) -> Iterator[TaxHarness]:
        server = fake_server
        server.admin.configure(fail_next=0, error_rate=0.0, timeout_rate=0.0)
        clients: list[HttpTaxService] = []

        def requests(key: str) -> list[SeenRequest]:
            return [
                SeenRequest(r.idempotency_key or "", r.line_count, r.outcome)
                for r in server.admin.requests(key_prefix=f"{key}:")
            ]

        def fail_next_call() -> None:
            # 503 for every attempt the client makes (each retry reuses the key)
            server.admin.configure(fail_next=MAX_ATTEMPTS)

        def unreachable() -> TaxService:
            client = HttpTaxService(settings_for(f"http://127.0.0.1:{free_port()}"))
            clients.append(client)
            return client

        with HttpTaxService(settings_for(server.url)) as http:
            yield TaxHarness(
                service=http,
                requests=requests,
                documents=lambda: int(server.admin.health()["documents"]),
                rate=http.rate,
                fail_next_call=fail_next_call,
                unreachable=unreachable,
            )
        for client in clients:
            client.close()
