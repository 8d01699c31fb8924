"""The invoicing worker's loop (streams/apps/invoicing/worker.py) on the twins: the in-memory
Kafka (its group coordinator, offsets, pause/resume), the in-memory database with the
twin stores, the in-memory tax service. No service; each test steps the loop itself
(:func:`tests.support.twins.drive`), except the shutdown test, which runs ``run()``.
"""

from __future__ import annotations

import re
import threading
import time
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from streams.adapters.kafka import group_metadata
from streams.adapters.memory import fencing as twin_fencing
from streams.adapters.memory.dead_letters import dlq_headers
from streams.adapters.memory.kafka import InMemoryConsumer
from streams.adapters.memory.store import tables
from streams.apps.invoicing import worker as worker_module
from streams.apps.invoicing.jobs import Outcome
from streams.core.billing.fencing import FencingToken
from streams.settings import Settings
from tests.support.twins import (
    PERIOD,
    GatedTax,
    Twins,
    consumer_of,
    drive,
    metric,
    spin,
    subscribe,
)


@pytest.fixture
def twins(settings: Settings) -> Twins:
    return Twins.create(settings)


def stored_usage(twins: Twins, customer: str) -> list[tables.UsageRow]:
    return sorted(
        (r for r in twins.rows(tables.USAGE_LINES) if r.customer_id == customer),
        key=lambda r: r.source_offset,
    )


def fences(twins: Twins) -> dict[int, tables.PartitionFenceRow]:
    return {row.partition: row for row in twins.rows(tables.PARTITION_FENCES)}


# --------------------------------------------------------------------------- assignment


def test_an_assignment_claims_every_partition_under_the_consumers_token(twins: Twins) -> None:
    worker = twins.worker()
    subscribe(worker)
    partitions = twins.kafka.partitions(twins.topic)
    drive(worker, lambda: len(fences(twins)) == partitions, what="the claims")
    meta = group_metadata(worker.consumer)
    assert meta.generation_id >= 1 and meta.member_id
    for partition, row in fences(twins).items():
        assert (row.group_id, row.topic) == (twins.group, twins.topic)
        assert (row.generation, row.member_id) == (meta.generation_id, meta.member_id)
        state = worker.partitions[partition]
        assert state.owned and state.token == FencingToken(
            twins.group, twins.topic, partition, meta.generation_id, meta.member_id
        )
    worker.executor.shutdown()


def test_a_refused_claim_leaves_its_partition_unprocessed(twins: Twins) -> None:
    customer = twins.customer_on(5)
    with twins.db.connection() as conn:  # a newer owner holds partition 5
        twin_fencing.claim(conn, FencingToken(twins.group, twins.topic, 5, 99, "someone-else"))
    twins.customer(customer)
    twins.usage(customer, "1.00")
    other = twins.customer_on(6)
    twins.customer(other)
    twins.usage(other, "2.00")
    refused = metric("invoicing_fence_claims_refused_total")
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: bool(stored_usage(twins, other)), what="partition 6 processed")
    spin(worker, 0.1)
    assert stored_usage(twins, customer) == []  # partition 5 is not ours to write
    assert worker.stats["claims_refused"] == 1
    assert metric("invoicing_fence_claims_refused_total") == refused + 1
    state = worker.partitions[5]
    assert not state.owned and state.unclaimed
    assert 5 not in twins.committed()
    assert (fences(twins)[5].generation, fences(twins)[5].member_id) == (99, "someone-else")
    worker.executor.shutdown()


# --------------------------------------------------------------------------- usage batches


def test_a_batch_is_stored_then_its_offset_committed_after_the_database_commit(
    twins: Twins,
) -> None:
    customer = twins.customer_on(2)
    twins.customer(customer)
    records = [twins.usage(customer, amount) for amount in ("1.10", "2.20", "3.30")]
    worker = twins.worker()
    consumer = consumer_of(worker)
    seen_at_commit: list[tuple[dict[int, int], int]] = []

    def at_commit(offsets: list[TopicPartition]) -> None:
        # what the database holds, committed, at the moment of the offset commit
        stored = len(stored_usage(twins, customer))
        seen_at_commit.append(({tp.partition: tp.offset for tp in offsets}, stored))

    consumer.before_commit = at_commit
    subscribe(worker)
    last = records[-1].offset()
    assert last is not None
    drive(worker, lambda: twins.committed().get(2) == last + 1, what="the commit")
    assert [(r.amount, r.source_offset) for r in stored_usage(twins, customer)] == [
        (Decimal("1.10"), last - 2),
        (Decimal("2.20"), last - 1),
        (Decimal("3.30"), last),
    ]
    assert seen_at_commit == [({2: last + 1}, 3)]  # one transaction, then one offset commit
    assert worker.stats["usage_stored"] == 3
    customers = [r for r in twins.rows(tables.CUSTOMERS) if r.customer_id == customer]
    assert len(customers) == 1
    worker.executor.shutdown()


def test_a_duplicate_is_a_no_op(twins: Twins) -> None:
    customer = twins.customer_on(1)
    twins.customer(customer)
    first = twins.usage(customer, "4.00", event_id="usage-1")
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: len(stored_usage(twins, customer)) == 1, what="the first")
    again = twins.usage(customer, "4.00", event_id="usage-1")  # a producer's resend
    offset = again.offset()
    assert offset is not None
    drive(worker, lambda: twins.committed().get(1) == offset + 1, what="the duplicate's commit")
    (row,) = stored_usage(twins, customer)
    assert row.source_offset == first.offset()
    assert twins.dead_letters() == []
    assert worker.stats["conflicts"] == 0
    assert twins.rows(tables.INVOICE_HOLDS) == []
    worker.executor.shutdown()


def test_a_conflicting_duplicate_is_dead_lettered_once_and_held(twins: Twins) -> None:
    customer = twins.customer_on(3)
    twins.customer(customer)
    twins.usage(customer, "4.00", event_id="usage-1")
    conflicting = twins.usage(customer, "9.99", event_id="usage-1")
    offset = conflicting.offset()
    assert offset is not None
    held = metric("invoicing_holds_total")
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(3) == offset + 1, what="the commit")
    (row,) = stored_usage(twins, customer)
    assert row.amount == Decimal("4.00")  # the stored line is kept
    (dead,) = twins.dead_letters()
    assert (dead.key(), dead.value()) == (conflicting.key(), conflicting.value())
    meta = dlq_headers(dead)
    assert meta["dlq.kind"] == "conflict"
    assert (meta["dlq.source.topic"], meta["dlq.source.partition"], meta["dlq.source.offset"]) == (
        twins.topic,
        "3",
        str(offset),
    )
    assert "already recorded with a different payload" in meta["dlq.reason"]
    (hold,) = twins.rows(tables.INVOICE_HOLDS)
    assert (hold.customer_id, hold.billing_period, hold.source_offset) == (customer, PERIOD, offset)
    assert metric("invoicing_holds_total") == held + 1
    # redelivered after a rebalance: the offset is committed, nothing is dead-lettered again
    twins.kafka.rebalance(twins.group)
    spin(worker, 0.1)
    assert len(twins.dead_letters()) == 1 and worker.stats["conflicts"] == 1
    # the customer's invoice is held, not built from partial data
    close = twins.close(customer)
    close_offset = close.offset()
    assert close_offset is not None
    drive(worker, lambda: twins.committed().get(3) == close_offset + 1, what="the marker")
    assert twins.invoices(customer) == []
    assert [r.outcome for r in twins.rows(tables.PERIOD_CLOSES)] == ["held"]
    worker.executor.shutdown()


def test_an_undecodable_record_is_dead_lettered_held_and_passed(twins: Twins) -> None:
    customer = twins.customer_on(4)
    bad = twins.kafka.append(twins.topic, key=customer.encode(), value=b"\x00not json", partition=4)
    offset = bad.offset()
    assert offset is not None
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(4) == offset + 1, what="the commit")
    (dead,) = twins.dead_letters()
    assert dlq_headers(dead)["dlq.kind"] == "invalid"
    assert [(h.customer_id, h.billing_period) for h in twins.rows(tables.INVOICE_HOLDS)] == [
        (customer, None)
    ]
    worker.executor.shutdown()


def test_a_transient_database_error_backs_off_and_retries_without_committing(
    twins: Twins,
) -> None:
    customer = twins.customer_on(7)
    twins.customer(customer)
    record = twins.usage(customer, "5.00")
    offset = record.offset()
    assert offset is not None
    twins.db.fail_next(1, statement="usage.insert_usage_rows")
    worker = twins.worker(retry_backoff_s=0.2)
    consumer = consumer_of(worker)
    commits: list[dict[int, int]] = []
    consumer.before_commit = lambda offsets: commits.append(
        {tp.partition: tp.offset for tp in offsets}
    )
    subscribe(worker)
    drive(
        worker,
        lambda: (
            worker.partitions.get(7) is not None and worker.partitions[7].backoff_until is not None
        ),
        what="the backoff",
    )
    assert stored_usage(twins, customer) == [] and commits == []
    spin(worker, 0.05)  # still backing off: nothing retried, nothing committed
    assert stored_usage(twins, customer) == [] and commits == []
    drive(worker, lambda: twins.committed().get(7) == offset + 1, what="the retry")
    (row,) = stored_usage(twins, customer)
    assert row.amount == Decimal("5.00")
    assert commits == [{7: offset + 1}]
    worker.executor.shutdown()


def test_a_fenced_write_drops_the_partitions_work_and_commits_nothing(twins: Twins) -> None:
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: 8 in fences(twins), what="the claims")
    with twins.db.connection() as conn:  # a new owner claimed partition 8 meanwhile
        twin_fencing.claim(conn, FencingToken(twins.group, twins.topic, 8, 1000, "new-owner"))
    customer = twins.customer_on(8)
    twins.customer(customer)
    twins.usage(customer, "1.00")
    refusals = metric("invoicing_fencing_refusals_total", stage="records")
    drive(worker, lambda: worker.stats["fencing_refusals"] == 1, what="the refusal")
    later = twins.usage(customer, "2.00")
    spin(worker, 0.1)
    assert stored_usage(twins, customer) == []
    assert 8 not in twins.committed()
    assert not worker.partitions[8].owned
    assert metric("invoicing_fencing_refusals_total", stage="records") == refusals + 1
    assert (
        later.offset() is not None and worker.stats["fencing_refusals"] == 1
    )  # dropped, not retried
    worker.executor.shutdown()


def test_one_poll_batch_is_one_transaction_and_one_commit_across_partitions(
    twins: Twins,
) -> None:
    """Records of several partitions in one poll: one fenced transaction, one offset
    commit for all of them; a partition whose fence moved on is dropped alone."""
    customers = {p: twins.customer_on(p) for p in (2, 5, 8)}
    last: dict[int, int] = {}
    for partition, customer in customers.items():
        twins.customer(customer)
        for amount in ("1.00", "2.00"):
            record = twins.usage(customer, amount, event_id=f"u-{partition}-{amount}")
            assert record.offset() is not None
            last[partition] = int(record.offset() or 0)
    worker = twins.worker()
    consumer = consumer_of(worker)
    commits: list[dict[int, int]] = []
    consumer.before_commit = lambda offsets: commits.append(
        {tp.partition: tp.offset for tp in offsets}
    )
    with twins.db.connection() as conn:  # partition 8 belongs to a newer owner already
        twin_fencing.claim(conn, FencingToken(twins.group, twins.topic, 8, 1000, "new-owner"))
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(5) == last[5] + 1, what="the commit")
    assert {2: last[2] + 1, 5: last[5] + 1} in commits  # one commit for both partitions
    assert [len(stored_usage(twins, customers[p])) for p in (2, 5, 8)] == [2, 2, 0]
    assert 8 not in twins.committed() and not worker.partitions[8].owned
    worker.executor.shutdown()


# --------------------------------------------------------------------------- close markers


def invoiced(twins: Twins, customer: str) -> bool:
    return any(
        r.outcome == "invoiced"
        for r in twins.rows(tables.PERIOD_CLOSES)
        if r.customer_id == customer
    )


def test_a_close_marker_pauses_the_partition_runs_the_job_off_the_poll_thread_then_resumes(
    twins: Twins,
) -> None:
    customer = twins.customer_on(0)
    twins.customer(customer)
    twins.usage(customer, "10.00")
    twins.usage(customer, "2.50")
    marker = twins.close(customer)
    after = twins.usage(customer, "7.00", period="2026-02")  # behind the marker
    marker_offset, after_offset = marker.offset(), after.offset()
    assert marker_offset is not None and after_offset is not None
    tax = GatedTax(twins.tax)
    worker = twins.worker(tax=tax)
    subscribe(worker)
    drive(worker, tax.entered.is_set, what="the job's tax call")
    assert tax.threads[0].startswith("invoice-job")  # not the poll thread
    assert worker.partitions[0].job is not None
    spin(worker, 0.1)  # the loop keeps polling while the job runs; the partition is paused
    assert twins.committed().get(0) == marker_offset  # the usage before it, not the marker
    assert not any(r.billing_period == "2026-02" for r in stored_usage(twins, customer))
    tax.release.set()
    drive(worker, lambda: twins.committed().get(0) == after_offset + 1, what="the resume")
    (invoice,) = twins.invoices(customer)
    assert (invoice.subtotal, invoice.status, invoice.close_offset) == (
        Decimal("12.50"),
        "issued",
        marker_offset,
    )
    assert (invoice.fence_group, invoice.fence_member) == (
        twins.group,
        group_metadata(worker.consumer).member_id,
    )
    (outbox,) = twins.rows(tables.OUTBOX)
    assert (outbox.type, outbox.aggregatetype, outbox.document_id) == (
        "invoice.issued",
        twins.invoices_topic,
        invoice.invoice_id,
    )
    assert invoiced(twins, customer)
    assert [r.billing_period for r in stored_usage(twins, customer)][-1] == "2026-02"
    assert worker.stats["invoice_invoiced"] == 1
    worker.executor.shutdown()


@pytest.mark.parametrize("how", ["revoked", "lost"])
def test_a_partition_taken_away_with_a_job_in_flight_cancels_the_job(
    twins: Twins, how: str
) -> None:
    customer = twins.customer_on(0)  # cooperative-sticky gives up the lowest partitions first
    twins.customer(customer)
    twins.usage(customer, "3.00")
    marker = twins.close(customer)
    marker_offset = marker.offset()
    assert marker_offset is not None
    tax = GatedTax(twins.tax)
    worker = twins.worker(tax=tax)
    subscribe(worker)
    drive(worker, tax.entered.is_set, what="the job's tax call")
    job = worker.partitions[0].job
    assert job is not None
    counted = metric("invoicing_partitions_lost_with_job_in_flight_total", how=how)
    successor = twins.worker()
    if how == "revoked":
        subscribe(successor)  # a second member joins: partition 0 moves to it
    else:
        consumer = worker.consumer
        assert isinstance(consumer, InMemoryConsumer)
        twins.kafka.lose(consumer)
    drive(worker, job.cancel.is_set, what=f"the partition {how}")
    state = worker.partitions.get(0)
    if how == "revoked":
        assert state is None  # moved to the successor
    else:  # the worker rejoined at once, got the partition back and started a job anew
        assert state is None or state.job is not job
    assert worker.stats["partitions_lost_with_job"] == 1
    assert metric("invoicing_partitions_lost_with_job_in_flight_total", how=how) == counted + 1
    tax.release.set()
    (future,) = job.futures
    future.result(5)
    assert future.result().outcome is Outcome.CANCELLED  # it wrote nothing
    if how == "revoked":  # (lost: the worker's own new job may be writing by now)
        assert twins.invoices(customer) == []
        assert twins.committed().get(0, 0) <= marker_offset
    # the partition's next owner invoices the customer, once, under its own token
    owners = [worker, successor] if how == "revoked" else [worker]
    drive(owners, lambda: invoiced(twins, customer), what="the next owner's invoice")
    (invoice,) = twins.invoices(customer)
    assert invoice.fence_generation is not None
    assert invoice.fence_generation > job.token.generation
    successor.executor.shutdown()
    worker.executor.shutdown()


# --------------------------------------------------------------------------- shutdown


def test_stop_finishes_the_job_in_flight_commits_and_leaves_the_group(twins: Twins) -> None:
    customer = twins.customer_on(9)
    twins.customer(customer)
    twins.usage(customer, "1.00")
    marker = twins.close(customer)
    marker_offset = marker.offset()
    assert marker_offset is not None
    tax = GatedTax(twins.tax)
    stop = threading.Event()
    worker = twins.worker(tax=tax, stop=stop)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run, name="worker-under-test")
    thread.start()
    assert tax.entered.wait(5), "the job never started"
    stop.set()  # SIGTERM sets it (streams/bootstrap.py)
    threading.Timer(0.2, tax.release.set).start()
    thread.join(10)
    assert not thread.is_alive() and errors == []
    assert len(twins.invoices(customer)) == 1  # the job was finished, not dropped
    assert twins.committed().get(9) == marker_offset + 1
    assert twins.kafka.members(twins.group) == []  # left the group
    with pytest.raises(RuntimeError, match="Consumer closed"):
        worker.consumer.poll(0)


def test_a_refused_offset_commit_is_retried_on_the_next_polls(twins: Twins) -> None:
    customer = twins.customer_on(10)
    twins.customer(customer)
    record = twins.usage(customer, "1.00")
    offset = record.offset()
    assert offset is not None
    failures = metric("invoicing_offset_commit_failures_total")
    twins.kafka.fail_commit(2)  # REBALANCE_IN_PROGRESS, twice
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(10) == offset + 1, what="the retried commit")
    assert len(stored_usage(twins, customer)) == 1  # written once, committed late
    assert metric("invoicing_offset_commit_failures_total") == failures + 2
    assert worker.partitions[10].uncommitted is None
    worker.executor.shutdown()


def test_a_refused_seek_after_a_job_leaves_the_partition_paused_then_resumes_it(
    twins: Twins, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client may refuse the seek that resumes a partition after its job (``_STATE``
    during a rebalance): the partition stays paused and is resumed on a later poll, so
    the markers behind the first one are still invoiced (none is skipped)."""
    from confluent_kafka import KafkaError

    from streams.adapters.memory.kafka_records import kafka_exception

    first, second = twins.customer_on(3), twins.customer_on(3, prefix="next")
    for customer in (first, second):
        twins.customer(customer)
        twins.usage(customer, "3.00")
    twins.close(first)
    last = twins.close(second)  # behind the first marker, on the same partition
    last_offset = last.offset()
    assert last_offset is not None
    worker = twins.worker()
    refusals = [kafka_exception(KafkaError._STATE, "Local: Erroneous state")]
    real_seek = worker.consumer.seek

    def seek(partition: Any) -> None:
        if refusals:
            raise refusals.pop()
        real_seek(partition)

    monkeypatch.setattr(worker.consumer, "seek", seek)
    subscribe(worker)
    drive(
        worker,
        lambda: twins.committed().get(3) == last_offset + 1,
        what="both markers handled and committed",
    )
    assert refusals == []  # the seek was refused once
    assert invoiced(twins, first) and invoiced(twins, second)
    assert worker.partitions[3].resume_pending is False
    worker.executor.shutdown()


def test_a_marker_whose_invoice_is_refused_is_dead_lettered_held_and_passed(
    twins: Twins,
) -> None:
    customer = twins.customer_on(11)
    twins.customer(customer, currency="EUR")
    twins.usage(customer, "3.00", currency="USD")  # a line in another currency
    marker = twins.close(customer)
    marker_offset = marker.offset()
    assert marker_offset is not None
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(11) == marker_offset + 1, what="the marker")
    assert twins.invoices(customer) == [] and twins.tax.calls == []
    (dead,) = twins.dead_letters()
    meta = dlq_headers(dead)
    assert meta["dlq.kind"] == "rejected" and "currency" in meta["dlq.reason"]
    assert meta["dlq.source.offset"] == str(marker_offset)
    (hold,) = twins.rows(tables.INVOICE_HOLDS)
    assert (hold.customer_id, hold.billing_period) == (customer, PERIOD)
    assert [r.outcome for r in twins.rows(tables.PERIOD_CLOSES)] == ["held"]
    assert worker.stats["invoice_failed"] == 1
    worker.executor.shutdown()


def test_a_conflicting_metered_event_is_dead_lettered_outside_the_transaction_once(
    twins: Twins,
) -> None:
    """Dead letters once, for metered usage too (docs/decisions/0008-dead-letters-once.md):
    a ``usage.metered`` whose id is stored with another payload is found by the store's
    insert; the batch is rolled back, the event dead-lettered once as read (kind
    ``conflict``), its period held, and the batch's other records written."""
    from datetime import UTC, datetime

    from streams.core.domain.events import UsageMetered

    customer = twins.customer_on(5)
    twins.customer(customer)
    at = datetime(2026, 1, 7, tzinfo=UTC)
    twins.send(
        UsageMetered(customer_id=customer, metric="api_calls", event_time=at), event_id="m-1"
    )
    conflicting = twins.send(
        UsageMetered(customer_id=customer, metric="storage_gb", event_time=at), event_id="m-1"
    )
    after = twins.usage(customer, "2.50", event_id="usage-after")
    offset, last = conflicting.offset(), after.offset()
    assert offset is not None and last is not None
    worker = twins.worker()
    subscribe(worker)
    drive(worker, lambda: twins.committed().get(5) == last + 1, what="the commit")
    (dead,) = twins.dead_letters()
    assert (dead.key(), dead.value()) == (conflicting.key(), conflicting.value())
    meta = dlq_headers(dead)
    assert (meta["dlq.kind"], meta["dlq.source.offset"]) == ("conflict", str(offset))
    (hold,) = twins.rows(tables.INVOICE_HOLDS)
    assert (hold.customer_id, hold.source_offset) == (customer, offset)
    assert [r.event_id for r in stored_usage(twins, customer)] == ["usage-after"]
    assert [(r.source_partition, r.source_offset) for r in twins.rows(tables.DEAD_LETTERS)] == [
        (5, offset)
    ]
    # redelivered after a rebalance: known in dead_letters, not dead-lettered again
    twins.kafka.rebalance(twins.group)
    spin(worker, 0.1)
    assert len(twins.dead_letters()) == 1 and worker.stats["conflicts"] == 1
    worker.executor.shutdown()


def test_a_long_poll_iteration_is_logged_with_the_poll_threads_stack_and_its_parts(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an iteration of 0.8 s or more is slow (an idle one waits 0.5 s in its fetch)
    monkeypatch.setattr(worker_module, "SLOW_ITERATION_MIN_S", 0.8)
    kafka = settings.kafka.model_copy(update={"max_poll_interval_ms": 800})
    twins = Twins.create(settings.model_copy(update={"kafka": kafka}))
    stop = threading.Event()
    worker = twins.worker(stop=stop)
    load_drafts = worker._load_drafts

    def held_in_load_drafts() -> None:  # the poll thread waits here once, for 2 s
        worker._load_drafts = load_drafts  # type: ignore[method-assign]
        threading.Event().wait(2.0)

    worker._load_drafts = held_in_load_drafts  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.run, name="worker-under-test")
    with caplog.at_level("WARNING", logger="streams.apps.invoicing.worker"):
        thread.start()
        deadline = time.monotonic() + 10
        while worker.stats["slow_poll_iterations"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    messages = [record.getMessage() for record in caplog.records]
    watched = [m for m in messages if "in one iteration" in m]
    assert len(watched) == 1  # once per iteration, while it lasted
    assert "held_in_load_drafts" in watched[0] and "Event().wait(2.0)" in watched[0]
    took = [m for m in messages if "a poll iteration took" in m]
    assert len(took) == 1

    def part(name: str) -> float:
        found = re.search(re.escape(name) + r" ([0-9.]+) s", took[0])
        assert found is not None, took[0]
        return float(found.group(1))

    assert part("backoffs, resumes, drafts and timers") >= 1.9
    assert part("jobs, claims and commits") < 0.2
