"""The email sender (streams/apps/email/sender.py) on the twins: the in-memory Kafka (its
invoices topic, the sender's group, committed offsets), the in-memory delivery store,
the in-memory mail transport and the invoices dead-letter topic on the in-memory Kafka.
Each test writes invoice events, polls them with the sender's consumer and hands them
to :meth:`~streams.apps.email.sender.EmailSender.handle` (process, then commit), as
:meth:`~streams.apps.email.sender.EmailSender.run` does; the last test runs the loop itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from confluent_kafka import Message

from streams.adapters.memory.dead_letters import dlq_headers
from streams.adapters.memory.mailbox_simulator import BOUNCE
from streams.adapters.memory.store import tables
from streams.apps.email.errors import TransientEmailError
from streams.apps.email.render import document_ref
from streams.apps.email.sender import EmailSender, Outcome
from streams.core.domain.events import InvoiceIssued
from streams.settings import Settings
from tests.support.twins import Twins, metric


@pytest.fixture
def twins(settings: Settings) -> Twins:
    return Twins.create(settings)


def invoice(n: int = 1, **changes: Any) -> InvoiceIssued:
    fields: dict[str, Any] = {
        "invoice_id": str(uuid.uuid4()),
        "invoice_number": f"INV-2026-01-{n:06d}",
        "revision": 1,
        "customer_id": f"cust-{n}",
        "customer_name": f"Customer {n}",
        "email": f"ap{n}@customer.example",
        "billing_period": "2026-01",
        "currency": "USD",
        "line_count": 2,
        "subtotal": Decimal("100.00"),
        "tax_total": Decimal("6.50"),
        "total": Decimal("106.50"),
        "issued_at": datetime(2026, 2, 1, 0, 5, tzinfo=UTC),
    }
    fields.update(changes)
    return InvoiceIssued.model_validate(fields)


def next_record(sender: EmailSender, timeout_s: float = 5.0) -> Message:
    consumer = sender._consumer
    assert consumer is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.05)
        if msg is not None and msg.error() is None:
            return msg
    raise AssertionError("no record came")


def committed(twins: Twins) -> dict[int, int]:
    return twins.committed(twins.invoices_topic, twins.settings.worker.email_group)


def at(msg: Message) -> tuple[int, int]:
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None
    return partition, offset


def deliveries(twins: Twins) -> list[Any]:
    return twins.rows(tables.EMAIL_DELIVERIES)


def test_an_invoice_is_emailed_once_then_its_offset_committed(twins: Twins) -> None:
    data = invoice()
    event_id = str(uuid.uuid4())
    twins.send(data, event_id=event_id, topic=twins.invoices_topic)
    sender = twins.sender()
    msg = next_record(sender)
    result = sender.handle(msg)
    assert result.outcome is Outcome.SENT and not result.resumed
    ref = document_ref(data)
    (sent,) = twins.mail.sent
    assert (sent.message_id, sent.to_address) == (ref.message_id, data.email)
    assert ("X-Outbox-Event-Id", event_id) in sent.headers  # traced to its outbox event
    (row,) = deliveries(twins)
    assert (row.status, row.attempts, row.event_id, row.document_key) == (
        "sent",
        1,
        event_id,
        ref.document_key,
    )
    partition, offset = at(msg)
    assert committed(twins) == {partition: offset + 1}


def test_a_duplicate_event_is_a_no_op(twins: Twins) -> None:
    data = invoice()
    event_id = str(uuid.uuid4())
    twins.send(data, event_id=event_id, topic=twins.invoices_topic)
    twins.send(data, event_id=event_id, topic=twins.invoices_topic)  # redelivered
    twins.send(data, topic=twins.invoices_topic)  # republished under a new id
    sender = twins.sender()
    outcomes = [sender.handle(next_record(sender)) for _ in range(3)]
    assert [(r.outcome, r.reason) for r in outcomes] == [
        (Outcome.SENT, None),
        (Outcome.DUPLICATE, "duplicate_event_id"),
        (Outcome.DUPLICATE, "duplicate_document"),
    ]
    assert twins.mail.by_message_id() == {document_ref(data).message_id: 1}
    assert len(deliveries(twins)) == 1
    assert committed(twins) == {outcomes[-1].partition: outcomes[-1].offset + 1}


def test_a_zero_total_is_recorded_skipped_and_not_emailed(twins: Twins) -> None:
    zero = invoice(subtotal=Decimal("0.00"), tax_total=Decimal("0.00"), total=Decimal("0.004"))
    twins.send(zero, topic=twins.invoices_topic)
    sender = twins.sender()
    skipped = metric("invoicing_email_skipped_total", reason="zero_total")
    result = sender.handle(next_record(sender))
    assert (result.outcome, result.reason) == (Outcome.SKIPPED, "zero_total")
    assert twins.mail.sent == []
    (row,) = deliveries(twins)
    assert (row.status, row.skip_reason, row.attempts, row.sent_at) == (
        "skipped",
        "zero_total",
        0,
        None,
    )
    assert committed(twins) == {result.partition: result.offset + 1}
    assert metric("invoicing_email_skipped_total", reason="zero_total") == skipped + 1


def test_an_undecodable_record_is_dead_lettered_to_the_invoices_dlq_then_committed(
    twins: Twins,
) -> None:
    bad = twins.kafka.append(
        twins.invoices_topic, key=b"cust-9", value=b"not json", headers=[("ce_id", b"x")]
    )
    sender = twins.sender()
    invalid = metric("invoicing_email_invalid_records_total")
    result = sender.handle(next_record(sender))
    assert result.outcome is Outcome.INVALID
    (dead,) = twins.dead_letters(twins.invoices_dlq_topic)
    assert (dead.key(), dead.value()) == (b"cust-9", b"not json")
    meta = dlq_headers(dead)
    partition, offset = at(bad)
    assert (meta["dlq.source.topic"], meta["dlq.source.partition"], meta["dlq.source.offset"]) == (
        twins.invoices_topic,
        str(partition),
        str(offset),
    )
    assert meta["dlq.kind"] == "invalid" and meta["dlq.reason"]
    assert meta["dlq.consumer.group"] == twins.settings.worker.email_group
    assert ("ce_id", b"x") in (dead.headers() or [])
    assert committed(twins) == {partition: offset + 1}
    assert twins.mail.sent == [] and deliveries(twins) == []
    assert metric("invoicing_email_invalid_records_total") == invalid + 1


def test_an_undecodable_record_whose_dead_letter_fails_is_not_committed(twins: Twins) -> None:
    twins.kafka.append(twins.invoices_topic, key=b"cust-9", value=b"not json")
    sender = twins.sender()
    sender.retry_budget_s = 0.1
    msg = next_record(sender)
    twins.kafka.fail_produce(1)
    with pytest.raises(TransientEmailError):
        sender.handle(msg)
    assert committed(twins) == {} and twins.dead_letters(twins.invoices_dlq_topic) == []


def test_a_transient_smtp_failure_is_retried(twins: Twins) -> None:
    data = invoice()
    twins.send(data, topic=twins.invoices_topic)
    twins.mail.fail_next(1)  # 451 once
    sender = twins.sender()
    transient = metric("invoicing_email_failures_total", kind="transient")
    result = sender.handle(next_record(sender))
    assert result.outcome is Outcome.SENT
    assert twins.mail.by_message_id() == {document_ref(data).message_id: 1}
    (row,) = deliveries(twins)
    assert (row.status, row.attempts) == ("sent", 2)  # the retry resumed the claim
    assert metric("invoicing_email_failures_total", kind="transient") == transient + 1
    assert committed(twins) == {result.partition: result.offset + 1}


def test_a_permanent_refusal_is_recorded_and_committed(twins: Twins) -> None:
    data = invoice(email=BOUNCE)
    twins.send(data, topic=twins.invoices_topic)
    sender = twins.sender()
    permanent = metric("invoicing_email_failures_total", kind="permanent")
    result = sender.handle(next_record(sender))
    assert result.outcome is Outcome.SKIPPED
    assert result.reason is not None and result.reason.startswith("smtp_rejected: ")
    (row,) = deliveries(twins)
    assert row.status == "skipped" and "550" in (row.skip_reason or "")
    assert twins.mail.sent == []
    assert committed(twins) == {result.partition: result.offset + 1}
    assert metric("invoicing_email_failures_total", kind="permanent") == permanent + 1


def test_the_loop_never_commits_past_an_unsent_email(twins: Twins) -> None:
    """SMTP down for longer than the retry budget: the loop seeks back and keeps the
    offset where it is; once SMTP is back the email leaves once and the offset moves."""
    data = invoice()
    record = twins.send(data, topic=twins.invoices_topic)
    partition, offset = at(record)
    twins.mail.down = True
    stop = threading.Event()
    sender = twins.sender(stop=stop)
    sender.retry_budget_s = 0.2
    errors: list[BaseException] = []

    def run() -> None:
        try:
            sender.run(poll_timeout_s=0.05, pause_s=0.05)
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=run, name="sender-under-test")
    thread.start()
    try:
        wait_for(lambda: metric_rows(twins, "sending", attempts=3), "several attempts")
        assert committed(twins) == {}
        twins.mail.down = False
        wait_for(lambda: committed(twins) == {partition: offset + 1}, "the commit")
    finally:
        stop.set()
        thread.join(10)
    assert errors == [] and not thread.is_alive()
    assert twins.mail.by_message_id() == {document_ref(data).message_id: 1}
    (row,) = deliveries(twins)
    assert row.status == "sent" and row.attempts >= 3


def metric_rows(twins: Twins, status: str, *, attempts: int) -> bool:
    rows = deliveries(twins)
    return bool(rows) and rows[0].status == status and rows[0].attempts >= attempts


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)
