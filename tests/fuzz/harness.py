"""Helpers of the fuzz tier: the seed, clean customers, producing, lags, dead letters.

**Seed.** ``pytest tests/fuzz --seed N`` (or ``FUZZ_SEED=N``) replays a run; without
it each run draws a fresh seed. The ``fuzz_seed`` fixture (tests/fuzz/conftest.py)
prints it with the exact command that reruns the test, and a failed test's report
carries a "fuzz seed" section with that command.

**Oracle.** Two, one of them independent of the codec:

* the generator knows which records no contract may accept (``FuzzRecord.must_refuse``:
  random bytes, deep JSON, a truncated value, invalid UTF-8, a NUL byte, a float
  amount): the codec must refuse every one of them (:func:`check_must_refuse`);
* a generated record the codec refuses (:func:`refused`, the same ``decode`` the
  consumers call, with their ``allowed`` types) must reach the dead-letter topic exactly
  once with a reason; a record it accepts must be **stored** (found by its event id,
  :func:`stored_account_events`) or dead-lettered for what the consumer finds out later
  (a conflicting duplicate id, a close marker whose invoice is refused); never both,
  never twice, never dropped. At least :data:`MIN_ACCEPTED_SHARE` of the generated
  records must be accepted, so that the accepted path is exercised at all.
"""

from __future__ import annotations

import os
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal

import psycopg
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from streams.adapters.kafka import make_producer
from streams.core.domain.codec import decode, encode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import CustomerUpserted, Envelope, EventData, UsageRecorded
from streams.settings import KafkaSettings, Settings
from tests.fuzz.records import FuzzRecord
from tests.support.kafka import headers_of, java_partition, read_to_end

SEED_ENV = "FUZZ_SEED"
PARTITIONS = 12
#: Share of the generated records the codec must accept (measured: 21-22 % over seeds
#: 1-3 of both generators; a generator or a codec that refuses nearly all fails here).
MIN_ACCEPTED_SHARE = 0.15


def fuzz_seed_value(option: int | None) -> int:
    """``--seed`` if given, else ``$FUZZ_SEED``, else a fresh random seed."""
    if option is not None:
        return option
    raw = os.environ.get(SEED_ENV)
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def rerun_command(seed: int, nodeid: str) -> str:
    return f".venv/bin/pytest '{nodeid}' --seed {seed}"


def refused(record: FuzzRecord, allowed: Sequence[type[EventData]]) -> str | None:
    """Why the codec refuses ``record`` on a topic carrying ``allowed`` (None: accepted).

    Any exception counts as a refusal here, so that a codec that raises something
    other than :class:`InvalidEvent` still sees its record expected on the dead-letter
    topic (the worker must not crash on it either)."""
    try:
        decode(record.key, record.value, record.headers, allowed=allowed)
    except InvalidEvent as exc:
        return exc.reason
    except Exception as exc:  # a codec bug: the record is bad all the same
        return f"{type(exc).__name__}: {exc}"
    return None


def accepted(record: FuzzRecord, allowed: Sequence[type[EventData]]) -> Envelope | None:
    """The envelope the codec makes of ``record`` (None: refused, see :func:`refused`)."""
    try:
        return decode(record.key, record.value, record.headers, allowed=allowed)
    except Exception:
        return None


def check_must_refuse(
    records: Iterable[FuzzRecord], allowed: Sequence[type[EventData]]
) -> dict[str, int]:
    """Every record the generator marked ``must_refuse`` is refused by the codec. Returns
    the counts by reason.

    Raises:
        AssertionError: the codec accepted such a record (up to five examples).
    """
    counts: dict[str, int] = defaultdict(int)
    wrong = []
    for record in records:
        if record.must_refuse is None:
            continue
        counts[record.must_refuse] += 1
        if refused(record, allowed) is None:
            wrong.append(f"{record.must_refuse}: {record.short()}")
    assert not wrong, f"{len(wrong)} records the contract must refuse were accepted: {wrong[:5]}"
    return dict(counts)


def stored_account_events(settings: Settings) -> dict[str, set[str]]:
    """What the invoicing workers stored, by kind: the event ids of usage lines, metered
    usage, subscription events and period closes, and the ids of the customers."""
    queries = {
        "usage.recorded": "SELECT event_id FROM usage_lines",
        "usage.metered": "SELECT event_id FROM metered_usage",
        "subscription": "SELECT event_id FROM subscription_events",
        "billing_period.closed": "SELECT event_id FROM period_closes",
        "customer.upserted": "SELECT customer_id FROM customers",
    }
    with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as conn:
        return {
            kind: {str(row[0]) for row in conn.execute(sql).fetchall()}
            for kind, sql in queries.items()
        }


def is_stored(envelope: Envelope, stored: dict[str, set[str]]) -> bool:
    """Whether the accepted ``envelope`` is in the database (:func:`stored_account_events`):
    a customer by its id (a later upsert replaces the event id), every other event by
    its own id."""
    event_type = envelope.data.event_type
    if event_type == "customer.upserted":
        return envelope.data.record_key() in stored["customer.upserted"]
    kind = "subscription" if event_type.startswith("subscription.") else event_type
    return envelope.id in stored.get(kind, set())


# --------------------------------------------------------------------------- clean customers


@dataclass
class CleanCustomer:
    """A customer of the control group: valid records only, invoiced with ``expected``."""

    customer_id: str
    partition: int
    amounts: list[Decimal] = field(default_factory=list)

    @property
    def exact(self) -> Decimal:
        return sum(self.amounts, Decimal(0))


def clean_customers(unique: str, per_partition: int, rng: random.Random) -> list[CleanCustomer]:
    """``per_partition`` customers on every partition (ids contain ``unique``)."""
    found: dict[int, list[CleanCustomer]] = defaultdict(list)
    i = 0
    while any(len(found[p]) < per_partition for p in range(PARTITIONS)):
        name = f"clean-{unique}-{i:04d}"
        i += 1
        partition = java_partition(name.encode(), PARTITIONS)
        if len(found[partition]) < per_partition:
            found[partition].append(CleanCustomer(name, partition))
    customers = [c for p in range(PARTITIONS) for c in found[p]]
    for customer in customers:
        for _ in range(rng.randint(3, 8)):
            digits = rng.choice((2, 6, 12))
            units = rng.randint(-(10**9), 10**15) if rng.random() < 0.1 else rng.randint(1, 10**9)
            customer.amounts.append(Decimal(units).scaleb(-digits))
    return customers


def clean_records(customers: Iterable[CleanCustomer], period: str) -> list[FuzzRecord]:
    """``customer.upserted`` and the ``usage.recorded`` events of every clean customer."""
    out: list[FuzzRecord] = []
    event_time = datetime.strptime(period, "%Y-%m").replace(day=3, tzinfo=UTC)
    for customer in customers:
        upserted = CustomerUpserted(
            customer_id=customer.customer_id,
            name=f"Clean {customer.customer_id}",
            email=f"{customer.customer_id}@example.test",
            currency="USD",
        )
        out.append(_record(Envelope.wrap(upserted, id=f"cu-{customer.customer_id}", source="/t")))
        for n, amount in enumerate(customer.amounts):
            usage = UsageRecorded(
                customer_id=customer.customer_id,
                billing_period=period,
                amount=amount,
                currency="USD",
                description=f"clean line {n}",
                event_time=event_time,
            )
            envelope = Envelope.wrap(usage, id=f"u-{customer.customer_id}-{n}", source="/t")
            out.append(_record(envelope, made_by="clean usage"))
    return out


def _record(envelope: Envelope, made_by: str = "clean customer") -> FuzzRecord:
    encoded = encode(envelope)
    return FuzzRecord(encoded.key, encoded.value, encoded.headers, made_by)


# --------------------------------------------------------------------------- Kafka


def produce(
    kafka: KafkaSettings, topic: str, records: Sequence[FuzzRecord]
) -> list[tuple[int, int]]:
    """Produce ``records`` in order; returns each one's (partition, offset).

    Raises:
        AssertionError: a record was not delivered.
    """
    producer = make_producer(kafka, **{"linger.ms": 50, "batch.num.messages": 2000})
    coords: list[tuple[int, int] | None] = [None] * len(records)
    errors: list[str] = []

    def report(index: int) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                errors.append(f"{records[index].short()}: {err}")
                return
            partition, offset = msg.partition(), msg.offset()
            assert partition is not None and offset is not None
            coords[index] = (partition, offset)

        return on_delivery

    for index, record in enumerate(records):
        while True:
            try:
                producer.produce(
                    topic,
                    key=record.key,
                    value=record.value,
                    headers=list(record.headers),
                    on_delivery=report(index),
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(120)
    assert not remaining and not errors, f"{remaining} undelivered; errors {errors[:3]}"
    assert all(c is not None for c in coords)
    return [c for c in coords if c is not None]


def partition_lags(kafka: KafkaSettings, group: str, topic: str) -> dict[int, int]:
    """Per partition, the records of ``topic`` that ``group`` has not committed."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        committed = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        lags: dict[int, int] = {}
        for tp in committed:
            _, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10
            )
            lags[tp.partition] = max(0, high - (tp.offset if tp.offset >= 0 else 0))
        return lags
    finally:
        consumer.close()


def wait_until(
    what: str, predicate: Callable[[], bool], timeout_s: float, detail: Callable[[], str]
) -> float:
    """Poll ``predicate`` every 0.5 s; returns the seconds it took.

    Raises:
        AssertionError: still false after ``timeout_s`` (with ``detail()``).
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}\n{detail()}")


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter record: its ``dlq.*`` headers and the original key and value."""

    meta: dict[str, str]
    key: bytes | None
    value: bytes | None

    @property
    def coords(self) -> tuple[int, int]:
        return int(self.meta["dlq.source.partition"]), int(self.meta["dlq.source.offset"])


def dead_letters(settings: Settings, dlq_topic: str) -> list[DeadLetter]:
    """Every record of ``dlq_topic``, from the beginning."""
    out = []
    # Called once the consumers have no lag: they produce a dead letter before committing
    # its offset, so the topic is complete up to its end offsets (no idle wait).
    for msg in read_to_end(settings.kafka, dlq_topic):
        meta = {
            name: (value or b"").decode(errors="replace")
            for name, value in headers_of(msg)
            if name.startswith("dlq.")
        }
        out.append(DeadLetter(meta, msg.key(), msg.value()))
    return out


def check_dead_letters(
    letters: Sequence[DeadLetter],
    source_topic: str,
    bad: dict[tuple[int, int], FuzzRecord],
    clean: set[tuple[int, int]],
) -> dict[str, int]:
    """Invariant 5 on the dead-letter topic: every bad record exactly once, with a reason
    and its source coordinates; nothing twice; no clean record. Returns counts by kind.

    Raises:
        AssertionError: what is wrong, with up to five examples.
    """
    by_coords: dict[tuple[int, int], list[DeadLetter]] = defaultdict(list)
    kinds: dict[str, int] = defaultdict(int)
    for letter in letters:
        assert letter.meta.get("dlq.source.topic") == source_topic, letter.meta
        assert letter.meta.get("dlq.reason"), f"dead letter without a reason: {letter.meta}"
        by_coords[letter.coords].append(letter)
        kinds[letter.meta.get("dlq.kind", "?")] += 1
    twice = {c: [x.meta.get("dlq.kind") for x in v] for c, v in by_coords.items() if len(v) > 1}
    assert not twice, (
        f"{len(twice)} records dead-lettered more than once: {list(twice.items())[:5]}"
    )
    missing = sorted(set(bad) - set(by_coords))
    assert not missing, f"{len(missing)} bad records not dead-lettered, e.g. " + "; ".join(
        f"{c}: {bad[c].short()}" for c in missing[:5]
    )
    wrong = sorted(set(by_coords) & clean)
    assert not wrong, f"clean records dead-lettered: {[by_coords[c][0].meta for c in wrong[:5]]}"
    for coords, record in bad.items():
        letter = by_coords[coords][0]
        if letter.meta.get("dlq.truncated"):
            continue
        assert (letter.key, letter.value) == (record.key, record.value), (
            f"dead letter at {coords} is not the original record: {record.short()}"
        )
    return dict(kinds)
