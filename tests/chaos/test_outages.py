"""Outages of the shared services, longer than a restart (docs/design.md "Invariants").

1. PostgreSQL down mid-ingest (usage still being read) and mid-close (invoice jobs
   waiting on the tax service): the workers keep their partitions — **the group does not churn**: no
   fence claim is logged from the start of the outage to the end of the run — and once PostgreSQL is
   back every invariant of docs/design.md "Invariants" holds.
2. The broker down mid-ingest: the workers survive it and every invariant holds
   once it is back.
3. Redis down during a replay: the replay refuses before it reads or writes
   (``LeaseUnavailable``), nothing is recorded for it; once Redis is back the same
   replay completes and finds every customer unchanged.
4. Redis down during a close, while close-period holds its lease, half-way through
   the customers (close-period's chunk is set to half of them): the lease can no longer
   be renewed, so after one TTL the run stops before its next chunk of customers
   (``CloseAborted``, lease lost) having flushed the markers of the chunk it had
   committed; a rerun during the outage refuses before it
   writes (``LeaseUnavailable``); once Redis is back a rerun closes exactly the
   remaining customers under a higher fencing number (the first half "already
   requested"), every customer has exactly one ``close_requests`` row, and every
   invariant holds. The lease TTL is shortened to ``CLOSE_LEASE_TTL_S`` so that the
   loss falls inside the outage (production's 30 s TTL only moves it). (Redis down
   *before* a close starts is ``test_service_faults.test_redis_down_mid_run``.)

**Outage length.** The issue asks for 2 minutes. The default here is
``CHAOS_OUTAGE_S=10`` seconds so that the tier stays within CI's time budget (each
scenario also needs the stack's restart and the settling afterwards). The sandbox's
``max.poll.interval.ms`` is twice the outage (:data:`MAX_POLL_INTERVAL_MS`, at most
production's 60 s), so the outage is half of it, as the 30 s outages were of 60 s
before: a poll thread held by the database for the outage would churn the group
within it. ``CHAOS_OUTAGE_S=120`` runs the issue's 2 minutes (against the 60 s).

**Mid-ingest.** The two mid-ingest scenarios store one record per poll batch
(``INVOICING_WORKER__BATCH_SIZE=1``, :data:`INGEST_EVENTS` usage events) so that
ingest lasts seconds, and assert that fewer usage lines than produced were stored
when the outage began (the count read right before the service is stopped).

**Measured with ``CHAOS_OUTAGE_S=120``** (2026-12-01, the whole module once on the
local stack, 2 shared cores; 5 passed in 726 s). *Down* is from the stop to the
return of the service's restart (the restart included, hence more than 120 s);
*settled* is :func:`~tests.chaos.harness.wait_settled`, started once the service
is back and the scenario's follow-up is done (the connector running, and the close
or its rerun accepted), until every invoice is issued and emailed and neither group
has lag. Every scenario ended with 0 dead letters, 0 duplicate ``invoice.issued``
records and one email per invoice; the two PostgreSQL scenarios (where it is
asserted) logged no fence claim after the outage began. The broker scenario's
close-period was refused once right after the restart (``KafkaUnavailable``) and
accepted on the next try.

====================================  ======  =========  ========  ======
scenario                              down s  settled s  invoices  test s
====================================  ======  =========  ========  ======
PostgreSQL down mid-ingest            132.8   4          14        151
PostgreSQL down mid-close             128.8   12         14        156
broker down mid-ingest (1 refusal)    129.5   10         14        185
Redis down during a replay            (a)     (a)        10        27
Redis down during a close             122.1   1 (b)      14        145
====================================  ======  =========  ========  ======

(a) Redis is down only while the refused replay is tried; the scenario does not
use ``CHAOS_OUTAGE_S``. (b) The close stopped 1.6 s in, after 7 of the 14
customers; settled is counted from the rerun after Redis came back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Producer

from streams import bootstrap
from streams.adapters.lease import LeaseUnavailable
from streams.apps.importers import KafkaUnavailable
from streams.apps.importers import close_period as close_period_module
from streams.apps.importers.close_period import CloseAborted, close_period
from streams.apps.replay.report import Mode
from streams.bootstrap import replay_period, run_close_period
from streams.settings import Settings
from tests.chaos.harness import (
    Workload,
    check_invariants,
    claims,
    close_all,
    first_taxed_customer,
    generate_workload,
    produce_workload,
    progress,
    shared_service_fault,
    start_run,
    wait_connector_running,
    wait_group_stable,
    wait_settled,
    wait_until,
    write_report,
)
from tests.support.pipeline import Pipeline, isolated_pipeline

OUTAGE_S = float(os.environ.get("CHAOS_OUTAGE_S", "10"))
#: The sandbox's max.poll.interval.ms: twice the outage, at most production's 60 s.
MAX_POLL_INTERVAL_MS = int(min(60.0, 2 * OUTAGE_S) * 1000)
#: Usage events per customer of the mid-ingest scenarios (14 customers), one per batch.
INGEST_EVENTS = 20
ONE_RECORD_PER_BATCH = {"INVOICING_WORKER__BATCH_SIZE": "1"}
FAST_TAX_S = 0.02
#: close-period's lease TTL in the "Redis down during a close" scenario (seconds).
CLOSE_LEASE_TTL_S = 3.0


def _no_churn_since(p: Pipeline, w: Workload, since: datetime) -> None:
    """No fence claim logged at or after ``since``: no partition changed hands."""
    late = [c for c in claims(p) if c.logged_at >= since]
    assert not late, w.msg(
        f"the group churned: {len(late)} claims after the outage began, e.g. {late[:3]}\n"
        f"{p.worker_logs()}"
    )


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    """The sandbox of these scenarios: max.poll.interval.ms twice the outage."""
    with isolated_pipeline(
        settings, unique, tmp_path, max_poll_interval_ms=MAX_POLL_INTERVAL_MS
    ) as p:
        yield p


def _outage(
    settings: Settings,
    service: str,
    w: Workload,
    *,
    mid_ingest: Pipeline | None = None,
) -> tuple[datetime, float]:
    """Stop ``service`` for OUTAGE_S seconds (restored whatever happens); returns when the
    outage began (UTC, as the worker logs write it) and how long it lasted. With
    ``mid_ingest``, first asserts that its ingest is not finished (fewer usage lines than
    the workload's events, read right before the stop)."""
    with shared_service_fault(settings) as stack:

        def assert_mid_ingest(when: str) -> None:
            assert mid_ingest is not None
            stored = progress(mid_ingest, w)["usage_lines"]
            assert stored < len(w.usage), w.msg(
                f"ingest had finished {when} the outage: {stored} of {len(w.usage)} stored"
            )
            print(f"{service} outage {when}: {stored} of {len(w.usage)} usage lines stored")

        if mid_ingest is not None:
            assert_mid_ingest("before")
        began = datetime.now(UTC)
        started = time.monotonic()
        stack.supervisor.stop(service)
        time.sleep(OUTAGE_S)  # the fault itself: the service stays down this long
        stack.supervisor.start(service)
        took = time.monotonic() - started
    print(f"{service} down for {took:.1f}s (seed {w.seed})")
    return began, took


@pytest.mark.timeout(300 + 2 * OUTAGE_S)
def test_postgres_down_mid_ingest(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(
        chaos_seed, p.unique, rerun, customers=14, events_per_customer=INGEST_EVENTS
    )
    workers = p.workers.start("invoicing", 3, extra_env=ONE_RECORD_PER_BATCH)
    p.workers.start("email", 1)
    wait_group_stable(p, w, workers, timeout_s=90)
    produce_workload(p, w)
    wait_until(
        w, "some usage stored", lambda: progress(p, w)["usage_lines"] > 0, 60,
        interval_s=0.02, detail=p.worker_logs,
    )  # fmt: skip
    began, took = _outage(settings, "postgres", w, mid_ingest=p)
    wait_connector_running(p, w, timeout_s=120)
    close_all(p, w)
    settled = wait_settled(p, w, timeout_s=180)
    _no_churn_since(p, w, began)
    report = check_invariants(p, w, max_email_copies=2)
    write_report(
        w, f"6 postgres down {took:.0f}s mid-ingest (settled {settled:.0f}s after)", report
    )


@pytest.mark.timeout(300 + 2 * OUTAGE_S)
def test_postgres_down_mid_close(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=14, events_per_customer=5)
    start_run(p, w)
    p.tax.admin.configure(base_latency_s=1.0)
    close_all(p, w)
    first_taxed_customer(p, w)  # invoice jobs are running
    began, took = _outage(settings, "postgres", w)
    p.tax.admin.configure(base_latency_s=FAST_TAX_S)
    wait_connector_running(p, w, timeout_s=120)
    settled = wait_settled(p, w, timeout_s=180)
    _no_churn_since(p, w, began)
    report = check_invariants(p, w, max_email_copies=2)
    write_report(w, f"6 postgres down {took:.0f}s mid-close (settled {settled:.0f}s after)", report)


@pytest.mark.timeout(300 + 2 * OUTAGE_S)
def test_broker_down_mid_ingest(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(
        chaos_seed, p.unique, rerun, customers=14, events_per_customer=INGEST_EVENTS
    )
    workers = p.workers.start("invoicing", 3, extra_env=ONE_RECORD_PER_BATCH)
    p.workers.start("email", 1)
    wait_group_stable(p, w, workers, timeout_s=90)
    produce_workload(p, w)
    wait_until(
        w, "some usage stored", lambda: progress(p, w)["usage_lines"] > 0, 60,
        interval_s=0.02, detail=p.worker_logs,
    )  # fmt: skip
    _began, took = _outage(settings, "kafka", w, mid_ingest=p)
    wait_connector_running(p, w, timeout_s=120)
    # Right after the broker's restart close-period may refuse (KafkaUnavailable:
    # partition leadership still settling) before it emits anything; the operator
    # runs it again, as here.
    refusals: list[str] = []

    def closed() -> bool:
        try:
            close_all(p, w)
        except KafkaUnavailable as exc:
            refusals.append(str(exc))
            return False
        return True

    wait_until(w, "close-period accepted after the broker restart", closed, 120, interval_s=3)
    print(f"close-period refused {len(refusals)} time(s) after the broker restart")
    settled = wait_settled(p, w, timeout_s=180)
    report = check_invariants(p, w)
    write_report(w, f"6 broker down {took:.0f}s mid-ingest (settled {settled:.0f}s after)", report)


@pytest.mark.timeout(300 + 2 * OUTAGE_S)
def test_redis_down_during_a_replay(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=10, events_per_customer=5)
    start_run(p, w)
    close_all(p, w)
    wait_settled(p, w, timeout_s=180)
    period = w.periods[0]
    with shared_service_fault(settings) as stack:
        stack.supervisor.stop("redis")
        with pytest.raises(LeaseUnavailable):
            replay_period(period, p.settings, mode=Mode.APPLY, progress=False)
        with p.connect() as conn:
            runs = conn.execute("SELECT count(*) FROM replay_runs").fetchone()
        assert runs == (0,), w.msg(f"a replay run was recorded without its lease: {runs}")
    report = replay_period(period, p.settings, mode=Mode.APPLY, progress=False)
    changed = {o.customer_id: o.outcome for o in report.outcomes if o.outcome != "unchanged"}
    assert not changed, w.msg(f"the replay after Redis came back changed customers: {changed}")
    invariants = check_invariants(p, w)
    write_report(w, "6 redis down during a replay", invariants)


class _StopAfterMarkers:
    """close-period's producer (a real one, delegated to) that calls ``stop`` once, right
    after the ``after``-th marker is produced, then blocks for ``hold_s`` (longer than
    the lease's TTL): the run is in the middle of its customers, holding its lease,
    when Redis goes away, and its next step is the next customer."""

    def __init__(
        self, inner: Producer, *, after: int, stop: Callable[[], None], hold_s: float
    ) -> None:
        self.inner = inner
        self.after = after
        self.stop = stop
        self.hold_s = hold_s
        self.produced = 0
        self.stopped_at: float | None = None

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.inner.produce(*args, **kwargs)
        self.produced += 1
        if self.produced == self.after:
            self.stopped_at = time.monotonic()
            self.stop()
            time.sleep(self.hold_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _close_requests(p: Pipeline, period: str) -> dict[str, int]:
    """customer → the fencing number of its ``close_requests`` row for ``period``."""
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, lease_fencing_token FROM close_requests WHERE billing_period = %s",
            (period,),
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


@pytest.mark.timeout(300 + 2 * OUTAGE_S)
def test_redis_down_during_a_close(
    settings: Settings,
    pipeline: Pipeline,
    chaos_seed: int,
    rerun: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=14, events_per_customer=5)
    start_run(p, w)
    period = w.periods[0]
    customers = sorted(w.customers)
    half = len(customers) // 2
    # close-period records its requests a chunk at a time: a chunk of half the customers,
    # so the outage falls between the two chunks
    monkeypatch.setattr(close_period_module, "CLOSE_BATCH", half)
    with shared_service_fault(settings) as stack:
        began = time.monotonic()
        hook = _StopAfterMarkers(
            bootstrap.producer(p.settings),
            after=half,
            stop=lambda: stack.supervisor.stop("redis"),
            hold_s=CLOSE_LEASE_TTL_S + 1.0,
        )
        pool = bootstrap.postgres_pool(
            p.settings, role="close", name="close-period", min_size=1, max_size=2
        )
        redis_conn = bootstrap.redis_client(p.settings)
        try:
            with pytest.raises(CloseAborted) as aborted:
                close_period(
                    period, p.settings, producer=cast(Producer, hook), redis_conn=redis_conn,
                    pool=pool, scan_consumer=lambda: bootstrap.scan_consumer(p.settings),
                    lease_ttl_s=CLOSE_LEASE_TTL_S, progress=False,
                )  # fmt: skip
        finally:
            pool.close()
            redis_conn.close()
        partial = aborted.value.summary
        assert "lost" in str(aborted.value), w.msg(f"aborted for another reason: {aborted.value}")
        assert partial.customers == tuple(customers), w.msg(f"customers {partial.customers}")
        assert (partial.newly_requested, partial.markers_produced) == (half, half), w.msg(
            f"the aborted run requested {partial.newly_requested} and delivered "
            f"{partial.markers_produced} markers; expected {half} of each"
        )
        first = _close_requests(p, period)
        assert first == dict.fromkeys(customers[:half], partial.fencing_token), w.msg(
            f"close requests after the abort: {first}"
        )
        # A rerun while Redis is still down refuses before it writes anything.
        with pytest.raises(LeaseUnavailable):
            run_close_period(period, p.settings, progress=False)
        assert _close_requests(p, period) == first, w.msg("a refused rerun wrote close requests")
        assert hook.stopped_at is not None
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - hook.stopped_at)))
        stack.supervisor.start("redis")
        took = time.monotonic() - hook.stopped_at
        aborted_after = hook.stopped_at - began
    print(f"redis down for {took:.1f}s, {aborted_after:.1f}s into the close (seed {w.seed})")

    summary = run_close_period(period, p.settings, progress=False)
    assert summary.ok, w.msg(f"the rerun after Redis came back: {summary.to_dict()}")
    assert (summary.newly_requested, summary.already_requested) == (
        len(customers) - half,
        half,
    ), w.msg(f"the rerun: {summary.to_dict()}")
    assert summary.fencing_token > partial.fencing_token
    requests = _close_requests(p, period)
    assert sorted(requests) == customers, w.msg(f"close requests: {requests}")
    assert requests == {
        **dict.fromkeys(customers[:half], partial.fencing_token),
        **dict.fromkeys(customers[half:], summary.fencing_token),
    }, w.msg(f"close requests (customer → fencing number): {requests}")
    settled = wait_settled(p, w, timeout_s=180)
    report = check_invariants(p, w)
    write_report(
        w, f"6 redis down {took:.0f}s during a close (settled {settled:.0f}s after)", report
    )
