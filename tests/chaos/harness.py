"""The chaos harness: a seeded workload, the invariants of docs/design.md "Invariants", and fault
helpers.

Every chaos test follows one shape::

    workload = generate_workload(seed, pipeline.unique, rerun, customers=.., events_per_customer=..)
    produce_workload(pipeline, workload)          # CloudEvents to pipeline.topic
    ... start workers, close the period(s), inject a fault, restore ...
    wait_settled(pipeline, workload)              # deadlines everywhere
    report = check_invariants(pipeline, workload) # AssertionError with seed + rerun command

**Seed.** ``CHAOS_SEED=<n>`` fixes the seed (default: a fresh random one); the
``chaos_seed`` fixture (tests/chaos/conftest.py) prints it with the exact command
that reruns the test with it, and every failure message of this module repeats
that command (``workload.rerun``). The seed fixes the workload (customers, amounts,
regions, the order of events, the poison records), not the timing of the faults.

**Report.** Each test prints :class:`InvariantReport` (fencing refusals, refused
claims and partitions lost with a job in flight per worker; duplicates on the
invoices topic; resent Message-IDs); with ``CHAOS_REPORT=<file>`` the reports are
also appended to that file, for a summary of a whole run.

**Invariants** (docs/design.md "Invariants"), checked by :func:`check_invariants` on the sandbox's
database, topics, Maildir and worker logs:

1. exactly one invoice per (customer, period, revision), and exactly one issued
   revision per (customer, period) of every customer that is not held; none for
   held ones;
2. exactly one email per issued invoice with a non-zero total: one ``Message-ID``
   per invoice, and one copy of it, except in a scenario that can crash the email sender between its
   send and its mark (PostgreSQL restarted), which passes ``max_email_copies=2`` — such a resend
   reuses the ``Message-ID`` (docs/design.md "Email") and is reported; a second ``Message-ID`` is
   never allowed; and exactly one ``invoice.issued`` per invoice on the invoices topic after
   deduplication by event id (duplicate records after a Connect crash are counted);
3. every subtotal equals ``round_money(exact sum of the distinct usage events)``
   of that customer and period, every invoice has exactly the workload's event
   ids as lines, and the tax equals the tax of the fake's rate table applied once;
4. fencing: every invoice's ``(fence_generation, fence_member)`` is a claim some
   worker logged for that partition, and no claim of a later generation on that
   partition was logged before the invoice's ``issued_at`` (which precedes its fence
   check): a writer whose partition moved on committed nothing. Refused writes,
   refused claims and partitions lost with a job in flight are counted per worker;
5. every poison record is in the dead-letter topic with a reason and its exact
   source coordinates, nothing else is, and the invoicing group has no lag;
6. every invoice line carries the (topic, partition, offset) at which its usage
   event was produced, and every email's ``X-Outbox-Event-Id`` is an outbox row.

**Faults.** :func:`shared_service_fault` wraps any fault of the shared stack
(``stack.supervisor.signal("kafka", "KILL")``, ``.stop("postgres")``, …) and
always restores it (``Stack(settings).up(provision=False)``, then restarts failed
connector tasks) so that later tests find a healthy stack. Workers:
:func:`suspended` (SIGSTOP … SIGCONT, CONT guaranteed), :func:`kill_worker`.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import KafkaError, Message

from streams.adapters.kafka import make_producer, record_of
from streams.adapters.memory.tax_engine import rate_for
from streams.adapters.tax.wire import tax_of
from streams.apps.email import sender as email_sender
from streams.core.domain.codec import decode, encode
from streams.core.domain.events import (
    CustomerUpserted,
    Envelope,
    InvoiceIssued,
    UsageRecorded,
)
from streams.core.domain.money import round_money
from streams.devtools.sandbox.processes import WorkerProcess
from streams.devtools.stack.layout import Layout
from streams.devtools.stack.maildir import list_messages
from streams.devtools.stack.manager import Stack
from streams.settings import Settings
from streams.topics import INVOICES_DLQ
from tests.support.kafka import group_lag, java_partition, read_to_end, topic_size
from tests.support.pipeline import Pipeline

SEED_ENV = "CHAOS_SEED"
CURRENCY = "USD"
PARTITIONS = 12
#: Regions of the fake's rate table (and None → GLOBAL), so invoices carry several tax groups.
REGIONS: tuple[str | None, ...] = ("us-east-1", "us-west-2", "eu-west-1", "ap-south-1", None)

#: Worker log lines the harness counts (docs/design.md "Ownership and fencing").
REFUSED_LINE = "write refused by fencing"
LOST_LINE = "partition lost while a job was in flight"
CLAIM_REFUSED_LINE = "claim refused"
_CLAIM_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z \S+ \S+: claimed (?P<topic>\S+)\[(?P<part>\d+)\] "
    r"at generation (?P<gen>-?\d+) as (?P<member>\S+)$",
    re.MULTILINE,
)
_REFUSED_RE = re.compile(r"write refused by fencing on partition (\d+)")


# --------------------------------------------------------------------------- seed


def chaos_seed_value() -> int:
    """The seed: ``$CHAOS_SEED`` when set, else a fresh random one."""
    raw = os.environ.get(SEED_ENV)
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def rerun_command(seed: int, nodeid: str) -> str:
    """The exact command that reruns one test with ``seed`` (from the repo root); a test
    of tests/tls gets ``-m tls``, without which it is deselected (tests/conftest.py)."""
    marker = " -m tls" if nodeid.startswith("tests/tls/") else ""
    return f"{SEED_ENV}={seed} .venv/bin/pytest{marker} '{nodeid}'"


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class UsageEvent:
    """One distinct usage event of the workload: its id, customer, period, exact amount."""

    event_id: str
    customer_id: str
    period: str
    amount: Decimal
    region_id: str | None

    def data(self, amount: Decimal | None = None) -> UsageRecorded:
        return UsageRecorded(
            customer_id=self.customer_id,
            billing_period=self.period,
            amount=self.amount if amount is None else amount,
            currency=CURRENCY,
            quantity=Decimal(1),
            unit="Hours",
            description=f"chaos usage {self.event_id}",
            region_id=self.region_id,
            event_time=datetime.strptime(self.period, "%Y-%m").replace(tzinfo=UTC)
            + timedelta(days=1),
        )


@dataclass(frozen=True)
class RawRecord:
    """A record as produced: key, value, headers (poison records are built by hand)."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    #: Usage event id when the record is a (valid) usage event, else None.
    event_id: str | None = None


@dataclass(frozen=True)
class Poison:
    """A bad record and what it must cause: a dead letter and a hold of ``held``."""

    kind: str
    record: RawRecord
    #: (customer, period) held because of it; period None = every period of the customer.
    held: tuple[str, str | None]
    #: A word the dead letter's ``dlq.reason`` must contain (case-insensitive), if any.
    reason_hint: str | None = None


@dataclass
class Workload:
    """N customers x M usage events (seeded), and what the pipeline must make of them.

    Attributes:
        seed / rerun: the seed and the command that reruns the test with it.
        customers: customer ids (they contain the sandbox's unique token).
        periods: billing periods (``YYYY-MM``) the usage falls in.
        usage: the distinct usage events (amounts with 11 decimals, some negative).
        produced: event id → every (partition, offset) it was produced at (duplicates too).
        poison: bad records; ``poison_at`` their (partition, offset) once produced.
    """

    seed: int
    unique: str
    rerun: str
    rng: random.Random
    customers: tuple[str, ...]
    periods: tuple[str, ...]
    usage: list[UsageEvent]
    produced: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    poison: list[Poison] = field(default_factory=list)
    poison_at: list[tuple[Poison, int, int]] = field(default_factory=list)
    duplicates_sent: int = 0

    # ---------------------------------------------------------------- expectations

    def held_pairs(self) -> set[tuple[str, str]]:
        """(customer, period) pairs with usage that a poison record holds."""
        held: set[tuple[str, str]] = set()
        for p in self.poison:
            customer, period = p.held
            for key in self.usage_keys():
                if key[0] == customer and (period is None or key[1] == period):
                    held.add(key)
        return held

    def usage_keys(self) -> set[tuple[str, str]]:
        return {(e.customer_id, e.period) for e in self.usage}

    def expected_keys(self) -> set[tuple[str, str]]:
        """(customer, period) pairs that must end with exactly one issued invoice."""
        return self.usage_keys() - self.held_pairs()

    def events_of(self, customer: str, period: str) -> list[UsageEvent]:
        return [e for e in self.usage if e.customer_id == customer and e.period == period]

    def expected_subtotal(self, customer: str, period: str) -> Decimal:
        exact = sum((e.amount for e in self.events_of(customer, period)), Decimal(0))
        return round_money(exact, CURRENCY)

    def expected_tax(self, customer: str, period: str) -> Decimal:
        """Tax applied once: per (tax code, rate) the exact sum of amount * rate, rounded
        once (half-even) — the fake's rate table (:func:`streams.adapters.memory.tax_engine.rate_for`)."""
        groups: dict[tuple[str, Decimal], Decimal] = defaultdict(Decimal)
        for e in self.events_of(customer, period):
            rate = rate_for(e.region_id)
            groups[(rate.tax_code, rate.rate)] += tax_of(e.amount, rate.rate)
        return sum((round_money(v, CURRENCY) for v in groups.values()), Decimal(0))

    def partition_of(self, customer: str) -> int:
        return java_partition(customer.encode(), PARTITIONS)

    def msg(self, message: str) -> str:
        """``message`` with the seed and the command that reruns the test with it."""
        return f"{message}\n[chaos seed {self.seed}] rerun: {self.rerun}"

    def fail(self, message: str) -> AssertionError:
        """An AssertionError that names the seed and the rerun command."""
        return AssertionError(self.msg(message))


def _amount(rng: random.Random) -> Decimal:
    """An amount with exactly 11 decimals; about one in six is negative (a credit)."""
    units = rng.randint(1, 400 * 10**11)
    if rng.random() < 0.17:
        units = -rng.randint(1, 30 * 10**11)
    return Decimal(units).scaleb(-11)


def generate_workload(
    seed: int,
    unique: str,
    rerun: str,
    *,
    customers: int,
    events_per_customer: int,
    periods: Sequence[str] = ("2025-03",),
) -> Workload:
    """A seeded workload: ``customers`` customers (ids contain ``unique``), each with
    ``events_per_customer`` usage events spread over ``periods`` (every customer has
    at least one event in every period). Deterministic in (seed, unique)."""
    rng = random.Random(seed)
    ids = tuple(f"cx-{unique}-{i:03d}" for i in range(customers))
    usage: list[UsageEvent] = []
    for customer in ids:
        for i in range(events_per_customer):
            period = periods[i % len(periods)] if i < len(periods) else rng.choice(periods)
            usage.append(
                UsageEvent(
                    event_id=f"ev-{unique}-{customer[-3:]}-{i:03d}-{rng.getrandbits(32):08x}",
                    customer_id=customer,
                    period=period,
                    amount=_amount(rng),
                    region_id=rng.choice(REGIONS),
                )
            )
    return Workload(seed, unique, rerun, rng, ids, tuple(periods), usage)


def customer_record(customer: str) -> RawRecord:
    data = CustomerUpserted(
        customer_id=customer,
        name=f"Chaos Customer {customer[-3:]}",
        email=f"{customer}@example.test",
        currency=CURRENCY,
    )
    envelope = Envelope.wrap(data, id=f"cust-{customer}", source="/tests/chaos")
    enc = encode(envelope)
    return RawRecord(enc.key, enc.value, enc.headers)


def usage_record(event: UsageEvent, *, amount: Decimal | None = None) -> RawRecord:
    envelope = Envelope.wrap(
        event.data(amount), id=event.event_id, source="/tests/chaos", time=datetime.now(UTC)
    )
    enc = encode(envelope)
    return RawRecord(enc.key, enc.value, enc.headers, event_id=event.event_id)


def workload_records(workload: Workload, *, duplicate_share: float = 0.0) -> list[RawRecord]:
    """Every customer's ``customer.upserted`` (customers in shuffled order), then the
    usage in shuffled order; a share of the usage events repeated right after
    themselves (the same event twice within one batch)."""
    rng = workload.rng
    customers = list(workload.customers)
    rng.shuffle(customers)
    records = [customer_record(c) for c in customers]
    usage = list(workload.usage)
    rng.shuffle(usage)
    for event in usage:
        record = usage_record(event)
        records.append(record)
        if rng.random() < duplicate_share:
            records.append(record)
            workload.duplicates_sent += 1
    return records


def produce(pipeline: Pipeline, workload: Workload, records: Sequence[RawRecord]) -> None:
    """Produce ``records`` to ``pipeline.topic`` (murmur2, idempotent producer), wait for
    every delivery report, and remember each usage event's coordinates.

    Raises:
        AssertionError: a record was not delivered.
    """
    producer = make_producer(pipeline.settings.kafka)
    errors: list[str] = []

    def report(record: RawRecord) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(str(err))
                return
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            if record.event_id is not None:
                workload.produced[record.event_id].append((partition, offset))
            for poison in workload.poison:
                if poison.record is record:
                    workload.poison_at.append((poison, partition, offset))

        return on_delivery

    for record in records:
        headers: list[tuple[str, str | bytes | None]] = [*record.headers]
        producer.produce(
            pipeline.topic,
            key=record.key,
            value=record.value,
            headers=headers,
            on_delivery=report(record),
        )
        producer.poll(0)
    remaining = producer.flush(60)
    if remaining or errors:
        raise workload.fail(f"{remaining} records undelivered, errors {errors[:3]}")


def produce_workload(
    pipeline: Pipeline, workload: Workload, *, duplicate_share: float = 0.0
) -> None:
    """Produce the whole workload (see :func:`workload_records`)."""
    produce(pipeline, workload, workload_records(workload, duplicate_share=duplicate_share))
    print(
        f"chaos workload: {len(workload.customers)} customers, {len(workload.usage)} usage events, "
        f"{workload.duplicates_sent} duplicates, periods {', '.join(workload.periods)}"
    )


# --------------------------------------------------------------------------- poison


def _ce_headers(
    event_id: str, customer: str, type_: str = "usage.recorded"
) -> list[tuple[str, bytes]]:
    return [
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id.encode()),
        ("ce_source", b"/tests/chaos"),
        ("ce_type", type_.encode()),
        ("ce_time", b"2025-03-02T00:00:00Z"),
        ("ce_subject", customer.encode()),
        ("content-type", b"application/json"),
    ]


def make_poison(workload: Workload, victims: Sequence[str]) -> list[Poison]:
    """One poison record per victim, cycling through four kinds (docs/design.md, invariant 5):

    - ``invalid_json``: a usage record whose value is not JSON (holds every period);
    - ``float_amount``: ``amount`` as a JSON number instead of a decimal string;
    - ``missing_headers``: a valid usage value without any CloudEvents header;
    - ``conflict``: an event id already used by the victim, with another amount.

    The conflict must be produced after the original (use :func:`produce` after the
    workload); the others may go anywhere. Adds them to ``workload.poison``.
    """
    kinds = ("invalid_json", "float_amount", "missing_headers", "conflict")
    made: list[Poison] = []
    for i, victim in enumerate(victims):
        kind = kinds[i % len(kinds)]
        event = next(e for e in workload.usage if e.customer_id == victim)
        period = event.period
        value_ok = event.data().model_dump_json().encode()
        if kind == "invalid_json":
            record = RawRecord(
                victim.encode(), b"{not json", _ce_headers(f"poison-{victim}", victim)
            )
            poison = Poison(kind, record, (victim, None), "json")
        elif kind == "float_amount":
            value = (
                b'{"schema_version": 1, "customer_id": "' + victim.encode() + b'", '
                b'"billing_period": "' + period.encode() + b'", "amount": 12.5, '
                b'"currency": "USD", "event_time": "2025-03-02T00:00:00Z"}'
            )
            record = RawRecord(victim.encode(), value, _ce_headers(f"poison-{victim}", victim))
            poison = Poison(kind, record, (victim, period), None)
        elif kind == "missing_headers":
            record = RawRecord(victim.encode(), value_ok, [])
            poison = Poison(kind, record, (victim, period), "header")
        else:
            other = usage_record(event, amount=event.amount + Decimal("1.00000000001"))
            record = RawRecord(other.key, other.value, other.headers)  # event_id None: not "usage"
            poison = Poison(kind, record, (victim, period), "different payload")
        made.append(poison)
    workload.poison.extend(made)
    return made


# --------------------------------------------------------------------------- waiting


def wait_until(
    workload: Workload,
    what: str,
    predicate: Callable[[], bool],
    timeout_s: float,
    *,
    interval_s: float = 0.5,
    detail: Callable[[], str] | None = None,
) -> float:
    """Poll ``predicate`` until true; returns the seconds it took.

    Raises:
        AssertionError: not true after ``timeout_s`` (names ``what``, the seed, ``detail()``).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval_s)
    extra = f"\n{detail()}" if detail else ""
    raise workload.fail(f"timed out after {timeout_s:.0f}s waiting for {what}{extra}")


def progress(pipeline: Pipeline, workload: Workload) -> dict[str, int]:
    """Counts that tell how far the run got (for waits and failure messages)."""
    keys = workload.expected_keys()
    held = workload.held_pairs()
    with pipeline.connect() as conn:
        issued = conn.execute(
            "SELECT customer_id, billing_period FROM invoices WHERE status = 'issued'"
        ).fetchall()
        settled = conn.execute(
            """SELECT count(*) FROM invoices i WHERE i.status = 'issued' AND EXISTS (
                 SELECT 1 FROM email_deliveries d
                  WHERE d.document_id = i.invoice_id AND d.status IN ('sent', 'skipped'))"""
        ).fetchone()
        held_closes = conn.execute(
            "SELECT DISTINCT customer_id, billing_period FROM period_closes WHERE outcome = 'held'"
        ).fetchall()
        usage = conn.execute("SELECT count(*) FROM usage_lines").fetchone()
    issued_set = {(r[0], r[1]) for r in issued}
    return {
        "expected": len(keys),
        "issued": len(issued_set & keys),
        "issued_unexpected": len(issued_set - keys),
        "emails_settled": int(settled[0]) if settled else 0,
        "held_expected": len(held),
        "held_closed": len({(r[0], r[1]) for r in held_closes} & held),
        "usage_lines": int(usage[0]) if usage else 0,
    }


def wait_settled(
    pipeline: Pipeline,
    workload: Workload,
    *,
    timeout_s: float = 120.0,
    allow_dead: Sequence[WorkerProcess] = (),
) -> float:
    """Wait until every expected invoice is issued and its email settled, every held
    pair has its 'held' close, and both consumer groups have no lag. Returns seconds.

    Raises:
        AssertionError: a deadline passed, or a worker not in ``allow_dead`` died.
    """
    started = time.monotonic()
    dead_ok = {w.name for w in allow_dead}

    def done() -> bool:
        dead = [w.name for w in pipeline.workers.processes if w.process.poll() is not None]
        unexpected = [d for d in dead if d not in dead_ok]
        if unexpected:
            raise workload.fail(f"workers died: {unexpected}\n{pipeline.worker_logs()}")
        p = progress(pipeline, workload)
        return (
            p["issued"] == p["expected"]
            and p["emails_settled"] >= p["expected"]
            and p["held_closed"] == p["held_expected"]
        )

    wait_until(
        workload,
        "every invoice issued and emailed",
        done,
        timeout_s,
        detail=lambda: (
            f"progress {progress(pipeline, workload)}\n{outbox_path(pipeline)}\n"
            f"{pipeline.worker_logs()}{worker_stacks(pipeline)}"
        ),
    )
    kafka = pipeline.settings.kafka
    for group, topic in (
        (pipeline.settings.worker.invoicing_group, pipeline.topic),
        (pipeline.settings.worker.email_group, pipeline.invoices_topic),
    ):
        remaining = max(10.0, timeout_s - (time.monotonic() - started))
        wait_until(
            workload,
            f"no lag of {group} on {topic} (bad input must never stall a partition)",
            lambda g=group, t=topic: group_lag(kafka, g, t) == 0,  # type: ignore[misc]
            remaining,
            interval_s=1.0,
            detail=lambda g=group, t=topic: (
                f"lag {group_lag(kafka, g, t)}\n{pipeline.worker_logs()}"
            ),  # type: ignore[misc]
        )
    return time.monotonic() - started


# --------------------------------------------------------------------------- logs


@dataclass(frozen=True)
class Claim:
    worker: str
    partition: int
    generation: int
    member: str
    logged_at: datetime


def worker_texts(pipeline: Pipeline) -> dict[str, str]:
    return {
        w.name: w.log.read_text(errors="replace") if w.log.exists() else ""
        for w in pipeline.workers.processes
    }


def claims(pipeline: Pipeline) -> list[Claim]:
    """Every fence claim the invoicing workers logged ("claimed <topic>[p] at generation g as m")."""
    found = []
    for name, text in worker_texts(pipeline).items():
        for m in _CLAIM_RE.finditer(text):
            if m["topic"] != pipeline.topic:
                continue
            found.append(
                Claim(
                    name,
                    int(m["part"]),
                    int(m["gen"]),
                    m["member"],
                    datetime.strptime(m["ts"], "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=UTC),
                )
            )
    return sorted(found, key=lambda c: (c.partition, c.logged_at))


def log_counts(pipeline: Pipeline) -> dict[str, dict[str, int]]:
    """Per worker: fencing refusals, refused claims, partitions lost with a job in flight."""
    return {
        name: {
            "refused_writes": text.count(REFUSED_LINE),
            "claims_refused": text.count(CLAIM_REFUSED_LINE),
            "lost_with_job": text.count(LOST_LINE),
            "warnings": len(re.findall(r"^\S+ WARNING ", text, re.MULTILINE)),
            "errors": len(re.findall(r"^\S+ ERROR ", text, re.MULTILINE)),
        }
        for name, text in worker_texts(pipeline).items()
        if name.startswith("invoicing")
    }


def refused_partitions(pipeline: Pipeline) -> Counter[int]:
    """Partitions named by "write refused by fencing on partition N" lines, with counts."""
    counter: Counter[int] = Counter()
    for text in worker_texts(pipeline).values():
        counter.update(int(p) for p in _REFUSED_RE.findall(text))
    return counter


def member_workers(pipeline: Pipeline) -> dict[str, str]:
    """Member id → worker name, from the claim lines."""
    return {c.member: c.worker for c in claims(pipeline)}


def owner_of(pipeline: Pipeline, partition: int) -> WorkerProcess | None:
    """The worker process whose member holds ``partition``'s fence row now."""
    with pipeline.connect() as conn:
        row = conn.execute(
            "SELECT member_id FROM partition_fences WHERE group_id = %s AND topic = %s AND partition = %s",
            (pipeline.settings.worker.invoicing_group, pipeline.topic, partition),
        ).fetchone()
    if row is None:
        return None
    name = member_workers(pipeline).get(str(row[0]))
    return next((w for w in pipeline.workers.processes if w.name == name), None)


def fence_rows(pipeline: Pipeline) -> dict[int, tuple[int, str]]:
    with pipeline.connect() as conn:
        rows = conn.execute(
            "SELECT partition, generation, member_id FROM partition_fences WHERE group_id = %s AND topic = %s",
            (pipeline.settings.worker.invoicing_group, pipeline.topic),
        ).fetchall()
    return {int(r[0]): (int(r[1]), str(r[2])) for r in rows}


# --------------------------------------------------------------------------- invariants


@dataclass
class InvariantReport:
    """What :func:`check_invariants` counted (printed by every test)."""

    invoices: int = 0
    held: int = 0
    emails: int = 0
    email_copies: dict[str, int] = field(default_factory=dict)
    topic_records: int = 0
    topic_duplicates: int = 0
    email_duplicates_absorbed: int = 0
    dead_letters: int = 0
    per_worker: dict[str, dict[str, int]] = field(default_factory=dict)
    claims: int = 0
    moved_partitions: set[int] = field(default_factory=set)
    invoices_by_worker: Counter[str] = field(default_factory=Counter)

    @property
    def refused_writes(self) -> int:
        return sum(v["refused_writes"] for v in self.per_worker.values())

    @property
    def claims_refused(self) -> int:
        return sum(v["claims_refused"] for v in self.per_worker.values())

    @property
    def lost_with_job(self) -> int:
        return sum(v["lost_with_job"] for v in self.per_worker.values())

    def summary(self) -> str:
        resent = {k: v for k, v in self.email_copies.items() if v > 1}
        lines = [
            f"invoices {self.invoices}, held {self.held}, emails {self.emails} "
            f"(Message-IDs sent more than once: {len(resent)} {resent or ''}), "
            f"invoice.issued records {self.topic_records} (duplicates {self.topic_duplicates}, "
            f"absorbed by the email sender {self.email_duplicates_absorbed}), "
            f"dead letters {self.dead_letters}, claims {self.claims}, "
            f"partitions that moved {sorted(self.moved_partitions)}",
            f"invoices written per worker: {dict(self.invoices_by_worker)}",
            "per worker: refused writes / refused claims / partitions lost with a job in flight "
            "(log lines at WARNING, ERROR):",
        ]
        for name, counts in sorted(self.per_worker.items()):
            lines.append(
                f"  {name}: {counts['refused_writes']} / {counts['claims_refused']} / "
                f"{counts['lost_with_job']}  ({counts['warnings']}, {counts['errors']})"
            )
        return "\n".join(lines)


def _dlq_meta(msg: Message) -> dict[str, str]:
    return {k: v.decode() for k, v in record_of(msg).headers if k.startswith("dlq.")}


def check_invariants(
    pipeline: Pipeline,
    workload: Workload,
    *,
    max_email_copies: int = 1,
    max_resent_invoices: int = 1,
) -> InvariantReport:
    """Assert invariants 1-6 of docs/design.md on a settled pipeline (see the module doc).

    ``max_email_copies``: how many copies of one ``Message-ID`` the SMTP sink may
    hold (default 1; 2 only where the fault can interrupt the email sender between
    its send and its mark). ``max_resent_invoices``: when copies are allowed, how many
    invoices may have more than one (default 1: the sender handles one message at a
    time, so one outage interrupts at most the one email in flight of each sender).

    Returns the counts (printed); raises AssertionError naming the seed and the
    rerun command at the first violated invariant.
    """
    report = InvariantReport()
    kafka = pipeline.settings.kafka
    expected = workload.expected_keys()
    held = workload.held_pairs()
    fail = workload.fail

    with pipeline.connect() as conn:
        invoices = conn.execute(
            """SELECT invoice_id::text, customer_id, billing_period, revision, status, subtotal,
                      tax_total, total, line_count, source_topic, source_partition, close_offset,
                      fence_generation, fence_member, issued_at
                 FROM invoices"""
        ).fetchall()
        lines = conn.execute(
            "SELECT invoice_id::text, event_id, source_topic, source_partition, source_offset "
            "FROM invoice_lines"
        ).fetchall()
        outbox_ids = {str(r[0]) for r in conn.execute("SELECT id FROM outbox").fetchall()}
        holds = conn.execute(
            "SELECT customer_id, billing_period, reason, source_partition, source_offset "
            "FROM invoice_holds WHERE released_at IS NULL"
        ).fetchall()

    # (1) one invoice per (customer, period, revision); one issued revision per pair not held.
    per_revision = Counter((r[1], r[2], r[3]) for r in invoices)
    doubled = {k: n for k, n in per_revision.items() if n > 1}
    if doubled:
        raise fail(f"invariant 1: invoices per (customer, period, revision) > 1: {doubled}")
    issued = {(r[1], r[2]): r for r in invoices if r[4] == "issued"}
    issued_count = Counter((r[1], r[2]) for r in invoices if r[4] == "issued")
    if any(n > 1 for n in issued_count.values()):
        raise fail(f"invariant 1: more than one issued revision: {issued_count}")
    missing = expected - set(issued)
    if missing:
        raise fail(f"invariant 1: no issued invoice for {sorted(missing)}")
    if set(issued) & held:
        raise fail(f"invariant 1: held customers were invoiced: {sorted(set(issued) & held)}")
    foreign = set(issued) - workload.usage_keys()
    if foreign:
        raise fail(f"invariant 1: invoices for unknown (customer, period): {sorted(foreign)}")
    report.invoices = len(issued)
    report.held = len(held)
    held_customers = {h[0] for h in holds}
    for customer, _period in held:
        if customer not in held_customers:
            raise fail(f"invariant 5: {customer} must be held (open invoice_holds row): {holds}")

    # (3) subtotal = round(exact sum of distinct events); lines = the events; tax applied once.
    lines_of: dict[str, list[tuple[str, str, int, int]]] = defaultdict(list)
    for inv_id, event_id, topic, part, offset in lines:
        lines_of[inv_id].append((event_id, topic, int(part), int(offset)))
    for (customer, period), row in issued.items():
        inv_id = row[0]
        want_events = {e.event_id for e in workload.events_of(customer, period)}
        got_events = [line[0] for line in lines_of[inv_id]]
        if len(got_events) != len(set(got_events)) or set(got_events) != want_events:
            raise fail(
                f"invariant 3: invoice {inv_id} of {customer} {period} has lines "
                f"{sorted(got_events)}, expected the distinct events {sorted(want_events)}"
            )
        if row[5] != workload.expected_subtotal(customer, period):
            raise fail(
                f"invariant 3: subtotal of {customer} {period} is {row[5]}, expected "
                f"{workload.expected_subtotal(customer, period)} (exact sum rounded half-even)"
            )
        if row[6] != workload.expected_tax(customer, period):
            raise fail(
                f"tax of {customer} {period} is {row[6]}, expected "
                f"{workload.expected_tax(customer, period)} (tax applied exactly once)"
            )
        if row[8] != len(want_events):
            raise fail(f"invariant 3: line_count {row[8]} of {inv_id}, expected {len(want_events)}")

    # (6) every line traces to the coordinates its event was produced at.
    for inv_id, inv_lines in lines_of.items():
        for event_id, topic, part, offset in inv_lines:
            if topic != pipeline.topic or (part, offset) not in workload.produced.get(event_id, []):
                raise fail(
                    f"invariant 6: line {event_id} of invoice {inv_id} says {topic}[{part}]@{offset}, "
                    f"produced at {workload.produced.get(event_id)} on {pipeline.topic}"
                )
    for row in issued.values():
        if row[9] != pipeline.topic or row[11] is None:
            raise fail(f"invariant 6: invoice {row[0]} does not name its close marker: {row}")

    # (4) fencing: each invoice's token was claimed, and not superseded before issued_at.
    all_claims = claims(pipeline)
    report.claims = len(all_claims)
    by_partition: dict[int, list[Claim]] = defaultdict(list)
    for c in all_claims:
        by_partition[c.partition].append(c)
    report.moved_partitions = {
        p for p, cs in by_partition.items() if len({(c.generation, c.member) for c in cs}) > 1
    }
    tolerance = timedelta(milliseconds=1)
    for row in invoices:
        inv_id, part, gen, member, issued_at = row[0], int(row[10]), row[12], row[13], row[14]
        own = [c for c in by_partition[part] if (c.generation, c.member) == (gen, member)]
        if not own:
            raise fail(
                f"invariant 4: invoice {inv_id} written under generation {gen} member {member} "
                f"on partition {part}, which no worker claimed; claims {by_partition[part]}"
            )
        report.invoices_by_worker[own[0].worker] += 1
        later = [
            c
            for c in by_partition[part]
            if c.generation > gen and c.logged_at + tolerance < issued_at
        ]
        if later:
            raise fail(
                f"invariant 4: invoice {inv_id} (generation {gen}, {own[0].worker}) issued at "
                f"{issued_at.isoformat()} after partition {part} was claimed by {later[0]}"
            )
    report.per_worker = log_counts(pipeline)

    # (2) emails: one Message-ID per non-zero invoice; copies reported.
    messages = list_messages(pipeline.maildir)
    copies = Counter(str(m["Message-ID"]).strip() for m in messages)
    ids_per_invoice: dict[str, set[str]] = defaultdict(set)
    for m in messages:
        invoice_id = m.get("X-Invoice-Id")
        if invoice_id is None:
            raise fail(f"invariant 2: an email without X-Invoice-Id: {m['Subject']}")
        ids_per_invoice[str(invoice_id).strip()].add(str(m["Message-ID"]).strip())
        outbox_event = str(m.get("X-Outbox-Event-Id", "")).strip()
        if outbox_event not in outbox_ids:
            raise fail(
                f"invariant 6: email {m['Message-ID']} names outbox event {outbox_event!r}, not in the outbox"
            )
    nonzero = {row[0] for row in issued.values() if row[7] != 0}
    if set(ids_per_invoice) != nonzero:
        raise fail(
            f"invariant 2: emails for {len(ids_per_invoice)} invoices, expected the {len(nonzero)} "
            f"non-zero ones; missing {sorted(nonzero - set(ids_per_invoice))[:5]}, "
            f"unexpected {sorted(set(ids_per_invoice) - nonzero)[:5]}"
        )
    several = {k: v for k, v in ids_per_invoice.items() if len(v) > 1}
    if several:
        raise fail(f"invariant 2: an invoice emailed under several Message-IDs: {several}")
    too_many = {k: n for k, n in copies.items() if n > max_email_copies}
    if too_many:
        raise fail(
            f"invariant 2: emails sent more than {max_email_copies} time(s) "
            f"under one Message-ID: {too_many}"
        )
    resent = {k: n for k, n in copies.items() if n > 1}
    if len(resent) > max_resent_invoices:
        raise fail(
            f"invariant 2: {len(resent)} invoices emailed more than once, at most "
            f"{max_resent_invoices} may be (one interrupted send per sender): {resent}"
        )
    report.emails = len(copies)
    report.email_copies = dict(copies)
    report.email_duplicates_absorbed = sum(
        len(
            re.findall(
                # the sender's logger by its object, so that a module move cannot silence it
                rf"^\S+ INFO {re.escape(email_sender.logger.name)}: duplicate .*nothing sent$",
                text,
                re.MULTILINE,
            )
        )
        for name, text in worker_texts(pipeline).items()
        if name.startswith("email")
    )

    # (2) invoice.issued on the topic: exactly one per invoice after dedup by event id.
    # Settled: every invoice's email is settled, so its event is on the topic; read it to
    # the end offsets (duplicates from a Connect restart precede the last records).
    records = read_to_end(kafka, pipeline.invoices_topic)
    report.topic_records = len(records)
    events_per_invoice: dict[str, set[str]] = defaultdict(set)
    for r in records:
        rec = record_of(r)
        env = decode(rec.key, rec.value, rec.headers, allowed=(InvoiceIssued,))
        events_per_invoice[env.data.invoice_id].add(env.id)
        if env.id not in outbox_ids:
            raise fail(f"invariant 6: invoice.issued {env.id} is not an outbox row")
    report.topic_duplicates = report.topic_records - sum(
        len(v) for v in events_per_invoice.values()
    )
    issued_ids = {row[0] for row in issued.values()}
    if set(events_per_invoice) != issued_ids or any(
        len(v) != 1 for v in events_per_invoice.values()
    ):
        raise fail(
            f"invariant 2: invoice.issued per invoice "
            f"{ {k: len(v) for k, v in events_per_invoice.items() if len(v) != 1} }, "
            f"missing {sorted(issued_ids - set(events_per_invoice))[:5]}"
        )

    # The outbox only writes decodable events: the email sender dead-letters none.
    email_dead = topic_size(pipeline.settings, kafka.topic_prefix + INVOICES_DLQ.name)
    if email_dead:
        raise fail(f"invariant 5: {email_dead} invoice event(s) dead-lettered by the email sender")
    # (5) poison in the DLQ with reason and exact coordinates; nothing else (in every
    # scenario, also those without poison: a fault must never dead-letter a good record);
    # no lag. The workers produce a dead letter before committing its offset, so with no
    # lag (wait_settled) the topic is complete up to its end offsets.
    dead = read_to_end(kafka, pipeline.dlq_topic)
    report.dead_letters = len(dead)
    if not workload.poison and dead:
        raise fail(
            f"invariant 5: {len(dead)} record(s) dead-lettered in a scenario without poison: "
            f"{[_dlq_meta(m) for m in dead[:3]]}"
        )
    if workload.poison:
        seen: dict[tuple[int, int], dict[str, str]] = {}
        bodies: dict[tuple[int, int], tuple[Any, ...]] = {}
        for msg in dead:
            meta = _dlq_meta(msg)
            if meta.get("dlq.source.topic") != pipeline.topic or not meta.get("dlq.reason"):
                raise fail(f"invariant 5: dead letter without reason or source: {meta}")
            coords = (int(meta["dlq.source.partition"]), int(meta["dlq.source.offset"]))
            seen[coords] = meta
            dead_record = record_of(msg)
            original_headers = [(k, v) for k, v in dead_record.headers if not k.startswith("dlq.")]
            bodies[coords] = (dead_record.key, dead_record.value, original_headers)
        wanted = {(part, off): p for p, part, off in workload.poison_at}
        if len(workload.poison_at) != len(workload.poison):
            raise fail(f"poison produced {len(workload.poison_at)} of {len(workload.poison)}")
        if set(seen) != set(wanted):
            raise fail(
                f"invariant 5: dead letters at {sorted(seen)}, poison produced at {sorted(wanted)}"
            )
        for coords, poison in wanted.items():
            reason = seen[coords]["dlq.reason"]
            if poison.reason_hint and poison.reason_hint.lower() not in reason.lower():
                raise fail(f"invariant 5: {poison.kind} dead-lettered with reason {reason!r}")
            # the original record, not a re-encoding of it (docs/design.md, invariant 5)
            produced = (poison.record.key, poison.record.value, list(poison.record.headers))
            if bodies[coords] != produced:
                raise fail(
                    f"invariant 5: {poison.kind} dead-lettered with another key, value or "
                    f"headers: {bodies[coords]!r} (produced {produced!r})"
                )
    lag = group_lag(kafka, pipeline.settings.worker.invoicing_group, pipeline.topic)
    if lag:
        raise fail(f"invariant 5: the invoicing group still lags {lag} records")
    return report


# --------------------------------------------------------------------------- faults


def restore_stack(settings: Settings) -> None:
    """Bring every shared service back (``Stack.up(provision=False)``) and restart
    connector tasks a fault left FAILED, so that later tests find a healthy stack."""
    Stack(settings).up(provision=False)
    with httpx.Client(base_url=settings.connect.url, timeout=30, trust_env=False) as client:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                response = client.get("/connectors", params={"expand": "status"})
                if response.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            return
        for name, info in response.json().items():
            status = info["status"]
            states = [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]
            if "FAILED" in states:
                client.post(
                    f"/connectors/{name}/restart",
                    params={"includeTasks": "true", "onlyFailed": "true"},
                )


@contextlib.contextmanager
def shared_service_fault(settings: Settings) -> Iterator[Stack]:
    """A handle on the shared stack for injecting a fault; ALWAYS restores it after."""
    stack = Stack(settings)
    try:
        yield stack
    finally:
        restore_stack(settings)


def outbox_path(pipeline: Pipeline) -> str:
    """Where an invoice's email is on its way, for a timeout's message: the outbox rows,
    the records on the invoices topic (what Debezium published), the email group's lag,
    and the outbox connector's status with its tasks' traces. Each part says
    "unavailable: …" instead of raising."""
    parts: list[str] = []
    try:
        with pipeline.connect() as conn:
            row = conn.execute("SELECT count(*) FROM outbox").fetchone()
        parts.append(f"outbox rows {row[0] if row else 0}")
    except Exception as exc:  # a diagnostic: the failure it explains is raised by the caller
        parts.append(f"outbox rows unavailable: {exc}")
    try:
        parts.append(
            f"invoices topic records {topic_size(pipeline.settings, pipeline.invoices_topic)}"
        )
        lag = group_lag(pipeline.settings.kafka, pipeline.settings.worker.email_group,
                        pipeline.invoices_topic)  # fmt: skip
        parts.append(f"email group lag {lag}")
    except Exception as exc:  # as above
        parts.append(f"invoices topic unavailable: {exc}")
    name = pipeline.settings.connect.outbox_connector
    try:
        with httpx.Client(
            base_url=pipeline.settings.connect.url, timeout=10, trust_env=False
        ) as client:
            response = client.get(f"/connectors/{name}/status")
        parts.append(f"connector {name}: HTTP {response.status_code} {response.text[:3000]}")
    except httpx.HTTPError as exc:
        parts.append(f"connector {name} unavailable: {exc}")
    return "; ".join(parts) + connect_group_history(pipeline.settings)


def worker_stacks(pipeline: Pipeline) -> str:
    """Every live invoicing worker's Python stacks (``py-spy dump``), for a timeout's
    message: where a poll loop is stuck when a worker stops polling after an outage.
    Says "unavailable: ..." for a worker whose dump fails instead of raising."""
    spy = Path(sys.executable).with_name("py-spy")
    parts: list[str] = []
    for worker in pipeline.workers.processes:
        if worker.kind != "invoicing" or worker.process.poll() is not None:
            continue
        try:
            dump = subprocess.run(
                [str(spy), "dump", "--pid", str(worker.process.pid)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            text = (dump.stdout or dump.stderr)[-4000:]
        except (OSError, subprocess.SubprocessError) as exc:
            text = f"unavailable: {exc}"
        parts.append(f"\n----- stacks of {worker.name} -----\n{text}")
    return "".join(parts)


def connect_group_history(settings: Settings, last: int = 8) -> str:
    """The Connect worker's last ``last`` group events from its log (joins with their
    assignment and rebalance delay, revocations): why a connector is UNASSIGNED."""
    log = Layout(settings.stack.home, settings.stack.state_dir).log("connect")
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"\nconnect log unavailable: {exc}"
    marks = ("Joined group at generation", "Revoking previous assignment", "rebalance delay")
    events = [line[:600] for line in lines if any(m in line for m in marks)][-last:]
    return "\n----- connect group events -----\n" + "\n".join(events)


def wait_connector_running(pipeline: Pipeline, workload: Workload, timeout_s: float = 90.0) -> None:
    """Wait until the sandbox's outbox connector and its task run (restarting a FAILED task)."""
    name = pipeline.settings.connect.outbox_connector
    with httpx.Client(
        base_url=pipeline.settings.connect.url, timeout=10, trust_env=False
    ) as client:

        def running() -> bool:
            try:
                response = client.get(f"/connectors/{name}/status")
            except httpx.HTTPError:
                return False
            if response.status_code != 200:
                return False
            status = response.json()
            states = [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]
            if "FAILED" in states:
                client.post(
                    f"/connectors/{name}/restart",
                    params={"includeTasks": "true", "onlyFailed": "true"},
                )
                return False
            return bool(status.get("tasks")) and all(s == "RUNNING" for s in states)

        wait_until(workload, f"connector {name} RUNNING", running, timeout_s, interval_s=1.0)


@contextlib.contextmanager
def suspended(worker: WorkerProcess) -> Iterator[WorkerProcess]:
    """SIGSTOP ``worker`` for the block; SIGCONT is guaranteed on the way out."""
    worker.process.send_signal(signal.SIGSTOP)
    try:
        yield worker
    finally:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGCONT)


def kill_worker(worker: WorkerProcess) -> None:
    """SIGKILL ``worker`` and reap it."""
    worker.process.send_signal(signal.SIGKILL)
    worker.process.wait(10)


def tax_document_customers(pipeline: Pipeline) -> list[str]:
    """Customers of the document requests the fake tax service received, in order."""
    return [r.customer_id for r in pipeline.tax.admin.requests(kind="document") if r.customer_id]


def tax_documents_per_key(pipeline: Pipeline) -> dict[str, set[str]]:
    """Per idempotency key, the distinct documents the fake tax service committed
    (``document_id`` of every answered request: ``ok``, ``replay``, or a ``timeout``
    that was processed, then held). More than one means tax applied twice."""
    found: dict[str, set[str]] = defaultdict(set)
    for r in pipeline.tax.admin.requests(kind="document"):
        if r.commit and r.document_id and r.idempotency_key:
            found[r.idempotency_key].add(r.document_id)
    return dict(found)


def assert_tax_once(pipeline: Pipeline, workload: Workload) -> dict[str, int]:
    """Tax never applied twice: one committed document per idempotency key. Returns
    the fake's request outcomes (``ok``, ``replay``, ``error``, ``timeout``, …) counted."""
    twice = {k: v for k, v in tax_documents_per_key(pipeline).items() if len(v) > 1}
    if twice:
        raise workload.fail(f"tax applied twice: several documents for one key: {twice}")
    return dict(Counter(r.outcome for r in pipeline.tax.admin.requests(kind="document")))


def write_report(
    workload: Workload, name: str, report: InvariantReport, path: Path | None = None
) -> None:
    """Print the report (and append it to ``$CHAOS_REPORT`` when set, for the suite summary)."""
    text = f"== {name} (seed {workload.seed})\n{report.summary()}\n"
    print(text)
    target = path or (Path(os.environ["CHAOS_REPORT"]) if os.environ.get("CHAOS_REPORT") else None)
    if target is not None:
        with target.open("a") as fh:
            fh.write(text)


def wait_group_stable(
    pipeline: Pipeline,
    workload: Workload,
    workers: Sequence[WorkerProcess],
    timeout_s: float = 60.0,
) -> dict[int, str]:
    """Wait until every partition's fence row is held by one of ``workers`` (alive) and
    each of them holds at least one; returns partition → worker name."""
    result: dict[int, str] = {}

    def stable() -> bool:
        rows = fence_rows(pipeline)
        names = member_workers(pipeline)
        owners = {part: names.get(member, "?") for part, (_g, member) in rows.items()}
        wanted = {w.name for w in workers if w.process.poll() is None}
        if len(rows) == PARTITIONS and set(owners.values()) == wanted:
            result.clear()
            result.update(owners)
            return True
        return False

    wait_until(
        workload,
        f"every partition claimed by {[w.name for w in workers]}",
        stable,
        timeout_s,
        detail=lambda: f"fences {fence_rows(pipeline)}\n{pipeline.worker_logs()}",
    )
    return result


def start_run(
    pipeline: Pipeline,
    workload: Workload,
    *,
    invoicing: int = 3,
    timeout_s: float = 90.0,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[list[WorkerProcess], dict[int, str]]:
    """The common start of a scenario: produce the workload, start ``invoicing`` workers
    (with ``extra_env``) and one email sender, wait until the group is stable and every
    usage event is stored. Returns (the invoicing workers, partition → owner name)."""
    produce_workload(pipeline, workload)
    workers = pipeline.workers.start("invoicing", invoicing, extra_env=extra_env)
    pipeline.workers.start("email", 1)
    owners = wait_group_stable(pipeline, workload, workers, timeout_s=timeout_s)
    wait_stored(pipeline, workload)
    return workers, owners


def wait_stored(pipeline: Pipeline, workload: Workload, timeout_s: float = 60.0) -> None:
    """Wait until every distinct usage event is in ``usage_lines``."""
    wait_until(
        workload,
        "every usage event stored",
        lambda: progress(pipeline, workload)["usage_lines"] == len(workload.usage),
        timeout_s,
        detail=pipeline.worker_logs,
    )


def close_all(pipeline: Pipeline, workload: Workload) -> None:
    """close-period for every period of the workload (in order)."""
    from streams.bootstrap import run_close_period

    for period in workload.periods:
        summary = run_close_period(period, pipeline.settings, progress=False)
        if not summary.ok:
            raise workload.fail(f"close-period {period} incomplete: {summary.to_dict()}")


def first_taxed_customer(pipeline: Pipeline, workload: Workload, timeout_s: float = 30.0) -> str:
    """Wait for the fake tax service's first document request; returns its customer."""
    found: list[str] = []

    def any_request() -> bool:
        found[:] = tax_document_customers(pipeline)
        return bool(found)

    wait_until(workload, "a tax request in flight", any_request, timeout_s, interval_s=0.1)
    return found[0]


_STATS_RE = re.compile(r"invoicing worker stopped: (\{.*\})$", re.MULTILINE)


def stop_workers_and_collect_stats(pipeline: Pipeline) -> dict[str, dict[str, int]]:
    """Stop every worker gracefully (SIGTERM) and return each invoicing worker's final
    stats line ("invoicing worker stopped: {...}"); killed workers have none."""
    import ast

    pipeline.workers.stop()
    stats: dict[str, dict[str, int]] = {}
    for name, text in worker_texts(pipeline).items():
        found = _STATS_RE.findall(text)
        if name.startswith("invoicing") and found:
            stats[name] = {str(k): int(v) for k, v in ast.literal_eval(found[-1]).items()}
    return stats
