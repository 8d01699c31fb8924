"""PostgreSQL, Redis, the SMTP sink and the fake tax service answer for real."""

from __future__ import annotations

import smtplib
import time
import uuid
from email.message import EmailMessage

import httpx
import psycopg
import redis

from streams.devtools.stack.layout import Layout
from streams.devtools.stack.maildir import list_messages
from streams.settings import Settings


def test_postgres_runs_with_logical_wal_level(pg: psycopg.Connection) -> None:
    assert pg.execute("SHOW wal_level").fetchone() == ("logical",)
    assert pg.execute("SELECT 1").fetchone() == (1,)


def test_postgres_schema_is_migrated(pg: psycopg.Connection) -> None:
    tables = {
        r[0] for r in pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    }
    assert {"usage_lines", "invoices", "outbox", "partition_fences", "email_deliveries"} <= tables


def test_redis_answers_ping(redis_conn: redis.Redis) -> None:
    assert redis_conn.ping() is True


def test_smtp_sink_stores_a_message_sent_with_smtplib(settings: Settings) -> None:
    message_id = f"<probe-{uuid.uuid4().hex}@tests.invalid>"
    msg = EmailMessage()
    msg["From"] = "tests@invoicing.invalid"
    msg["To"] = "someone@customers.invalid"
    msg["Subject"] = "probe"
    msg["Message-ID"] = message_id
    msg.set_content("plain body")
    msg.add_alternative("<p>html body</p>", subtype="html")
    with smtplib.SMTP(settings.smtp.host, settings.smtp.port, timeout=10) as smtp:
        assert smtp.noop()[0] == 250
        smtp.send_message(msg)
    maildir = Layout(settings.stack.home, settings.stack.state_dir).maildir
    deadline = time.monotonic() + 10
    found: list[EmailMessage] = []
    while not found and time.monotonic() < deadline:
        found = [m for m in list_messages(maildir) if m["Message-ID"] == message_id]
        time.sleep(0.2)
    assert len(found) == 1
    assert found[0]["Subject"] == "probe"


def test_fake_tax_answers_a_three_line_document_after_the_configured_latency(
    settings: Settings,
) -> None:
    base = settings.tax.url
    with httpx.Client(base_url=base, timeout=30) as client:
        original = client.get("/admin/config").json()
        try:
            r = client.put(
                "/admin/config",
                json={
                    "base_latency_s": 0.4,
                    "per_line_latency_s": 0.05,
                    "spike_probability": 0,
                    "error_rate": 0,
                    "timeout_rate": 0,
                },
            )
            assert r.status_code == 200, r.text
            key = f"probe-{uuid.uuid4().hex}"
            body = {
                "idempotency_key": key,
                "customer_id": "probe",
                "currency": "USD",
                "commit": True,
                "lines": [
                    {
                        "line_id": str(i),
                        "amount": "10.00",
                        "region_id": "us-west-2",
                        "tax_code": None,
                    }
                    for i in range(3)
                ],
            }
            started = time.monotonic()
            response = client.post("/v1/documents", json=body)
            elapsed = time.monotonic() - started
            assert response.status_code == 200, response.text
            lines = response.json()["lines"]
            assert [line["line_id"] for line in lines] == ["0", "1", "2"]
            expected = 0.4 + 3 * 0.05
            assert expected - 0.02 <= elapsed <= expected + 1.0, elapsed
            records = client.get("/admin/requests").json()
            mine = [
                r
                for r in (records["requests"] if isinstance(records, dict) else records)
                if r.get("idempotency_key", "").startswith(key)
            ]
            assert len(mine) == 1
            assert mine[0]["line_count"] == 3
        finally:
            client.put(
                "/admin/config",
                json={
                    k: v
                    for k, v in original.items()
                    if k
                    in (
                        "base_latency_s",
                        "per_line_latency_s",
                        "spike_probability",
                        "spike_latency_s",
                        "error_rate",
                        "timeout_rate",
                    )
                },
            )
