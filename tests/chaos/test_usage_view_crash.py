"""The usage view killed with SIGKILL in the middle of the stream (docs/usage-api.md
"Guarantees and limits"; docs/decisions/0098-usage-view-state.md).

The view applies each event to its local tables and faust queues the changed keys'
changelog records in its producer; after ``kill -9`` the local RocksDB store can hold an
event whose changelog record was only queued, so an instance that rebuilds the partition
from the changelog could under-count. Two scenarios, on the real stack, while usage is
still being produced:

* ``fresh-store``: two instances, one killed mid-stream; after the close, a NEW instance with
  an empty local store replaces the survivor and rebuilds every partition from the changelog;
* ``standby``: two instances with ``INVOICING_VIEW__STANDBY_REPLICAS=1``; the standby takes
  over the killed instance's partitions.

Either way every customer's ``upcoming_invoice`` equals the issued invoice (subtotal, lines).

What this catches: a changed key not written to the changelog (a fresh instance, or the one
that takes over, never sees it), and a record applied twice or lost across the takeover (the
new owner resumes from the committed offset: what it re-reads must not count twice). The
killed instance never returns on its own store here.
"""

from __future__ import annotations

import functools
import random
import signal
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from streams.bootstrap import producer, run_close_period
from streams.core.domain.codec import encode
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded
from tests.support.pipeline import Pipeline
from tests.support.usage_view import start_view, usage_ok, wait_assigned, wait_until

PERIOD = "2024-09"
CUSTOMERS = 24
EVENTS_PER_CUSTOMER = 40
RATE_PER_S = 80.0


def _customer(customer: str) -> Envelope:
    return Envelope.wrap(
        CustomerUpserted(
            customer_id=customer, name=customer, email=f"{customer}@example.com", currency="USD"
        ),
        id=f"cust-{customer}",
        source="chaos",
    )


def _usage(customer: str, event_id: str, amount: Decimal) -> Envelope:
    return Envelope.wrap(
        UsageRecorded(
            customer_id=customer,
            billing_period=PERIOD,
            amount=amount,
            currency="USD",
            event_time=datetime(2024, 9, 5, 10, tzinfo=UTC),
        ),
        id=event_id,
        source="chaos",
    )


def _workload(seed: int, unique: str) -> tuple[list[str], list[Envelope]]:
    """The customers and their usage, interleaved; a few exact resends (same event id)."""
    rng = random.Random(seed)
    customers = [f"vc-{unique}-{i}" for i in range(CUSTOMERS)]
    usage = [
        _usage(c, f"u-{c}-{n}", Decimal(rng.randint(1, 99_999)) / 100)
        for c in customers
        for n in range(EVENTS_PER_CUSTOMER)
    ]
    rng.shuffle(usage)
    for envelope in rng.sample(usage, 20):
        usage.insert(rng.randrange(len(usage) + 1), envelope)
    return customers, usage


def _send(prod: Producer, topic: str, envelope: Envelope) -> None:
    rec = encode(envelope)
    prod.produce(topic, key=rec.key, value=rec.value, headers=rec.headers)  # type: ignore[arg-type]


class _SteadyProducer(threading.Thread):
    """Produces ``envelopes`` to the sandbox's topic at a steady rate."""

    def __init__(self, p: Pipeline, envelopes: list[Envelope]) -> None:
        super().__init__(daemon=True)
        self.p, self.envelopes = p, envelopes
        self.produced = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            prod = producer(self.p.settings)
            start = time.monotonic()
            for i, envelope in enumerate(self.envelopes):
                _send(prod, self.p.topic, envelope)
                prod.poll(0)
                self.produced = i + 1
                ahead = start + (i + 1) / RATE_PER_S - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            assert prod.flush(30) == 0
        except BaseException as exc:  # reported by the test
            self.error = exc


def _applied(port: int) -> float:
    """The instance's ``invoicing_usage_view_records_total{outcome="applied"}``; 0 if it
    does not answer."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("invoicing_usage_view_records_total{") and 'outcome="applied"' in line
    )


def _issued(p: Pipeline) -> dict[str, tuple[str, int]]:
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, subtotal, line_count FROM invoices"
            " WHERE status = 'issued' AND billing_period = %s",
            (PERIOD,),
        ).fetchall()
    return {r[0]: (str(r[1]), r[2]) for r in rows}


def _answers(port: int, customers: list[str]) -> dict[str, tuple[str, int]] | None:
    """Every customer's closed answer on ``port`` (subtotal, line count), or ``None``."""
    answers = {}
    for customer in customers:
        body = usage_ok(port, customer, PERIOD)
        if body is None or body["closed"] is None:
            return None
        upcoming: dict[str, Any] = body["upcoming_invoice"]
        answers[customer] = (upcoming["subtotal"], upcoming["line_count"])
    return answers


@pytest.mark.sandbox(connector=False, smtp=False)
@pytest.mark.parametrize("standby", [False, True], ids=["fresh-store", "standby"])
def test_view_killed_mid_stream_agrees_with_the_invoices(
    pipeline: Pipeline, chaos_seed: int, standby: bool
) -> None:
    p = pipeline
    customers, usage = _workload(chaos_seed, p.unique)
    prod = producer(p.settings)
    for c in customers:
        _send(prod, p.topic, _customer(c))
    assert prod.flush(30) == 0

    settings = {"INVOICING_VIEW__STANDBY_REPLICAS": "1"} if standby else {}
    (view_a, port_a), (view_b, port_b) = (
        start_view(p, settings=settings),
        start_view(p, settings=settings),
    )
    owned = wait_assigned(p, [port_a, port_b])
    feeder = _SteadyProducer(p, usage)
    feeder.start()

    # The victim: the first instance to have applied records (it owns partitions with data),
    # killed once it has applied some batches while the producer is far from done.
    def victim() -> tuple[int, float] | None:
        assert feeder.error is None, feeder.error
        counts = {port: _applied(port) for port in (port_a, port_b)}
        port, count = max(counts.items(), key=lambda kv: kv[1])
        return (port, count) if count >= 60 else None

    kill_port, applied_at_kill = wait_until("the victim applied some batches", victim, p, 60)
    killed, survivor, port_s = (
        (view_a, view_b, port_b) if kill_port == port_a else (view_b, view_a, port_a)
    )
    produced_at_kill = feeder.produced
    assert produced_at_kill < len(usage) * 0.8, (produced_at_kill, len(usage))
    assert owned[kill_port], owned
    killed.process.send_signal(signal.SIGKILL)
    killed.process.wait(10)
    print(
        f"killed :{kill_port} (partitions {owned[kill_port]}) after {applied_at_kill:.0f}"
        f" applied, {produced_at_kill}/{len(usage)} produced; standby={standby}"
    )

    feeder.join(120)
    assert not feeder.is_alive() and feeder.error is None, feeder.error
    wait_assigned(p, [port_s])
    p.workers.start("invoicing", 2)
    run_close_period(PERIOD, p.settings, progress=False)
    issued = wait_until(
        "every invoice issued",
        lambda: (lambda got: got if len(got) == len(customers) else None)(_issued(p)),
        p,
        180,
    )

    # The survivor (the standby in the second case) took over and agrees with the invoices.
    on_survivor = wait_until(
        "every customer closed on the survivor",
        functools.partial(_answers, port_s, customers),
        p,
        120,
    )
    assert on_survivor == issued

    if not standby:
        # A new instance with an empty local store rebuilds every partition from the
        # changelog topics once the survivor is gone.
        fresh_dir = p.workdir / "view-data-fresh"
        assert not fresh_dir.exists()
        _, port_c = start_view(p, settings={"INVOICING_VIEW__DATA_DIR": str(fresh_dir)})
        survivor.process.send_signal(signal.SIGTERM)
        assert survivor.process.wait(60) == 0, p.worker_logs()
        wait_assigned(p, [port_c])
        on_fresh = wait_until(
            "every customer closed on the fresh instance",
            functools.partial(_answers, port_c, customers),
            p,
            120,
        )
        assert on_fresh == issued
