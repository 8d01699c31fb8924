"""Close markers that follow one another on a partition run their invoice jobs at once
(``worker.markers_in_flight``), and the partition moves on only as far as their outcomes
allow (docs/architecture.md "Long jobs"), on the twins (tests/support/twins.py).

The rules pinned here: a run is only markers with no other record between them, of
distinct customers, at most ``markers_in_flight`` long; nothing after the run is stored
before all its jobs succeed; a job to retry stops the partition at its marker (the
markers before it are committed and not run again, those after it run again).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from streams.adapters.memory.store import tables
from streams.apps.invoicing import dispatch as dispatch_module
from streams.apps.invoicing.decoding import decode_run
from streams.apps.invoicing.jobs import JobContext, JobResult, Outcome
from streams.core.billing import fencing, rows
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    EventData,
    UsageRecorded,
)
from streams.core.domain.invoice import TaxedLine, TaxLine
from streams.settings import Settings
from tests.support.twins import PERIOD, Twins, drive, spin, subscribe


def twins_with(settings: Settings, markers_in_flight: int, max_jobs: int = 4) -> Twins:
    twins = Twins.create(settings)
    worker = twins.settings.worker.model_copy(
        update={"markers_in_flight": markers_in_flight, "max_jobs": max_jobs}
    )
    twins.settings = twins.settings.model_copy(update={"worker": worker})
    return twins


class CountingTax:
    """The in-memory tax service behind a gate that counts the calls waiting at it."""

    def __init__(self, twins: Twins) -> None:
        self.inner = twins.tax
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.waiting = 0
        self.most = 0

    def calculate(
        self,
        *,
        idempotency_key: str,
        customer_id: str,
        currency: str,
        lines: Sequence[TaxLine],
        commit: bool = True,
    ) -> list[TaxedLine]:
        with self.lock:
            self.waiting += 1
            self.most = max(self.most, self.waiting)
        try:
            assert self.release.wait(10), "the test never released the tax calls"
        finally:
            with self.lock:
                self.waiting -= 1
        return self.inner.calculate(
            idempotency_key=idempotency_key,
            customer_id=customer_id,
            currency=currency,
            lines=lines,
            commit=commit,
        )


def three_closes(twins: Twins) -> tuple[list[str], int, int]:
    """Three customers of partition 0 with usage, their three markers one after another,
    then one more usage record: (customers, first marker's offset, the last record's)."""
    customers = [twins.customer_on(0, prefix=p) for p in ("a", "b", "c")]
    for n, customer in enumerate(customers, 1):
        twins.customer(customer)
        twins.usage(customer, f"{n}.00")
    first = twins.close(customers[0]).offset()
    twins.close(customers[1])
    twins.close(customers[2])
    after = twins.usage(customers[0], "7.00", period="2026-02").offset()
    assert first is not None and after is not None
    return customers, first, after


def test_consecutive_markers_run_at_once_and_the_partition_moves_past_all_of_them(
    settings: Settings,
) -> None:
    twins = twins_with(settings, markers_in_flight=4)
    customers, first, after = three_closes(twins)
    tax = CountingTax(twins)
    worker = twins.worker(tax=tax)
    subscribe(worker)
    drive(worker, lambda: tax.waiting == 3, what="three tax calls of one partition at once")
    job = worker.partitions[0].job
    assert job is not None and [m.customer_id for m in job.markers] == customers
    spin(worker, 0.1)
    assert twins.committed().get(0) == first  # the usage before the run, no marker
    assert not any(r.billing_period == "2026-02" for r in twins.rows(tables.USAGE_LINES))
    tax.release.set()
    drive(worker, lambda: twins.committed().get(0) == after + 1, what="the partition going on")
    for n, customer in enumerate(customers, 1):
        (invoice,) = twins.invoices(customer)
        assert invoice.subtotal == Decimal(f"{n}.00")
    assert any(r.billing_period == "2026-02" for r in twins.rows(tables.USAGE_LINES))
    assert worker.stats["invoice_invoiced"] == 3
    worker.executor.shutdown()


def test_one_marker_in_flight_runs_them_one_after_another(settings: Settings) -> None:
    twins = twins_with(settings, markers_in_flight=1)
    customers, _first, after = three_closes(twins)
    tax = CountingTax(twins)
    tax.release.set()
    worker = twins.worker(tax=tax)
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(0) == after + 1, what="the partition going on")
    assert tax.most == 1
    assert all(len(twins.invoices(c)) == 1 for c in customers)
    worker.executor.shutdown()


def test_a_job_to_retry_stops_the_partition_at_its_marker(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    twins = twins_with(settings, markers_in_flight=4)
    customers, first, after = three_closes(twins)
    runs: list[tuple[str, bool]] = []  # (customer, whether the later usage was stored)

    def job(
        ctx: JobContext, marker: rows.CloseMarker, tok: fencing.FencingToken, cancel: Any
    ) -> JobResult:
        later = any(r.billing_period == "2026-02" for r in twins.rows(tables.USAGE_LINES))
        runs.append((marker.customer_id, later))
        if marker.customer_id == customers[1] and [c for c, _ in runs].count(customers[1]) == 1:
            return JobResult(marker, tok, Outcome.RETRY, "the tax service timed out (simulated)")
        return JobResult(marker, tok, Outcome.INVOICED, "", invoice_number="INV-1")

    monkeypatch.setattr(dispatch_module, "run_invoice_job", job)
    worker = twins.worker(retry_backoff_s=0.05)
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(0) == after + 1, what="the partition going on")
    a, b, c = customers
    assert sorted(runs[:3]) == sorted([(a, False), (b, False), (c, False)])
    # the first marker was final: committed, not run again; the two after it ran again
    assert sorted(runs[3:]) == sorted([(b, False), (c, False)]), runs
    assert worker.stats["invoice_retry"] == 1
    assert first + 1 <= twins.committed()[0]
    worker.executor.shutdown()


def _record(offset: int, data: EventData, event_id: str) -> rows.Record:
    enc = encode(Envelope.wrap(data, id=event_id, source="/t"))
    return rows.Record("t", 0, offset, enc.key, enc.value, list(enc.headers))


def _close(customer: str) -> BillingPeriodClosed:
    return BillingPeriodClosed(
        customer_id=customer, billing_period=PERIOD, closed_at=datetime(2026, 2, 1, tzinfo=UTC)
    )


def test_a_run_is_only_markers_of_distinct_customers_up_to_the_limit() -> None:
    token = fencing.FencingToken("g", "t", 0, 1, "m")
    customer = CustomerUpserted(customer_id="a", name="A", email="ap@a.example", currency="USD")
    usage = UsageRecorded(
        customer_id="a",
        billing_period=PERIOD,
        amount=Decimal("1"),
        currency="USD",
        event_time=datetime(2026, 1, 5, tzinfo=UTC),
    )

    def markers(records: list[rows.Record], limit: int) -> list[int]:
        run = decode_run(0, token, records, limit)
        return [msg.offset for msg, _envelope in run.markers]

    records = [
        _record(0, customer, "cu"),
        _record(1, _close("a"), "c1"),
        _record(2, _close("b"), "c2"),
        _record(3, _close("c"), "c3"),
        _record(4, usage, "u"),
        _record(5, _close("d"), "c4"),
    ]
    assert markers(records, 1) == [1]
    assert markers(records, 2) == [1, 2]
    assert markers(records, 10) == [1, 2, 3]  # a usage record ends the run
    assert decode_run(0, token, records, 10).next_offset == 1
    repeated = [*records[:3], _record(3, _close("a"), "c1-again"), _record(4, _close("e"), "c5")]
    assert markers(repeated, 10) == [1, 2]  # a customer already in the run ends it
    bad = rows.Record("t", 0, 3, b"c", b"not json", [("ce_type", b"billing_period.closed")])
    assert markers([*records[:3], bad, records[3]], 10) == [1, 2]  # so does a bad record
    assert markers(records[:1], 10) == []
    assert decode_run(0, token, records[1:], 10).suspects() == [1, 2, 3]
