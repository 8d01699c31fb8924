"""``python -m benchmarks.bench_usage_write``: the ways to write a batch of usage rows, A/B.

Measures, on the local stack's PostgreSQL (``source .ports.env``; a database of its
own, created and dropped here), the statements the invoicing worker can write a poll
batch with, the same generated rows for each, interleaved round by round so that a
noisy box slows all of them alike (figures printed, nothing asserted):

* ``json_to_recordset`` — the previous hot path: the canonical JSON text and payload
  hash built per row in Python, one ``INSERT … SELECT FROM json_to_recordset``
  (``store.usage.insert_usage``);
* ``copy+staging`` — the staged way (the hot path before ``copy direct``, and still
  the way of a batch with a stored id): the raw value's SHA-256, ``COPY`` into
  ``usage_staging`` and one ``DELETE … RETURNING`` → ``INSERT … ON CONFLICT``
  (``store.usage.insert_usage_rows(…, direct=False)``, migration 0010);
* ``copy direct`` — the hot path now: one ``COPY`` straight into ``usage_lines`` under
  a savepoint, for a batch with no id stored before;
* ``direct, 1 stored`` — its worst case: the same batch with a stored row (an exact
  duplicate) as its last, so the direct ``COPY`` fails at its end and the batch is
  written the staged way;
* ``unnest`` — the alternative without a table: one array parameter per column
  (binary), ``INSERT … SELECT FROM unnest(…) ON CONFLICT``.

Each round writes a fresh batch (new event ids) with each method in its own
transaction, committed. Prints rows/s per method (median of the rounds) and the
ratios to ``copy+staging``.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from benchmarks.product import Settings, base_settings
from streams.adapters.postgres.migrate import upgrade
from streams.core.billing import rows, store
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope, UsageRecorded
from streams.core.domain.fastcodec import decode_usage

_UNNEST = """
    INSERT INTO usage_lines (event_id, customer_id, billing_period, amount, currency, quantity,
        unit, consumed_quantity, consumed_unit, sku_id, description, region_id, charge_category,
        provider, event_time, payload_sha256, source_topic, source_partition, source_offset)
    SELECT DISTINCT ON (u.e) u.e, u.c, u.b, u.a::numeric, u.cur, u.q::numeric, u.un, u.cq::numeric,
           u.cu, u.s, u.d, u.r, u.cc, u.pr, u.t::timestamptz, u.h, u.tp, u.p, u.o
      FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
                  %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::text[],
                  %b::text[], %b::text[], %b::text[], %b::text[], %b::text[], %b::int4[],
                  %b::int8[]) WITH ORDINALITY
           AS u(e, c, b, a, cur, q, un, cq, cu, s, d, r, cc, pr, t, h, tp, p, o, n)
     ORDER BY u.e, u.n
    ON CONFLICT (event_id) DO NOTHING
    RETURNING event_id
"""


def _records(n: int, topic: str) -> list[tuple[rows.UsageRecord, rows.UsageRow]]:
    """``n`` usage records as both write paths take them (model and hot-path row)."""
    made = []
    start = datetime(2024, 9, 1, tzinfo=UTC)
    for i in range(n):
        data = UsageRecorded(
            customer_id=f"bench-{i % 200}",
            billing_period="2024-09",
            amount=Decimal(f"{(i % 997) + 1}.{i % 10000:04d}"),
            currency="USD",
            quantity=Decimal(i % 13 + 1),
            unit="Hours",
            sku_id=f"sku-{i % 50}",
            description="Compute instance, on-demand, general purpose (m5.large)",
            region_id="us-east-1",
            charge_category="Usage",
            event_time=start + timedelta(hours=i % 720),
            provider="AWS",
        )
        event_id = str(uuid.uuid4())
        record = encode(Envelope.wrap(data, id=event_id, source="/bench"))
        fast = decode_usage(record.key, record.value, record.headers)
        assert fast is not None
        source = rows.SourceCoordinates(topic, i % 12, i)
        digest = hashlib.sha256(record.value).hexdigest()
        made.append(
            (
                rows.UsageRecord(event_id, data, source),
                rows.UsageRow(event_id, fast.values, fast.event_time, digest, source),
            )
        )
    return made


def _unnest(conn: psycopg.Connection[Any], batch: list[rows.UsageRow]) -> None:
    columns: list[list[Any]] = [[] for _ in range(19)]
    for row in batch:
        values = (
            row.event_id,
            *row.values,
            row.payload_sha256,
            row.source.topic,
            row.source.partition,
            row.source.offset,
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    conn.execute(_UNNEST, columns).fetchall()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000, help="rows per batch (default 5000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds (default 7; 1 warm-up)")
    args = parser.parse_args(argv)
    settings = base_settings()
    name = f"bench_write_{uuid.uuid4().hex[:8]}"
    pg = settings.postgres.model_copy(update={"database": name})
    with psycopg.connect(settings.postgres.dsn("provisioner"), autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(pg.owner.user)
            )
        )
    try:
        upgrade(pg)
        return _run(settings.model_copy(update={"postgres": pg}), args.rows, args.rounds)
    finally:
        with psycopg.connect(settings.postgres.dsn("provisioner"), autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _run(settings: Settings, n: int, rounds: int) -> int:
    methods: dict[str, Callable[[psycopg.Connection[Any], list[Any]], Any]] = {
        "json_to_recordset": lambda conn, b: store.usage.insert_usage(conn, [r for r, _ in b]),
        "copy+staging": lambda conn, b: store.usage.insert_usage_rows(
            conn, [w for _, w in b], direct=False
        ),
        "copy direct": lambda conn, b: store.usage.insert_usage_rows(conn, [w for _, w in b]),
        "direct, 1 stored": lambda conn, b: store.usage.insert_usage_rows(
            conn, [*(w for _, w in b), seed[0][1]]
        ),
        "unnest": lambda conn, b: _unnest(conn, [w for _, w in b]),
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    # a stored row that "direct, 1 stored" sends again as its batch's last row: the
    # direct COPY fails at the end and the batch takes the staged way (the worst case)
    seed = _records(1, "bench.account-events")
    with psycopg.connect(settings.postgres.dsn("worker")) as conn:
        with conn.transaction():
            store.usage.insert_usage_rows(conn, [seed[0][1]])
        for round_no in range(rounds):
            order = list(methods) if round_no % 2 == 0 else list(reversed(methods))
            for name in order:
                batch = _records(n, "bench.account-events")
                if name == "json_to_recordset":  # its per-row work is part of the method
                    for record, _row in batch:
                        record.__dict__.pop("payload_sha256", None)
                        record.__dict__.pop("payload_json", None)
                started = time.perf_counter()
                with conn.transaction():
                    methods[name](conn, batch)
                if round_no:
                    times[name].append(time.perf_counter() - started)
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[:3]
    print(f"batch of {n} rows, {rounds - 1} rounds after a warm-up, load at end {' '.join(load)}")
    base = n / statistics.median(times["copy+staging"])
    for name, samples in times.items():
        rate = n / statistics.median(samples)
        print(f"  {name:18s} {rate:10,.0f} rows/s   ratio to copy+staging {rate / base:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
