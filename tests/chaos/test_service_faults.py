"""Chaos scenarios on the shared services and the tax service (docs/design.md, invariants 1-6).

3. The broker stopped and restarted mid-run; PostgreSQL restarted mid-run; Redis
   stopped mid-run — close-period refuses cleanly (nothing emitted), the invoice
   jobs already running continue (the tax cache treats Redis down as a miss), and
   once Redis is back a rerun of close-period finishes.
4. Kafka Connect SIGKILLed right after outbox inserts, then restarted: the
   connector resumes from its offsets; duplicates may appear on the invoices topic
   and are counted, and the email sender still sends exactly one email per invoice.
5. The tax service answering 50 % errors and some timeouts: every invoice is issued
   eventually and tax is never applied twice.

Every fault of a shared service runs inside :func:`shared_service_fault`, which
restores the whole stack afterwards, whatever happened.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from streams.adapters.lease import LeaseUnavailable
from streams.bootstrap import run_close_period
from streams.settings import Settings
from tests.chaos.harness import (
    PARTITIONS,
    assert_tax_once,
    check_invariants,
    close_all,
    first_taxed_customer,
    generate_workload,
    shared_service_fault,
    start_run,
    wait_connector_running,
    wait_settled,
    wait_until,
    write_report,
)
from tests.support.pipeline import Pipeline

FAST_TAX_S = 0.02
#: Seconds a restarted service stays down (the longer outages: test_outages.py).
RESTART_GAP_S = 2.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("service", ["kafka", "postgres"])
def test_service_restarted_mid_run(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str, service: str
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=14, events_per_customer=5)
    start_run(p, w)

    p.tax.admin.configure(base_latency_s=1.0)
    close_all(p, w)
    first_taxed_customer(p, w)  # invoice jobs are running
    with shared_service_fault(settings) as stack:
        started = time.monotonic()
        stack.supervisor.stop(service)
        time.sleep(RESTART_GAP_S)  # the fault: the service stays down this long
        stack.supervisor.start(service)
        print(f"{service} stopped and started in {time.monotonic() - started:.1f}s")
    p.tax.admin.configure(base_latency_s=FAST_TAX_S)
    wait_connector_running(p, w, timeout_s=120)
    took = wait_settled(p, w, timeout_s=180)
    # PostgreSQL down between the email sender's send and its mark: one resend under
    # the same Message-ID is the documented worst case (docs/design.md "Email").
    report = check_invariants(p, w, max_email_copies=2 if service == "postgres" else 1)
    write_report(w, f"3 {service} restarted mid-run (settled {took:.0f}s after)", report)
    assert_tax_once(p, w)


@pytest.mark.timeout(300)
def test_redis_down_mid_run(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    first, second = "2025-02", "2025-03"
    w = generate_workload(
        chaos_seed, p.unique, rerun, customers=12, events_per_customer=6, periods=(first, second)
    )
    workers, _ = start_run(p, w)

    p.tax.admin.configure(base_latency_s=1.0)
    run_close_period(first, p.settings, progress=False)
    first_taxed_customer(p, w)
    first_keys = {k for k in w.expected_keys() if k[1] == first}
    with shared_service_fault(settings) as stack:
        stack.supervisor.stop("redis")
        # close-period refuses before it emits anything (CLI exit 3) ...
        with pytest.raises(LeaseUnavailable):
            run_close_period(second, p.settings, progress=False)
        with p.connect() as conn:
            requested = conn.execute(
                "SELECT count(*) FROM close_requests WHERE billing_period = %s", (second,)
            ).fetchone()
        assert requested == (0,), w.msg(
            f"close-period wrote {requested} requests without its lease"
        )

        # ... while the invoice jobs of the first period finish (tax cache down = a miss).
        def first_period_issued() -> bool:
            with p.connect() as conn:
                rows = conn.execute(
                    "SELECT customer_id, billing_period FROM invoices WHERE status = 'issued'"
                ).fetchall()
            return first_keys <= {(r[0], r[1]) for r in rows}

        took = wait_until(
            w, f"every {first} invoice issued with Redis down", first_period_issued, 90,
            detail=p.worker_logs,
        )  # fmt: skip
        print(f"redis down: {len(first_keys)} invoices of {first} issued in {took:.1f}s")
        with p.connect() as conn:
            closed = conn.execute(
                "SELECT count(*) FROM period_closes WHERE billing_period = %s", (second,)
            ).fetchone()
        assert closed == (0,), w.msg(f"{second} was closed without a close-period run")
    # Redis is back: the rerun finishes.
    p.tax.admin.configure(base_latency_s=FAST_TAX_S)
    summary = run_close_period(second, p.settings, progress=False)
    assert summary.ok, w.msg(str(summary.to_dict()))
    wait_settled(p, w, timeout_s=120)
    report = check_invariants(p, w)
    write_report(w, "3 redis down mid-run", report)
    assert_tax_once(p, w)
    cache_errors = sum(t.count("tax cache") for t in (x.log.read_text() for x in workers))
    print(f"tax cache error log lines while Redis was down: {cache_errors}")


@pytest.mark.timeout(300)
def test_connect_killed_after_outbox_inserts(
    settings: Settings, pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=18, events_per_customer=4)
    start_run(p, w)

    # Watch the invoices topic from its end: Connect is killed the moment it has just
    # published a record, so that its source offsets (flushed every second) most likely
    # lag behind what it published and it publishes some again after the restart.
    watcher = Consumer(
        {
            "bootstrap.servers": p.settings.kafka.bootstrap_servers,
            "group.id": f"chaos-watch-{p.unique}",
            "enable.auto.commit": False,
        }
    )
    watcher.assign([TopicPartition(p.invoices_topic, i, OFFSET_END) for i in range(PARTITIONS)])
    watcher.poll(1.0)
    p.tax.admin.configure(base_latency_s=0.5)
    close_all(p, w)
    target = max(2, len(w.expected_keys()) // 3)

    def outbox_rows() -> int:
        with p.connect() as conn:
            row = conn.execute("SELECT count(*) FROM outbox").fetchone()
        return int(row[0]) if row else 0

    try:
        wait_until(w, f"{target} outbox rows", lambda: outbox_rows() >= target, 60, interval_s=0.05)
        wait_until(
            w, "a record published by Connect",
            lambda: (m := watcher.poll(0.05)) is not None and m.error() is None, 60, interval_s=0,
        )  # fmt: skip
    finally:
        watcher.close()
    with shared_service_fault(settings) as stack:
        stack.supervisor.signal("connect", "KILL")
        killed_at = outbox_rows()
        time.sleep(2)
    print(f"connect SIGKILLed with {killed_at} outbox rows written")
    p.tax.admin.configure(base_latency_s=FAST_TAX_S)
    wait_connector_running(p, w, timeout_s=120)
    took = wait_settled(p, w, timeout_s=180)
    report = check_invariants(p, w)
    write_report(w, f"4 connect SIGKILLed (settled {took:.0f}s after)", report)
    with p.connect() as conn:
        duplicates = conn.execute(
            "SELECT count(*) FROM email_deliveries WHERE status = 'sent' AND attempts > 1"
        ).fetchone()
    print(
        f"invoice.issued duplicates on the topic: {report.topic_duplicates}; resent emails {duplicates}"
    )
    # The scenario is only a test if the crash did replay records (it did in every run
    # measured: 3-10 duplicates); each one reached the email sender and was absorbed.
    assert report.topic_duplicates >= 1, w.msg(
        "Connect's restart published no duplicate: the fault missed its window"
    )
    assert report.email_duplicates_absorbed >= report.topic_duplicates, w.msg(report.summary())
    assert duplicates == (0,), w.msg(f"emails sent twice: {duplicates}")


@pytest.mark.timeout(300)
def test_tax_service_errors_and_timeouts(pipeline: Pipeline, chaos_seed: int, rerun: str) -> None:
    p = pipeline
    w = generate_workload(chaos_seed, p.unique, rerun, customers=14, events_per_customer=5)
    start_run(
        p,
        w,
        extra_env={"INVOICING_TAX__READ_TIMEOUT_S": "1.5", "INVOICING_TAX__BACKOFF_MAX_S": "0.5"},
    )

    # Seeded draws: half the requests fail (503), 15 % time out (processed, answered after
    # the client gave up); and the next two that do not fail time out, whatever the draws.
    p.tax.admin.configure(
        error_rate=0.5,
        timeout_rate=0.15,
        timeout_next=2,
        timeout_latency_s=3.0,
        base_latency_s=0.05,
        seed=chaos_seed,
    )
    close_all(p, w)
    took = wait_settled(p, w, timeout_s=180)
    report = check_invariants(p, w)
    outcomes = assert_tax_once(p, w)
    write_report(w, f"5 tax 50% errors + 15% timeouts (settled in {took:.0f}s)", report)
    print(f"tax requests by outcome: {outcomes}")
    assert outcomes.get("error", 0) >= 1 and outcomes.get("timeout", 0) >= 1, w.msg(str(outcomes))
