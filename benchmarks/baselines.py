"""Physical baselines measured in the same run: COPY, the fake tax round trip, and
Debezium relaying bare outbox rows. (The bare consumer and bare producer are in
:mod:`benchmarks.kafka_tools`.)
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from psycopg import sql

from benchmarks.kafka_tools import TopicCounter, create_topic
from benchmarks.measure import median
from benchmarks.product import Pipeline
from streams.topics import INVOICES


@dataclass(frozen=True)
class CopyResult:
    rows: int
    rate: float
    samples: list[float]


def copy_rate(
    p: Pipeline, table: str, where: str, params: tuple[Any, ...], *, repeats: int, warmup: int
) -> CopyResult:
    """COPY the rows of ``table`` selected by ``where`` into a copy of ``table``
    (``CREATE TABLE … (LIKE table INCLUDING ALL)``: same columns, defaults, checks and
    indexes; no foreign keys) in the sandbox database; rows per second of
    ``COPY … FROM STDIN`` + commit, median of ``repeats`` after ``warmup`` (each into the
    emptied copy). The rows are read out once beforehand (``COPY (SELECT …) TO STDOUT``,
    text format) and held in memory, so only the write is timed."""
    copy_table = f"bench_copy_{table}"
    chunks: list[bytes] = []
    with p.connect() as conn:
        with conn.cursor() as cur:
            query = sql.SQL("COPY (SELECT * FROM {} WHERE {}) TO STDOUT").format(
                sql.Identifier(table),
                sql.SQL(where),
            )
            with cur.copy(query, params) as copy:
                for data in copy:
                    chunks.append(bytes(data))
        rows = sum(chunk.count(b"\n") for chunk in chunks)
        conn.execute(
            sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING ALL)").format(
                sql.Identifier(copy_table), sql.Identifier(table)
            )
        )
    samples: list[float] = []
    try:
        with psycopg.connect(p.settings.postgres.dsn("owner")) as conn:
            for i in range(warmup + repeats):
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(copy_table)))
                conn.commit()
                t0 = time.perf_counter()
                with (
                    conn.cursor() as cur,
                    cur.copy(
                        sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(copy_table))
                    ) as copy,
                ):
                    for chunk in chunks:
                        copy.write(chunk)
                conn.commit()
                seconds = time.perf_counter() - t0
                if i >= warmup:
                    samples.append(rows / seconds)
    finally:
        with p.connect() as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(copy_table)))
    return CopyResult(rows, median(samples) if samples else 0.0, samples)


def tax_round_trips(url: str, *, lines: int, samples: int, warmup: int = 3) -> list[float]:
    """Seconds per ``POST /v1/documents`` of ``lines`` lines to the fake tax service
    (commit=true, a new idempotency key each), body encoded beforehand: send → answer
    read. ``warmup`` untimed requests first."""
    bodies = []
    for _ in range(warmup + samples):
        key = f"bench-rt-{uuid.uuid4().hex}"
        bodies.append(
            json.dumps(
                {
                    "idempotency_key": key,
                    "customer_id": "bench-rt",
                    "currency": "USD",
                    "commit": True,
                    "lines": [
                        {
                            "line_id": f"l{n}",
                            "amount": f"{(n % 997) * 0.0137 + 0.01:.6f}",
                            "region_id": ("us-west-2", "eu-west-1", "ap-southeast-1")[n % 3],
                            "tax_code": None,
                        }
                        for n in range(lines)
                    ],
                }
            ).encode()
        )
    out: list[float] = []
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:
        for i, body in enumerate(bodies):
            t0 = time.perf_counter()
            response = client.post(
                "/v1/documents", content=body, headers={"content-type": "application/json"}
            )
            response.read()
            seconds = time.perf_counter() - t0
            response.raise_for_status()
            if i >= warmup:
                out.append(seconds)
    return out


#: An ``invoice.issued`` payload of the usual size (about 1.5 KB), for bare outbox rows.
_PAYLOAD = {
    "schema_version": 1,
    "invoice_id": "00000000-0000-0000-0000-000000000000",
    "invoice_number": "INV-2026-09-000001",
    "revision": 1,
    "customer_id": "bench",
    "customer_name": "Customer bench",
    "email": "billing+bench@customers.invalid",
    "billing_period": "2026-09",
    "currency": "USD",
    "line_count": 250,
    "subtotal": "123.45",
    "tax_total": "8.02",
    "total": "131.47",
    "taxes": [{"tax_code": "US-WA-STD", "rate": "0.065", "taxable": "123.45", "tax": "8.02"}],
    "largest_lines": [
        {
            "event_id": f"u-bench-{n}",
            "description": "$0.008 per used Application load balancer capacity unit-hour",
            "amount": "1.23456789",
        }
        for n in range(5)
    ],
    "issued_at": "2026-10-01T00:00:00Z",
    "supersedes_invoice_id": None,
    "source": [{"topic": "billing.account-events.v1", "partition": 3, "first": 0, "last": 250}],
}


@dataclass(frozen=True)
class RelayResult:
    rows: int
    rate: float
    samples: list[float]
    first_latency_s: list[float]


def debezium_relay(p: Pipeline, *, rows: int, repeats: int, warmup: int) -> RelayResult:
    """Debezium relaying bare outbox rows: insert ``rows`` rows into the sandbox's
    ``outbox`` in one transaction (routed to a topic of their own, so no email
    sender sees them) and time commit → the last of them consumed from the topic;
    rows/s, median of ``repeats`` after ``warmup`` batches of 10 rows."""
    # an outbox row may route only to an invoices topic (migration 0015): a prefixed one
    topic = INVOICES.with_prefix(p.settings.kafka.topic_prefix + "bench-outbox-relay.").name
    create_topic(p.settings, topic)
    counter = TopicCounter(p.settings, topic)
    total = 0
    payload = json.dumps(_PAYLOAD)

    def insert(count: int) -> float:
        with psycopg.connect(p.settings.postgres.dsn("owner")) as conn:
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, "
                    "ce_time, document_id) VALUES (%s, %s, %s, 'invoice.issued', %s, "
                    "'/benchmarks', '2026-10-01T00:00:00Z', %s)",
                    [
                        (uuid.uuid4(), topic, f"bench-{n % 997}", payload, uuid.uuid4())
                        for n in range(count)
                    ],
                )
            conn.commit()
        return time.time()

    samples: list[float] = []
    firsts: list[float] = []
    try:
        for _ in range(warmup):
            insert(10)
            total += 10
            counter.wait_for(total, 120)
        for _ in range(repeats):
            committed = insert(rows)
            first_seen = counter.wait_for(total + 1, 120)
            firsts.append(first_seen - committed)
            total += rows
            last = counter.wait_for(total, 300)
            samples.append(rows / max(1e-6, last - committed))
    finally:
        counter.close()
    return RelayResult(rows, median(samples) if samples else 0.0, samples, firsts)
