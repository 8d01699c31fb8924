"""Long invoice jobs never endanger partition ownership (docs/design.md "The incident", "Ownership
and fencing").

The incident (docs/design.md "The incident") was a lease that ended while its holder still worked.
The invoicing worker's lease is its partition ownership (session timeout and
``max.poll.interval.ms``); it keeps it alive by polling while the invoice job
runs off the poll thread. These tests make one tax call slower than
``max.poll.interval.ms`` and check that

1. nobody loses a partition, and the invoice is issued (and taxed) once;
2. when a partition *does* move while its job runs (a second member joins and
   the cooperative rebalance takes it), the job is cancelled, the worker says
   "partition lost while a job was in flight", and the new owner issues the
   invoice exactly once, with the same tax document (a replay of the same key).
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from streams.adapters.kafka import make_producer
from streams.bootstrap import run_close_period
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    UsageRecorded,
    deterministic_id,
    invoice_id_for,
)
from streams.devtools.stack.fake_tax import RequestRecord
from streams.devtools.stack.maildir import count_by_header
from streams.settings import Settings
from tests.support.kafka import java_partition, wait_for_no_lag
from tests.support.pipeline import Pipeline, isolated_pipeline

PERIOD = "2025-01"
PARTITIONS = 12
MAX_POLL_INTERVAL_MS = 10_000
SESSION_TIMEOUT_MS = 6_000

LOST_LINE = "partition lost while a job was in flight"
#: Log lines that would mean ownership was endangered or a write refused.
OWNERSHIP_ALARMS = (LOST_LINE, "write refused by fencing", "claim refused", "fenced on")


# --------------------------------------------------------------------------- helpers


def customer_records(
    customer_id: str, lines: int
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """``customer.upserted`` then ``lines`` ``usage.recorded`` of PERIOD (encoded records)."""
    when = datetime(2025, 1, 15, tzinfo=UTC)
    events = [
        Envelope.wrap(
            CustomerUpserted(
                customer_id=customer_id,
                name=f"Customer {customer_id}",
                email=f"{customer_id}@example.test",
                currency="USD",
            ),
            id=deterministic_id("test-customer", customer_id),
            source="/tests/long-jobs",
            time=when,
        )
    ]
    for n in range(lines):
        usage = UsageRecorded(
            customer_id=customer_id,
            billing_period=PERIOD,
            amount=Decimal(f"{1 + n % 97}.{n % 100:02d}25"),
            currency="USD",
            region_id="us-east-1",
            description=f"line {n}",
            event_time=when,
        )
        events.append(
            Envelope.wrap(
                usage,
                id=deterministic_id("test-usage", customer_id, str(n)),
                source="/tests/long-jobs",
                time=when,
            )
        )
    out = []
    for envelope in events:
        record = encode(envelope)
        out.append((record.key, record.value, record.headers))
    return out


def produce_customers(p: Pipeline, customers: dict[str, int]) -> None:
    """Produce every customer's events (customer id → number of usage lines)."""
    producer = make_producer(p.settings.kafka)
    for customer_id, lines in customers.items():
        for key, value, headers in customer_records(customer_id, lines):
            sent: list[tuple[str, str | bytes | None]] = list(headers)
            producer.produce(p.topic, key=key, value=value, headers=sent)
            producer.poll(0)
    assert producer.flush(30) == 0


def fences(p: Pipeline) -> dict[int, tuple[int, str]]:
    """partition → (generation, member id) of the invoicing group's fence rows."""
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT partition, generation, member_id FROM partition_fences "
            "WHERE group_id = %s AND topic = %s",
            (p.settings.worker.invoicing_group, p.topic),
        ).fetchall()
    return {int(r[0]): (int(r[1]), str(r[2])) for r in rows}


#: Seconds the claims must stay unchanged before :func:`wait_claimed` takes them as settled.
STABLE_S = 5.0


def wait_claimed(p: Pipeline, members: int, timeout_s: float = 90.0) -> dict[int, tuple[int, str]]:
    """Wait until every partition is claimed, the claims name ``members`` members, and
    they stay so for :data:`STABLE_S` (after a stable rebalance every row holds its current
    owner's token; between the rounds of a cooperative rebalance the rows can already name
    every member while partitions are still moving)."""
    deadline = time.monotonic() + timeout_s
    current: dict[int, tuple[int, str]] = {}
    since: tuple[float, dict[int, tuple[int, str]]] | None = None
    while time.monotonic() < deadline:
        current = fences(p)
        if len(current) == PARTITIONS and len({m for _, m in current.values()}) == members:
            if since is None or since[1] != current:
                since = (time.monotonic(), current)
            elif time.monotonic() - since[0] >= STABLE_S:
                return current
        else:
            since = None
        dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
        assert not dead, f"workers died: {dead}\n{p.worker_logs()}"
        time.sleep(0.3)
    raise AssertionError(
        f"partitions not claimed by {members} members: {current}\n{p.worker_logs()}"
    )


def wait_invoiced_and_emailed(p: Pipeline, customers: set[str], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    counts: tuple[int, int] = (0, 0)
    with p.connect() as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                """
                SELECT count(*),
                       count(*) FILTER (WHERE EXISTS (
                           SELECT 1 FROM email_deliveries d
                            WHERE d.document_id = i.invoice_id AND d.status IN ('sent', 'skipped')))
                  FROM invoices i WHERE i.customer_id = ANY(%s)
                """,
                (sorted(customers),),
            ).fetchone()
            assert row is not None
            counts = (int(row[0]), int(row[1]))
            if counts == (len(customers), len(customers)):
                return
            dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
            assert not dead, f"workers died: {dead}\n{p.worker_logs()}"
            time.sleep(0.5)
    raise AssertionError(
        f"after {timeout_s}s (invoices, emailed) = {counts}, wanted {len(customers)} each\n"
        f"{p.worker_logs()}"
    )


def invoices_by_customer(p: Pipeline) -> dict[str, list[tuple[str, Decimal, str | None]]]:
    """customer → [(invoice id, total, fence member)] of PERIOD."""
    out: dict[str, list[tuple[str, Decimal, str | None]]] = defaultdict(list)
    with p.connect() as conn:
        for customer, invoice_id, total, member in conn.execute(
            "SELECT customer_id, invoice_id::text, total, fence_member FROM invoices "
            "WHERE billing_period = %s",
            (PERIOD,),
        ).fetchall():
            out[customer].append((invoice_id, total, member))
    return dict(out)


def full_log(p: Pipeline, kind: str = "invoicing") -> dict[str, str]:
    return {
        w.name: w.log.read_text(errors="replace")
        for w in p.workers.processes
        if w.kind == kind and w.log.exists()
    }


def assert_one_committed_tax_document_each(
    records: list[RequestRecord], invoice_ids: set[str]
) -> Counter[str]:
    """Each invoice's tax document was committed once at the tax service; any further
    request for it is a replay of the same key (never a second committed document).
    Returns replays per key."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for record in records:
        if record.commit:
            by_key[record.idempotency_key or ""].append(record.outcome)
    assert set(by_key) == {f"{i}:r1:0" for i in invoice_ids}, by_key.keys()
    replays: Counter[str] = Counter()
    for key, outcomes in by_key.items():
        assert outcomes[0] == "ok", (key, outcomes)
        assert set(outcomes[1:]) <= {"replay"}, (key, outcomes)
        replays[key] = len(outcomes) - 1
    return replays


def assert_one_email_per_nonzero_invoice(
    p: Pipeline, invoices: dict[str, list[tuple[str, Decimal, str | None]]]
) -> None:
    nonzero = {rows[0][0] for rows in invoices.values() if rows[0][1] != 0}
    # The email sender marks the row 'sent' right after SMTP accepted it; give the sink a moment.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        by_invoice = count_by_header(p.maildir, "X-Invoice-Id")
        if set(by_invoice) >= nonzero:
            break
        time.sleep(0.2)
    assert by_invoice == dict.fromkeys(nonzero, 1)


# --------------------------------------------------------------------------- tests


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    with isolated_pipeline(
        settings,
        unique,
        tmp_path,
        max_poll_interval_ms=MAX_POLL_INTERVAL_MS,
        session_timeout_ms=SESSION_TIMEOUT_MS,
    ) as p:
        yield p


def test_tax_call_longer_than_max_poll_interval_keeps_partitions_and_issues_once(
    pipeline: Pipeline, unique: str
) -> None:
    p = pipeline
    # One large customer whose tax document takes ~25 s (> max.poll.interval 10 s);
    # three small ones (~0.1 s).
    per_line_s = 0.05
    large, small = 500, 2
    p.tax.admin.configure(base_latency_s=0.02, per_line_latency_s=per_line_s, seed=1)
    customers = {f"lj-{unique}-big": large} | {f"lj-{unique}-s{i}": small for i in range(3)}
    big = f"lj-{unique}-big"

    # The longest session librdkafka allows beside this max.poll.interval (it refuses a
    # session above it): what this test shows is that a job longer than max.poll.interval
    # keeps its partition, so a heartbeat missed on a starved machine (a separate
    # librdkafka thread; 6 s session elsewhere in this module) must not move ownership for
    # another reason.
    steady = {
        "INVOICING_KAFKA__SESSION_TIMEOUT_MS": str(MAX_POLL_INTERVAL_MS),
        "INVOICING_KAFKA__HEARTBEAT_INTERVAL_MS": "2000",
    }
    p.workers.start("invoicing", 2, extra_env=steady)
    p.workers.start("email", 1)
    claimed_before = wait_claimed(p, members=2)
    produce_customers(p, customers)
    run_close_period(PERIOD, p.settings, progress=False)
    wait_invoiced_and_emailed(p, set(customers), timeout_s=150)
    wait_for_no_lag(p.settings.kafka, p.settings.worker.invoicing_group, p.topic, timeout_s=30)

    # The premise held: the big invoice's job ran longer than max.poll.interval.ms.
    logs = full_log(p)
    seconds = [
        float(m[1])
        for text in logs.values()
        for m in re.finditer(rf"invoiced {re.escape(big)} {PERIOD}: \S+ .*\(([\d.]+)s\)", text)
    ]
    assert len(seconds) == 1, logs
    assert seconds[0] > MAX_POLL_INTERVAL_MS / 1000 * 2, seconds

    # Ownership never moved: the same (generation, member) holds every partition,
    # and no worker reported a lost partition, a fenced write or a refused claim.
    assert fences(p) == claimed_before
    for name, text in logs.items():
        for alarm in OWNERSHIP_ALARMS:
            assert alarm not in text, f"{name}: {alarm!r}\n{text[-4000:]}"
    assert all(w.process.poll() is None for w in p.workers.processes), p.worker_logs()

    # Exactly one invoice per customer, one email per non-zero invoice.
    invoices = invoices_by_customer(p)
    assert {c: len(rows) for c, rows in invoices.items()} == dict.fromkeys(customers, 1)
    assert_one_email_per_nonzero_invoice(p, invoices)

    # The tax service committed one document per invoice (replays only as retries).
    invoice_ids = {rows[0][0] for rows in invoices.values()}
    assert invoice_ids == {invoice_id_for(c, PERIOD, 1) for c in customers}
    replays = assert_one_committed_tax_document_each(p.tax.admin.requests(), invoice_ids)
    assert sum(replays.values()) == 0, replays  # nobody had to redo a job


def test_partition_moved_during_a_job_cancels_it_and_the_new_owner_issues_once(
    pipeline: Pipeline, unique: str
) -> None:
    p = pipeline
    # Every tax call is held until the test releases it (the fake's barrier), so that
    # the rebalance happens while every job is inside its tax call however slow the
    # machine is; the read timeout outlasts any hold.
    p.tax.admin.configure(base_latency_s=0.0, per_line_latency_s=0.0, seed=2, hold=True)
    slow_reads = {"INVOICING_TAX__READ_TIMEOUT_S": "300"}
    # One customer per partition, so that whichever partitions the cooperative
    # rebalance moves, each carries a job in flight.
    customers: dict[str, int] = {}
    taken: set[int] = set()
    n = 0
    while len(taken) < PARTITIONS:
        customer_id = f"mv-{unique}-{n}"
        partition = java_partition(customer_id.encode(), PARTITIONS)
        if partition not in taken:
            taken.add(partition)
            customers[customer_id] = 3
        n += 1
    partition_of = {c: java_partition(c.encode(), PARTITIONS) for c in customers}

    # Worker 1 alone, able to run all 12 jobs (and tax calls) at once.
    first = p.workers.start(
        "invoicing",
        1,
        extra_env={
            "INVOICING_WORKER__MAX_JOBS": "12",
            "INVOICING_TAX__MAX_CONCURRENCY": "12",
            **slow_reads,
        },
    )[0]
    p.workers.start("email", 1)
    claims_1 = wait_claimed(p, members=1)
    member_1 = next(iter(claims_1.values()))[1]
    produce_customers(p, customers)
    run_close_period(PERIOD, p.settings, progress=False)

    # Every job is inside its (held) tax call ...
    deadline = time.monotonic() + 60
    while len({r.idempotency_key for r in p.tax.admin.requests()}) < PARTITIONS:
        assert time.monotonic() < deadline, p.worker_logs()
        time.sleep(0.2)
    # ... when a second member joins and takes half of the partitions.
    second = p.workers.start("invoicing", 1, extra_env=slow_reads)[0]
    wait_claimed(p, members=2, timeout_s=120)
    # The rebalance settles: every partition the first owner gave up is claimed by the
    # second member and reported cancelled by the first, all while the tax calls are
    # still held; only then are they answered.
    lost_line = re.compile(rf"{LOST_LINE}: \S+\[(\d+)\] revoked \(invoice job for")
    deadline = time.monotonic() + 90
    while True:
        claims_2 = fences(p)
        moved = {part for part, (_, member) in claims_2.items() if member != member_1}
        lost_parts = {int(m) for m in lost_line.findall(first.log.read_text(errors="replace"))}
        if moved and lost_parts == moved:
            break
        assert time.monotonic() < deadline, (
            claims_2,
            first.log.read_text(errors="replace")[-4000:],
        )
        time.sleep(0.2)
    p.tax.admin.configure(hold=False)

    wait_invoiced_and_emailed(p, set(customers), timeout_s=150)

    text_1 = first.log.read_text(errors="replace")
    lost = re.findall(
        rf"{LOST_LINE}: \S+\[(\d+)\] revoked \(invoice job for (\S+) {PERIOD}", text_1
    )
    assert {int(part) for part, _ in lost} == moved, text_1[-4000:]
    assert {customer for _, customer in lost} == {
        c for c, part in partition_of.items() if part in moved
    }
    # The cancelled jobs never tried to write: nothing was refused by fencing.
    for text in full_log(p).values():
        assert "write refused by fencing" not in text and "claim refused" not in text, text[-4000:]

    # Exactly one invoice per customer, written by the partition's owner after the move.
    invoices = invoices_by_customer(p)
    assert {c: len(rows) for c, rows in invoices.items()} == dict.fromkeys(customers, 1)
    member_2 = {m for part, (_, m) in claims_2.items() if part in moved}
    assert len(member_2) == 1
    for customer, rows in invoices.items():
        expected = member_2 if partition_of[customer] in moved else {member_1}
        assert rows[0][2] in expected, (customer, rows, partition_of[customer])
    assert_one_email_per_nonzero_invoice(p, invoices)

    # One committed tax document per invoice; each moved customer's was replayed
    # (same key) by the new owner, never committed twice.
    invoice_ids = {rows[0][0] for rows in invoices.values()}
    replays = assert_one_committed_tax_document_each(p.tax.admin.requests(), invoice_ids)
    moved_keys = {
        f"{invoice_id_for(c, PERIOD, 1)}:r1:0" for c, part in partition_of.items() if part in moved
    }
    # A new owner's job either replays the key at the service or finds the answer the
    # first owner's (cancelled) call left in the Redis tax cache; never a second document.
    assert {k for k, n in replays.items() if n} <= moved_keys
    print(f"moved partitions {sorted(moved)}; replayed at the service: {dict(replays)}")
    assert second.process.poll() is None and first.process.poll() is None


def test_owner_paused_past_session_timeout_loses_the_partition_and_its_job(
    pipeline: Pipeline, unique: str
) -> None:
    """The GC-pause case of docs/design.md "The incident": the owner is frozen (SIGSTOP) mid-job
    until the group evicts it; when it thaws, it learns the partition is lost, cancels the job and
    says so, while the new owner issues the invoice exactly once."""
    p = pipeline
    # The tax call is held until the test releases it (the fake's barrier): the owner is
    # frozen, evicted and thawed while its job is inside the call, however slow the
    # machine is; the read timeout outlasts any hold.
    p.tax.admin.configure(base_latency_s=0.0, per_line_latency_s=0.0, seed=3, hold=True)
    customer = f"gc-{unique}"
    partition = java_partition(customer.encode(), PARTITIONS)

    workers = p.workers.start("invoicing", 2, extra_env={"INVOICING_TAX__READ_TIMEOUT_S": "300"})
    p.workers.start("email", 1)
    wait_claimed(p, members=2)
    produce_customers(p, {customer: 3})
    run_close_period(PERIOD, p.settings, progress=False)
    deadline = time.monotonic() + 30
    while not p.tax.admin.requests():
        assert time.monotonic() < deadline, p.worker_logs()
        time.sleep(0.1)
    # The owner is the member whose claim the job runs under, read now that the job is in
    # its tax call: claims read before the close may predate the second round of a
    # cooperative rebalance (a partition revoked from one member and not yet claimed by
    # the other still names the first).
    owner_member = fences(p)[partition][1]
    claim_line = re.compile(
        rf"claimed \S+\[{partition}\] at generation \d+ as {re.escape(owner_member)}"
    )
    owner = next(w for w in workers if claim_line.search(w.log.read_text(errors="replace")))
    other = next(w for w in workers if w is not owner)
    owner.process.send_signal(signal.SIGSTOP)
    try:
        # The group evicts the frozen member after the session timeout; the other
        # member claims its partitions (a higher generation).
        deadline = time.monotonic() + 90
        while fences(p)[partition][1] == owner_member:
            assert time.monotonic() < deadline, p.worker_logs()
            time.sleep(0.2)
    finally:
        owner.process.send_signal(signal.SIGCONT)

    # Thawed, the old owner reports the loss with the job it cancelled (its tax call is
    # still held).
    pattern = re.compile(
        rf"{LOST_LINE}: \S+\[{partition}\] lost \(invoice job for {re.escape(customer)} {PERIOD}"
    )
    deadline = time.monotonic() + 90
    while not pattern.search(owner.log.read_text(errors="replace")):
        assert time.monotonic() < deadline, owner.log.read_text(errors="replace")[-4000:]
        time.sleep(0.2)
    p.tax.admin.configure(hold=False)  # both owners' calls are answered now

    wait_invoiced_and_emailed(p, {customer}, timeout_s=150)
    # The cancelled job ends once its call is answered; whatever it then tries is after
    # the new owner's invoice, which the checks below look at.
    invoices = invoices_by_customer(p)
    assert [len(rows) for rows in invoices.values()] == [1] and customer in invoices
    # Written under a token newer than the one the frozen owner had.
    assert invoices[customer][0][2] != owner_member
    for text in full_log(p).values():
        assert "write refused by fencing" not in text, text[-4000:]
    assert_one_email_per_nonzero_invoice(p, invoices)
    assert_one_committed_tax_document_each(p.tax.admin.requests(), {invoices[customer][0][0]})
    assert other.process.poll() is None and owner.process.poll() is None
