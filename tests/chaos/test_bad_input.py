"""Chaos scenario 7: duplicates, shuffled order and poison records (docs/design.md, invariants 3 and
5).

The same usage event twice within one batch (resent right after itself) and
across batches (resent after the workers stored it); customers and usage events
in shuffled order (a customer's close marker still follows its usage on its
partition: close-period runs after the usage is produced); poison records —
invalid JSON, a float amount, no CloudEvents headers, an event id reused with
another payload — each dead-lettered with its reason and source coordinates, its
customer's period held, every other customer invoiced, and no partition stalled.
"""

from __future__ import annotations

import pytest

from streams.bootstrap import run_close_period
from tests.chaos.harness import (
    check_invariants,
    generate_workload,
    make_poison,
    produce,
    progress,
    usage_record,
    wait_settled,
    wait_until,
    workload_records,
    write_report,
)
from tests.support.pipeline import Pipeline

PERIODS = ("2025-02", "2025-03")


@pytest.mark.timeout(240)
def test_duplicates_shuffled_order_and_poison_records(
    pipeline: Pipeline, chaos_seed: int, rerun: str
) -> None:
    p = pipeline
    w = generate_workload(
        chaos_seed, p.unique, rerun, customers=16, events_per_customer=6, periods=PERIODS
    )
    victims = w.rng.sample(list(w.customers), 4)
    poison = make_poison(w, victims)
    records = workload_records(w, duplicate_share=0.2)
    # Poison anywhere in the stream, except the conflict: it must follow the event it conflicts with.
    for item in poison:
        if item.kind != "conflict":
            records.insert(w.rng.randrange(len(records) + 1), item.record)
    produce(p, w, records)
    p.workers.start("invoicing", 2)
    p.workers.start("email", 1)

    # Across batches: once every event is stored, send a sample of them again, and the conflict.
    wait_until(
        w,
        "every usage event stored",
        lambda: progress(p, w)["usage_lines"] == len(w.usage),
        90,
        detail=p.worker_logs,
    )
    again = [usage_record(e) for e in w.rng.sample(w.usage, 12)]
    again += [item.record for item in poison if item.kind == "conflict"]
    w.rng.shuffle(again)
    produce(p, w, again)
    w.duplicates_sent += 12

    for period in PERIODS:
        run_close_period(period, p.settings, progress=False)
    wait_settled(p, w, timeout_s=120)
    report = check_invariants(p, w)
    write_report(w, "7 duplicates, shuffled order, poison", report)
    assert report.dead_letters >= len(poison), w.msg(report.summary())
    assert report.refused_writes == 0 and report.claims_refused == 0, w.msg(report.summary())
