"""The PDF of every email, the hosted invoice page and ``invoicing explain``, on the real
stack: usage produced to Kafka, invoiced by a worker process, announced through the outbox
and Debezium, emailed by an email sender process (with the stored document's PDF and a
link), the page served by ``invoicing worker portal`` through its own read-only role and
opened in headless Chromium (Debian's ``chromium``).

Oracles: the figures written here (each line's amount and description, their exact sum
rounded half-even), the coordinates Kafka's delivery reports gave for each usage event,
the CloudEvents id of the record Debezium put on ``billing.invoices.v1``, and the emails
the SMTP sink stored. The screenshots are kept in ``.local/test-artifacts/portal/``.
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Message

from streams.adapters.documents.tokens import TokenSigner
from streams.adapters.kafka import make_producer
from streams.bootstrap import run_close_period
from streams.core.domain.codec import decode, encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    EventData,
    InvoiceIssued,
    UsageRecorded,
    invoice_id_for,
)
from streams.core.domain.money import round_money
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings
from tests.support.kafka import drain, headers_of
from tests.support.pipeline import Pipeline, free_port, isolated_pipeline

ARTIFACTS = Path(__file__).resolve().parents[2] / ".local" / "test-artifacts" / "portal"
PERIOD = "2026-10"
SECRET = "integration-test-secret-" + "x" * 16
#: (description, amount, as the PDF shows it: exactly, at least two decimals) of the
#: customer's usage lines; their sum 1,212.9601 rounds half-even to 1,212.96.
LINES = [
    ("Compute: m5.large hours <us-east-1>", Decimal("900.125"), "900.125 USD"),
    ("Storage & backup", Decimal("300.3351"), "300.3351 USD"),
    ("Egress (GB)", Decimal("12.5"), "12.50 USD"),
]


@dataclass
class Scenario:
    p: Pipeline
    customer: str
    invoice_id: str
    coords: dict[str, tuple[int, int]]  # usage event id -> (partition, offset)
    portal: str  # base URL
    message: EmailMessage
    record: Message  # the invoice.issued record Debezium published


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail("chromium not found: run scripts/setup.sh (Debian chromium)")
    return found


def browse(url: str, tmp: Path, *, screenshot: Path | None = None) -> str:
    """The DOM Chromium renders for ``url`` (and a screenshot when asked)."""
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp / ('chromium-' + uuid.uuid4().hex[:6])}",
        "--window-size=1000,1400",
    ]
    if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [chromium(), *flags, f"--screenshot={screenshot}", url],
            check=True,
            capture_output=True,
            timeout=90,
        )
        assert screenshot.read_bytes().startswith(b"\x89PNG")
    done = subprocess.run(
        [chromium(), *flags, "--dump-dom", url], check=True, capture_output=True, timeout=90
    )
    return done.stdout.decode()


def produce(p: Pipeline, items: list[tuple[EventData, str]]) -> dict[str, tuple[int, int]]:
    producer = make_producer(p.settings.kafka)
    reports: dict[str, tuple[int, int]] = {}

    def report(event_id: str) -> Any:
        def on_delivery(err: Any, msg: Message) -> None:
            assert err is None, err
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            reports[event_id] = (partition, offset)

        return on_delivery

    for data, event_id in items:
        record = encode(Envelope.wrap(data, id=event_id, source="/test/documents"))
        producer.produce(
            p.topic,
            key=record.key,
            value=record.value,
            headers=list[tuple[str, str | bytes | None]](record.headers),
            on_delivery=report(event_id),
        )
    assert producer.flush(30) == 0
    return reports


def wait_for(what: str, check: Any, p: Pipeline, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}\n{p.worker_logs()}")


@pytest.fixture(scope="module")
def scenario(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scenario]:
    unique = f"doc{uuid.uuid4().hex[:8]}"
    workdir = tmp_path_factory.mktemp("documents")
    with isolated_pipeline(settings, unique, workdir) as p:
        port = free_port()
        portal = f"http://127.0.0.1:{port}"
        p.env.update(
            {"INVOICING_PORTAL__TOKEN_SECRET": SECRET, "INVOICING_PORTAL__PUBLIC_URL": portal}
        )
        customer = f"{unique}-acme"
        items: list[tuple[EventData, str]] = [
            (
                CustomerUpserted(
                    customer_id=customer,
                    name='Acme <Corp> & "Sons"',
                    email="ap@acme.example",
                    currency="USD",
                ),
                f"{unique}-customer",
            )
        ]
        for n, (description, amount, _) in enumerate(LINES):
            items.append(
                (
                    UsageRecorded(
                        customer_id=customer,
                        billing_period=PERIOD,
                        amount=amount,
                        currency="USD",
                        description=description,
                        event_time=datetime(2026, 10, 5 + n, tzinfo=UTC),
                    ),
                    f"{unique}-usage-{n}",
                )
            )
        coords = produce(p, items)
        p.workers.start("invoicing", 1)
        p.workers.start("email", 1)
        p.workers.start("portal", 1, args=["--port", str(port)])
        run_close_period(PERIOD, p.settings, progress=False)
        invoice_id = invoice_id_for(customer, PERIOD, 1)
        messages = wait_for(
            "the invoice's email",
            lambda: [m for m in list_messages(p.maildir) if m["X-Invoice-Id"] == invoice_id],
            p,
        )
        (raw,) = messages
        message = email.message_from_bytes(raw.as_bytes(), policy=email.policy.default)
        assert isinstance(message, EmailMessage)
        (record,) = drain(p.settings.kafka, p.invoices_topic, expected=1, timeout_s=60)
        wait_for(
            "the portal's health",
            lambda: _health(portal) == 200,
            p,
            timeout_s=60,
        )
        yield Scenario(p, customer, invoice_id, coords, portal, message, record)


def _health(portal: str) -> int:
    try:
        return httpx.get(f"{portal}/health", timeout=2).status_code
    except httpx.HTTPError:
        return 0


def pdftotext(pdf: bytes, tmp_path: Path) -> str:
    path = tmp_path / "doc.pdf"
    path.write_bytes(pdf)
    return subprocess.run(
        ["pdftotext", "-layout", str(path), "-"], check=True, capture_output=True
    ).stdout.decode()


def attachment(message: EmailMessage) -> bytes:
    (part,) = list(message.iter_attachments())
    assert part.get_content_type() == "application/pdf"
    content = part.get_content()
    assert isinstance(content, bytes)
    return content


def link(message: EmailMessage) -> str:
    body = message.get_body(("plain",))
    assert body is not None
    found = re.search(r"View it online: (\S+)", body.get_content())
    assert found, body.get_content()
    return found.group(1)


def test_the_email_carries_the_pdf_of_the_stored_invoice(
    scenario: Scenario, tmp_path: Path
) -> None:
    pdf = attachment(scenario.message)
    text = pdftotext(pdf, tmp_path)
    number = str(scenario.message["Subject"]).split()[1]
    assert number.startswith(f"INV-{PERIOD}-")
    assert f"Invoice {number}" in text
    for description, _, shown in LINES:
        assert description in text
        assert shown in text
    subtotal = round_money(sum((a for _, a, _ in LINES), Decimal(0)), "USD")
    assert f"{subtotal:,.2f} USD" in text  # 1,212.96
    with scenario.p.connect() as conn:
        row = conn.execute(
            "SELECT tax_total, total, taxes FROM invoices WHERE invoice_id = %s",
            (scenario.invoice_id,),
        ).fetchone()
    assert row is not None
    tax_total, total, taxes = row
    assert f"{tax_total:,.2f} USD" in text and f"{total:,.2f} USD" in text
    for tax in taxes:
        assert tax["tax_code"] in text
    assert 'Acme <Corp> & "Sons"' in text


def test_the_page_shows_the_lines_and_totals_and_offers_the_same_pdf(
    scenario: Scenario, tmp_path: Path
) -> None:
    url = link(scenario.message)
    assert url.startswith(f"{scenario.portal}/invoices/{scenario.invoice_id}?t=")
    dom = browse(url, tmp_path, screenshot=ARTIFACTS / "invoice-page.png")
    for description, _, _ in LINES:
        assert description.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in dom
    assert "1,212.96 USD" in dom  # the subtotal
    assert 'id="pdf"' in dom
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    assert response.headers["Cache-Control"] == "private, no-store"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    pdf_url = url.replace("?t=", "/pdf?t=")
    served = httpx.get(pdf_url, timeout=60)
    assert served.status_code == 200 and served.headers["content-type"] == "application/pdf"
    assert served.content == attachment(scenario.message)  # the same bytes as emailed


def test_a_wrong_or_expired_token_gets_404(scenario: Scenario, tmp_path: Path) -> None:
    url = link(scenario.message)
    base, token = url.split("?t=")
    expired = TokenSigner([SECRET]).sign(
        "invoice", scenario.invoice_id, datetime.now(UTC) - timedelta(seconds=1)
    )
    forged = TokenSigner(["another-secret-of-32-bytes-or-more!!"]).sign(
        "invoice", scenario.invoice_id, datetime.now(UTC) + timedelta(days=1)
    )
    other = TokenSigner([SECRET]).sign(
        "invoice", str(uuid.uuid4()), datetime.now(UTC) + timedelta(days=1)
    )
    for bad in (
        f"{base}?t={token[:-2]}xx",
        f"{base}?t={expired}",
        f"{base}?t={forged}",
        f"{base}?t={other}",  # a valid token of another document
        f"{base}/pdf?t={expired}",
        base,
    ):
        response = httpx.get(bad, timeout=10)
        assert response.status_code == 404, bad
        assert "Not found" in response.text and "1,212.96" not in response.text
    dom = browse(f"{base}?t={expired}", tmp_path, screenshot=ARTIFACTS / "expired-token.png")
    assert "This link is not valid, or it has expired" in dom


def test_the_portal_health_and_its_role_are_read_only(scenario: Scenario) -> None:
    assert httpx.get(f"{scenario.portal}/health", timeout=5).json() == {
        "status": "ok",
        "database": "ok",
    }
    import psycopg

    with (
        psycopg.connect(scenario.p.settings.postgres.dsn("portal"), autocommit=True) as conn,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT email FROM invoices LIMIT 1")


def test_explain_traces_every_line_the_writer_the_outbox_and_the_email(scenario: Scenario) -> None:
    p = scenario.p
    number = str(scenario.message["Subject"]).split()[1].rstrip(":")
    done = subprocess.run(
        [sys.executable, "-m", "streams.entrypoints", "explain", number, "--json"],
        env={**os.environ, **p.env, "COLUMNS": "200"},
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    lineage = json.loads(done.stdout)
    assert lineage["document"]["invoice_id"] == scenario.invoice_id
    lines = {line["event_id"]: line for line in lineage["lines"]}
    usage = {k: v for k, v in scenario.coords.items() if "-usage-" in k}
    assert set(lines) == set(usage)
    for event_id, (partition, offset) in usage.items():
        line = lines[event_id]
        assert (line["topic"], line["partition"], line["offset"]) == (p.topic, partition, offset)
    written = lineage["written_by"]
    with p.connect() as conn:
        fence = conn.execute(
            "SELECT generation, member_id FROM partition_fences WHERE topic = %s AND partition = %s",
            (p.topic, next(iter(usage.values()))[0]),
        ).fetchone()
        request = conn.execute(
            "SELECT lease_fencing_token FROM close_requests WHERE customer_id = %s",
            (scenario.customer,),
        ).fetchone()
    assert fence is not None and request is not None
    assert (written["fence_generation"], written["fence_member"]) == fence
    assert lineage["close_request"]["lease_fencing_token"] == request[0]
    assert lineage["tax_document"]["idempotency_key"] == f"{scenario.invoice_id}:r1"
    envelope = decode(
        scenario.record.key(),
        scenario.record.value(),
        headers_of(scenario.record),
        allowed=(InvoiceIssued,),
    )
    assert [row["outbox_id"] for row in lineage["outbox"]] == [envelope.id]
    (mail,) = lineage["emails"]
    assert mail["message_id"] == str(scenario.message["Message-ID"]).strip()
    assert mail["status"] == "sent" and mail["outbox_event_id"] == envelope.id
    assert lineage["superseded_by"] == []
    table = subprocess.run(
        [sys.executable, "-m", "streams.entrypoints", "explain", scenario.invoice_id],
        env={**os.environ, **p.env, "COLUMNS": "200"},
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    assert "lines (event and source coordinates)" in table and envelope.id in table
    missing = subprocess.run(
        [sys.executable, "-m", "streams.entrypoints", "explain", "INV-1999-01-000001"],
        env={**os.environ, **p.env},
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert missing.returncode == 1
