"""Outages of the shared services, longer than a restart (issue 10 deliverable 6).

1. PostgreSQL down mid-ingest (usage still being read) and mid-close (invoice jobs
   waiting on the tax service): the workers keep their partitions — **the group
   does not churn**: no fence claim is logged from the start of the outage to the
   end of the run — and once PostgreSQL is back every invariant of DESIGN §3 holds.
2. The broker down mid-ingest: the workers survive it and every invariant holds
   once it is back.
3. Redis down during a replay: the replay refuses before it reads or writes
   (``LeaseUnavailable``), nothing is recorded for it; once Redis is back the same
   replay completes and finds every customer unchanged. (Redis down during a close
   is ``test_service_faults.test_redis_down_mid_run``.)

**Outage length.** The issue asks for 2 minutes. The default here is
``CHAOS_OUTAGE_S=30`` seconds so that the tier stays within CI's time budget (each
scenario also needs the stack's restart and the settling afterwards); 30 s is
already half of ``max.poll.interval.ms`` (60 s) and 15 of the poll thread's 2 s
database waits, so a poll thread held by the database would churn the group
within it. ``CHAOS_OUTAGE_S=120`` runs the issue's 2 minutes.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

import pytest

from streams.adapters.lease import LeaseUnavailable
from streams.bootstrap import replay_period
from streams.importers import KafkaUnavailable
from streams.replay.report import Mode
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
from tests.support.pipeline import Pipeline

OUTAGE_S = float(os.environ.get("CHAOS_OUTAGE_S", "30"))
FAST_TAX_S = 0.02


def _no_churn_since(p: Pipeline, w: Workload, since: datetime) -> None:
    """No fence claim logged at or after ``since``: no partition changed hands."""
    late = [c for c in claims(p) if c.logged_at >= since]
    assert not late, w.msg(
        f"the group churned: {len(late)} claims after the outage began, e.g. {late[:3]}\n"
        f"{p.worker_logs()}"
    )


def _outage(settings: Settings, service: str, w: Workload) -> tuple[datetime, float]:
    """Stop ``service`` for OUTAGE_S seconds (restored whatever happens); returns when the
    outage began (UTC, as the worker logs write it) and how long it lasted."""
    with shared_service_fault(settings) as stack:
        began = datetime.now(UTC)
        started = time.monotonic()
        stack.supervisor.stop(service)
        time.sleep(OUTAGE_S)
        stack.supervisor.start(service)
        took = time.monotonic() - started
    print(f"{service} down for {took:.1f}s (seed {w.seed})")
    return began, took


@pytest.mark.timeout(300 + 2 * OUTAGE_S)
def test_postgres_down_mid_ingest(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=14, events_per_customer=6)
    workers = p.workers.start("invoicing", 3)
    p.workers.start("email", 1)
    wait_group_stable(p, w, workers, timeout_s=90)
    produce_workload(p, w)
    wait_until(
        w, "some usage stored", lambda: progress(p, w)["usage_lines"] > 0, 60,
        interval_s=0.05, detail=p.worker_logs,
    )  # fmt: skip
    began, took = _outage(settings, "postgres", w)
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
    w = generate_workload(chaos_seed, p.unique, rerun, customers=14, events_per_customer=6)
    workers = p.workers.start("invoicing", 3)
    p.workers.start("email", 1)
    wait_group_stable(p, w, workers, timeout_s=90)
    produce_workload(p, w)
    wait_until(
        w, "some usage stored", lambda: progress(p, w)["usage_lines"] > 0, 60,
        interval_s=0.05, detail=p.worker_logs,
    )  # fmt: skip
    _began, took = _outage(settings, "kafka", w)
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
