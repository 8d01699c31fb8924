"""Dead-lettering never crash-loops the worker (streams/core/billing/dead_letters.py, worker.py).

A record too large for the dead-letter topic is sent truncated, with a header
saying so; every other failure to produce is a :class:`DeadLetterError`, which
the worker answers with a backoff and a rewind (docs/design.md, invariant 5: bad
input never stalls a partition and is never dropped silently). A fake producer
that refuses on demand stands in for librdkafka (the worker's database and
consumer are the in-memory twins); tests/integration/test_dead_letters.py checks
the size refusals against the real broker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import REGISTRY

from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.kafka import InMemoryKafka
from streams.adapters.memory.stores import MEMORY
from streams.adapters.memory.tax import InMemoryTaxService
from streams.apps.invoicing.worker import InvoicingWorker, _Batch
from streams.core.billing import rows
from streams.core.billing.dead_letters import TRUNCATED_VALUE_BYTES, DeadLetterError, DeadLetters
from streams.core.billing.rows import Record
from streams.settings import Settings

Produced = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


class FakeProducer:
    """Records what is produced. ``refuse(key, value, headers)`` may return an exception
    for ``produce`` to raise, or a ``KafkaError`` for the delivery report."""

    def __init__(
        self, refuse: Callable[[Produced], BaseException | KafkaError | None] | None = None
    ) -> None:
        self.refuse = refuse or (lambda _record: None)
        self.produced: list[Produced] = []
        self._reports: list[tuple[Callable[[KafkaError | None, Any], None], KafkaError | None]] = []

    def produce(
        self,
        topic: str,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        partition: int = -1,
        on_delivery: Callable[[KafkaError | None, Any], None] | None = None,
    ) -> None:
        record = (key, value, cast(list[tuple[str, bytes]], list(headers or [])))
        outcome = self.refuse(record)
        if isinstance(outcome, BaseException):
            raise outcome
        self.produced.append(record)
        assert on_delivery is not None
        self._reports.append((on_delivery, outcome))

    def poll(self, timeout: float = -1) -> int:
        return self.flush(timeout)

    def flush(self, timeout: float = -1) -> int:
        for callback, err in self._reports:
            callback(err, None)
        self._reports.clear()
        return 0


def too_large_over(limit: int) -> Callable[[Produced], BaseException | None]:
    def refuse(record: Produced) -> BaseException | None:
        key, value, headers = record
        size = len(key or b"") + len(value or b"") + sum(len(n) + len(v) for n, v in headers)
        return KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)) if size > limit else None

    return refuse


def publish(producer: FakeProducer, *, value: bytes, headers: list[tuple[str, bytes]]) -> None:
    DeadLetters(producer, "dlq", "invoicing").publish(
        key=b"cust-1",
        value=value,
        headers=headers,
        source_topic="events",
        source_partition=3,
        source_offset=42,
        kind="invalid",
        reason="value is not JSON",
    )


def headers_of(record: Produced) -> dict[str, str]:
    return {name: data.decode(errors="replace") for name, data in record[2]}


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_record_too_large_for_the_producer_is_dead_lettered_truncated() -> None:
    producer = FakeProducer(too_large_over(20_000))
    big = b"x" * 50_000
    before = metric("invoicing_dead_letters_truncated_total", kind="invalid")
    publish(producer, value=big, headers=[("ce_id", b"e-1"), ("blob", b"y" * 10_000)])

    assert len(producer.produced) == 1
    key, value, _ = producer.produced[0]
    meta = headers_of(producer.produced[0])
    assert key == b"cust-1"
    assert value == big[:TRUNCATED_VALUE_BYTES]
    assert meta["dlq.reason"] == "value is not JSON"
    assert (meta["dlq.source.topic"], meta["dlq.source.partition"], meta["dlq.source.offset"]) == (
        "events",
        "3",
        "42",
    )
    assert "50000 -> 4096 bytes" in meta["dlq.truncated"]
    assert "1 of 2 headers dropped" in meta["dlq.truncated"]
    assert "events[3]@42" in meta["dlq.truncated"]
    assert meta["ce_id"] == "e-1" and "blob" not in meta
    assert metric("invoicing_dead_letters_truncated_total", kind="invalid") == before + 1


def test_a_record_the_broker_refuses_as_too_large_is_dead_lettered_truncated() -> None:
    def refuse(record: Produced) -> KafkaError | None:
        too_big = len(record[1] or b"") > 10_000
        return KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if too_big else None

    producer = FakeProducer(refuse)
    publish(producer, value=b"z" * 30_000, headers=[])
    assert len(producer.produced) == 2  # the full record (refused), then the truncated one
    assert "dlq.truncated" not in headers_of(producer.produced[0])
    assert "dlq.truncated" in headers_of(producer.produced[1])


def test_too_large_even_truncated_is_a_dead_letter_error() -> None:
    producer = FakeProducer(too_large_over(100))
    with pytest.raises(DeadLetterError, match="too large even truncated"):
        publish(producer, value=b"x" * 5_000, headers=[])


@pytest.mark.parametrize(
    "error",
    [
        BufferError("Local: Queue full"),
        KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC)),
        KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)),
    ],
    ids=["queue-full", "unknown-topic", "not-authorised"],
)
def test_other_produce_errors_are_dead_letter_errors(error: BaseException) -> None:
    producer = FakeProducer(lambda _record: error)
    with pytest.raises(DeadLetterError) as caught:
        publish(producer, value=b"{}", headers=[])
    assert caught.value.__cause__ is error


def test_a_delivery_error_is_a_dead_letter_error() -> None:
    producer = FakeProducer(lambda _record: KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(DeadLetterError, match="not delivered"):
        publish(producer, value=b"{}", headers=[])


# --------------------------------------------------------------------------- the worker


def make_worker(settings: Settings, producer: FakeProducer) -> InvoicingWorker:
    """A worker on the twins (in-memory database and Kafka), dead-lettering through
    ``producer``."""
    kafka = InMemoryKafka()
    return InvoicingWorker(
        settings,
        pool=InMemoryDatabase(),
        stores=MEMORY,
        tax=InMemoryTaxService(),
        consumer=kafka.consumer(settings.worker.invoicing_group),
        producer=producer,
    )


def bad_record(
    key: bytes | None, headers: list[tuple[str, bytes]], value: bytes = b"\x00not json"
) -> Record:
    return Record("events", 3, 42, key, value, headers)


def dead_letter(worker: InvoicingWorker, msg: Record) -> tuple[bool, _Batch]:
    batch = _Batch()
    source = rows.SourceCoordinates(msg.topic, msg.partition, msg.offset)
    ok = worker._dead_letter_invalid(batch, msg, source, "value is not JSON")
    return ok, batch


def test_worker_retries_instead_of_dying_when_the_dead_letter_topic_refuses(
    settings: Settings,
) -> None:
    error = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    worker = make_worker(settings, FakeProducer(lambda _record: error))
    try:
        ok, batch = dead_letter(worker, bad_record(b"cust-1", []))
    finally:
        worker.executor.shutdown()
    assert ok is False  # the caller pauses, rewinds and retries after a backoff
    assert batch.holds == []


# --------------------------------------------------------------------------- attribution


def held(batch: _Batch) -> list[str]:
    return [hold["customer_id"] for hold in batch.holds]


@pytest.mark.parametrize(
    ("key", "headers", "value", "customers"),
    [
        (b"cust-a", [("ce_subject", b"cust-b")], b"\x00", ["cust-a", "cust-b"]),
        (b"cust-a", [("ce_subject", b"cust-a")], b"\x00", ["cust-a"]),
        (b"\xff\xfe", [("ce_subject", b"cust-b")], b"\x00", ["cust-b"]),
        (None, [("ce_subject", b"cust-b")], b"\x00", ["cust-b"]),
        (b"", [], b'{"customer_id": "cust-c", "billing_period": "2025-01"}', ["cust-c"]),
        (b"cust-a", [("ce_subject", b"\xff")], b'{"customer_id": "cust-c"}', ["cust-a", "cust-c"]),
    ],
    ids=[
        "key-and-subject-differ",
        "key-equals-subject",
        "key-not-utf8",
        "no-key",
        "only-the-value-names-it",
        "key-and-value-differ",
    ],
)
def test_a_bad_record_holds_every_customer_it_could_belong_to(
    settings: Settings,
    key: bytes | None,
    headers: list[tuple[str, bytes]],
    value: bytes,
    customers: list[str],
) -> None:
    producer = FakeProducer()
    worker = make_worker(settings, producer)
    try:
        ok, batch = dead_letter(worker, bad_record(key, headers, value))
    finally:
        worker.executor.shutdown()
    assert ok
    assert held(batch) == customers
    assert len(producer.produced) == 1
    if len(customers) > 1:
        assert all("attributed to cust-a, " in hold["reason"] for hold in batch.holds)


def test_a_bad_record_of_nobody_is_dead_lettered_logged_and_counted(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    producer = FakeProducer()
    worker = make_worker(settings, producer)
    before = metric("invoicing_dead_lettered_total", kind="invalid", attribution="unattributed")
    with caplog.at_level(logging.ERROR, logger="streams.apps.invoicing.worker"):
        try:
            ok, batch = dead_letter(worker, bad_record(b"\xff\xfe", [("ce_subject", b"\xc3")]))
        finally:
            worker.executor.shutdown()
    assert ok  # dead-lettered: the offset moves on (never stalls)
    assert batch.holds == []
    reason = headers_of(producer.produced[0])["dlq.reason"]
    assert "could not be attributed to a customer" in reason
    assert "no invoice is held" in reason
    assert any(
        r.levelno == logging.ERROR and "without a hold" in r.getMessage() for r in caplog.records
    )
    after = metric("invoicing_dead_lettered_total", kind="invalid", attribution="unattributed")
    assert after == before + 1
    assert worker.stats["dead_lettered_unattributed"] == 1
