"""The records a poll delivered after a close marker are handed to the batch after the
marker's job succeeds, not fetched again; after any other outcome they are read again
from the marker, and nothing after a marker is stored before its job has succeeded
(docs/architecture.md "Long jobs").

In-process against the real stack: a fresh, migrated database and a Kafka topic of the
test's own prefix; the worker's consumer is assigned the partition by hand (no group),
so its loop runs with ``poll_once``. The invoice job is replaced by one that records
what was stored when it ran and fails the first close once (a transient failure).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, TopicPartition
from psycopg_pool import ConnectionPool

from streams.adapters.kafka import ensure_topics, make_producer, topic_specs
from streams.apps.invoicing import dispatch as dispatch_module
from streams.apps.invoicing.jobs import JobContext, JobResult, Outcome
from streams.apps.invoicing.partitions import PartitionState
from streams.core.billing import fencing, rows
from streams.core.domain.codec import encode
from streams.core.domain.events import BillingPeriodClosed, Envelope, EventData
from streams.settings import Settings
from tests.integration.test_review_defects import (
    PERIOD,
    customer,
    db,
    make_worker,
    pool,
    token_of,
    usage,
)

__all__ = ["db", "pool"]

pytestmark = pytest.mark.timeout(120)


def test_records_after_a_marker_wait_for_its_job_and_are_read_ahead_once_it_succeeds(
    db: Settings, pool: ConnectionPool[Any], unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kafka = db.kafka.model_copy(update={"topic_prefix": f"t{unique}."})
    ensure_topics(kafka, topic_specs(kafka))
    worker = make_worker(db, pool, unique)
    worker.retry_backoff_s = 0.2
    c1, c2, c3 = (f"c{i}-{unique}" for i in (1, 2, 3))

    def close(cust: str) -> BillingPeriodClosed:
        return BillingPeriodClosed(
            customer_id=cust, billing_period=PERIOD, closed_at=datetime(2025, 2, 1, tzinfo=UTC)
        )

    sequence: list[tuple[str, EventData]] = [
        ("cu1", customer(c1)),
        ("cu2", customer(c2)),
        ("cu3", customer(c3)),
        ("u1", usage(c1, "1.00")),
        ("close1", close(c1)),
        ("u2", usage(c2, "2.00")),
        ("close2", close(c2)),
        ("u3", usage(c3, "3.00")),
    ]
    producer = make_producer(db.kafka)
    for event_id, data in sequence:
        enc = encode(Envelope.wrap(data, id=f"{event_id}-{unique}", source="/t"))
        headers: list[tuple[str, str | bytes | None]] = list(enc.headers)
        producer.produce(worker.topic, key=enc.key, value=enc.value, headers=headers,
                         partition=0)  # fmt: skip
    assert producer.flush(10) == 0, "the records were not all produced"

    token = token_of(worker, 0)
    with pool.connection() as conn:
        fencing.claim(conn, token)
    worker.partitions[0] = PartitionState(0, token=token)
    cast(Consumer, worker.consumer).assign([TopicPartition(worker.topic, 0, 0)])

    def stored() -> set[str]:
        with pool.connection() as conn:
            found = conn.execute("SELECT event_id FROM usage_lines").fetchall()
            conn.rollback()
        return {str(row[0]).removesuffix(f"-{unique}") for row in found}

    runs: list[tuple[str, set[str]]] = []

    def fake_job(
        ctx: JobContext,
        marker: rows.CloseMarker,
        tok: fencing.FencingToken,
        cancel: threading.Event,
    ) -> JobResult:
        name = marker.event_id.removesuffix(f"-{unique}")
        runs.append((name, stored()))
        if name == "close1" and sum(1 for n, _ in runs if n == "close1") == 1:
            return JobResult(marker, tok, Outcome.RETRY, "the tax service timed out (simulated)")
        return JobResult(marker, tok, Outcome.INVOICED, "", invoice_number="INV-1")

    monkeypatch.setattr(dispatch_module, "run_invoice_job", fake_job)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        worker.poll_once(0.1)
        done = [n for n, _ in runs].count("close2") == 1 and "u3" in stored()
        if done and worker.partitions[0].job is None:
            break
    names = [n for n, _ in runs]
    assert names == ["close1", "close1", "close2"], f"jobs ran as {names}"
    # Nothing after a marker was stored before its job succeeded:
    assert all("u2" not in seen for n, seen in runs if n == "close1"), runs
    close2_saw = runs[2][1]
    assert "u2" in close2_saw and "u3" not in close2_saw, (
        f"close2's job saw {sorted(close2_saw)}: u2 must be stored before it and u3 after"
    )
    assert "u3" in stored(), "the record after the last marker was never stored"
    # The retried close1 read its later records again; its success read them ahead.
    assert worker.stats["records_read_ahead"] > 0, (
        "no record was handed over from the marker's poll: the read-ahead path never ran"
    )
    committed = worker.consumer.committed([TopicPartition(worker.topic, 0)], timeout=10)
    assert committed[0].offset == len(sequence), (
        f"committed offset {committed[0].offset}, expected {len(sequence)} (every record)"
    )
