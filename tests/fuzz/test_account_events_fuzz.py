"""Fuzz: 10,000 generated records through real invoicing workers, close-period and a replay.

Generated records (tests/fuzz/records.py: valid, mutated valid, random bytes, wrong
types, huge and very precise numbers, control characters, invalid UTF-8, oversize
values, deep JSON, missing or wrong headers, keys that disagree with the payload)
are interleaved with the records of clean customers on every partition, then read
by two invoicing worker processes; then ``close-period`` scans the topic and a
replay (dry run) re-reads it. Asserted (docs/design.md, invariants 3 and 5):

* no worker process dies;
* every partition's lag reaches zero (bad input never stalls a partition);
* every clean customer is invoiced, with the exact subtotal of its usage;
* every record the codec refuses is on the dead-letter topic exactly once, with a
  reason, its source coordinates and its original key and value; no record is
  dead-lettered twice, and no clean record at all;
* ``close-period`` completes (one bad record never aborts a period's close) and
  closes every clean customer; the replay completes and finds every clean
  customer unchanged.
"""

from __future__ import annotations

import os
import random
import time

import pytest

from streams.apps.invoicing.worker import ACCOUNT_EVENT_TYPES
from streams.apps.replay.report import Mode
from streams.bootstrap import replay_period, run_close_period
from streams.core.domain.money import round_money
from tests.fuzz.harness import (
    MIN_ACCEPTED_SHARE,
    accepted,
    check_dead_letters,
    check_must_refuse,
    clean_customers,
    clean_records,
    dead_letters,
    is_stored,
    partition_lags,
    produce,
    refused,
    stored_account_events,
    wait_until,
)
from tests.fuzz.records import generate
from tests.support.pipeline import Pipeline

PERIOD = "2025-03"
#: Generated records per run (at least 10,000 per CI run:
#: docs/decisions/0094-independent-oracles.md).
RECORDS = int(os.environ.get("FUZZ_RECORDS", "10000"))


@pytest.mark.timeout(420)
def test_generated_records_never_stall_or_crash_worker_close_or_replay(
    pipeline: Pipeline, fuzz_seed: int
) -> None:
    p = pipeline
    rng = random.Random(fuzz_seed)
    generated = generate(fuzz_seed, RECORDS)
    clean = clean_customers(p.unique, per_partition=4, rng=rng)
    clean_recs = clean_records(clean, PERIOD)
    tagged = [(r, False) for r in generated] + [(r, True) for r in clean_recs]
    rng.shuffle(tagged)
    records = [r for r, _ in tagged]

    started = time.monotonic()
    coords = produce(p.settings.kafka, p.topic, records)
    produced_s = time.monotonic() - started
    bad = {
        at: record
        for at, (record, is_clean) in zip(coords, tagged, strict=True)
        if not is_clean and refused(record, ACCOUNT_EVENT_TYPES) is not None
    }
    clean_at = {at for at, (_r, is_clean) in zip(coords, tagged, strict=True) if is_clean}
    must = check_must_refuse(generated, ACCOUNT_EVENT_TYPES)
    accepted_at = {
        at: envelope
        for at, (record, is_clean) in zip(coords, tagged, strict=True)
        if not is_clean and (envelope := accepted(record, ACCOUNT_EVENT_TYPES)) is not None
    }
    assert len(accepted_at) >= MIN_ACCEPTED_SHARE * len(generated), (
        f"only {len(accepted_at)} of {len(generated)} generated records accepted by the codec"
    )
    print(f"fuzz: must be refused, by reason {must}; accepted {len(accepted_at)}")
    print(
        f"fuzz: produced {len(records)} records ({len(generated)} generated, {len(bad)} refused "
        f"by the codec; {len(clean_recs)} clean of {len(clean)} customers) in {produced_s:.1f}s"
    )

    group = p.settings.worker.invoicing_group
    workers = p.workers.start("invoicing", 2)
    p.workers.start("email", 1)

    def alive() -> None:
        dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
        assert not dead, f"workers died: {dead}\n{p.worker_logs()}"

    def no_lag() -> bool:
        alive()
        return not any(partition_lags(p.settings.kafka, group, p.topic).values())

    def detail() -> str:
        return f"lags {partition_lags(p.settings.kafka, group, p.topic)}\n{p.worker_logs()}"

    ingest_s = wait_until("every partition read to its end", no_lag, 240, detail)
    print(
        f"fuzz: {len(records)} records read by {len(workers)} workers in {ingest_s:.1f}s "
        f"({len(records) / max(ingest_s, 1e-9):.0f} records/s, from start-up)"
    )

    summary = run_close_period(PERIOD, p.settings, progress=False)
    assert summary.ok, summary.to_dict()
    missing = {c.customer_id for c in clean} - set(summary.customers)
    assert not missing, f"close-period did not close clean customers {sorted(missing)[:5]}"
    print(
        f"fuzz: close-period scanned {summary.scanned_records} records "
        f"({summary.undecodable_records} undecodable), closed {len(summary.customers)} customers"
    )

    wanted = {c.customer_id: round_money(c.exact, "USD") for c in clean}

    def subtotals() -> dict[str, object]:
        with p.connect() as conn:
            rows = conn.execute(
                "SELECT customer_id, subtotal FROM invoices WHERE status = 'issued' "
                "AND billing_period = %s AND customer_id = ANY(%s)",
                (PERIOD, list(wanted)),
            ).fetchall()
        return {r[0]: r[1] for r in rows}

    def invoiced() -> bool:
        alive()
        return len(subtotals()) == len(wanted)

    wait_until(
        "every clean customer invoiced",
        invoiced,
        180,
        lambda: f"{len(subtotals())}/{len(wanted)} invoiced\n{p.worker_logs()}",
    )
    assert subtotals() == wanted
    wait_until("no lag after the close", no_lag, 120, detail)

    letters = dead_letters(p.settings, p.dlq_topic)
    kinds = check_dead_letters(letters, p.topic, bad, clean_at)
    print(f"fuzz: dead letters by kind {kinds}")
    # Every accepted record is stored (by its event id) or dead-lettered: none dropped.
    dead_at = {letter.coords for letter in letters}
    stored = stored_account_events(p.settings)
    dropped = [
        (at, env.data.event_type, env.id)
        for at, env in accepted_at.items()
        if at not in dead_at and not is_stored(env, stored)
    ]
    assert not dropped, (
        f"{len(dropped)} accepted records neither stored nor dead-lettered, e.g. {dropped[:5]}"
    )
    assert kinds.get("unwritable", 0) == 0, (
        "records the contract accepted but PostgreSQL refused: the contract misses a bound"
    )

    report = replay_period(PERIOD, p.settings, mode=Mode.DRY_RUN, progress=False)
    outcomes = {o.customer_id: o.outcome for o in report.outcomes}
    not_unchanged = {c: outcomes.get(c) for c in wanted if outcomes.get(c) != "unchanged"}
    assert not not_unchanged, f"replay found clean customers changed: {not_unchanged}"
    print(
        f"fuzz: replay re-read {report.events_read} records ({len(report.invalid)} invalid) "
        f"in {report.read_s:.1f}s; {len(report.outcomes)} customers compared"
    )
    alive()
