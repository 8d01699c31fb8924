"""The email sender against the real stack: Kafka (own prefixed topic, own group),
PostgreSQL (``email_deliveries``, ``outbox``), Kafka Connect + Debezium (the outbox
route), and an SMTP sink subprocess of its own per test (its own Maildir, so emails
are counted in isolation by Message-ID).

Asserted: exactly one email per invoice with a non-zero total; duplicates (same
event id, same document under a new event id) absorbed; a zero total recorded
``'skipped'`` and not emailed; a crash between send and mark resent with the same
Message-ID; a permanent refusal recorded; no offset committed past an unsent
email, and every offset committed only after its row is final; the real
outbox → Debezium → topic path; the CLI with metrics and SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import smtplib
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import Envelope as SmtpEnvelope
from aiosmtpd.smtp import Session
from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from streams import bootstrap
from streams.adapters.kafka import consumer_config, ensure_topics, make_producer
from streams.adapters.smtp import SmtpTransport
from streams.apps.email.render import document_ref, render_email, void_ref
from streams.apps.email.sender import (
    EmailSender,
    Outcome,
    invoices_dlq_topic,
    invoices_topic,
)
from streams.apps.email.store import ClaimKind, NewDelivery
from streams.bootstrap import run_email_sender
from streams.core.domain.codec import encode
from streams.core.domain.events import (
    CreditNoteIssued,
    Envelope,
    EventData,
    InvoiceIssued,
    InvoiceVoided,
    LineSummary,
    TaxAmount,
)
from streams.devtools.stack.maildir import count_by_header, list_messages
from streams.settings import Settings
from streams.topics import INVOICES, INVOICES_DLQ
from tests.support.documents import store_invoice as stored_invoice
from tests.support.kafka import drain, headers_of, text, topic_size

# The stack's own database and outbox connector (no sandbox): never beside another module
# that uses them (pytest-xdist --dist loadgroup keeps a group on one worker).
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("stack-database")]

ISSUED = datetime(2026, 11, 1, 0, 5, tzinfo=UTC)
WAIT_S = 60.0


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT_S, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.2)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Sink:
    """An SMTP sink subprocess (``python -m streams.devtools.stack.smtp_sink``) with its own Maildir."""

    port: int
    maildir: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "streams.devtools.stack.smtp_sink", "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--maildir", str(self.maildir)]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        deadline = time.monotonic() + 20
        while True:
            try:
                with smtplib.SMTP("127.0.0.1", self.port, timeout=2) as conn:
                    conn.noop()
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"SMTP sink did not start:\n{self.log.read_text()}")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def by_message_id(self) -> dict[str, int]:
        if not (self.maildir / "new").is_dir():
            return {}
        return count_by_header(self.maildir, "Message-ID")

    def total(self) -> int:
        return sum(self.by_message_id().values())


@dataclass
class Env:
    """One test's world: settings on its own topic and group, its pool and sink."""

    run: str
    settings: Settings
    pool: ConnectionPool
    sink: Sink
    topic: str
    produced: list[tuple[int, int]] = field(default_factory=list)

    def customer(self, n: int) -> str:
        return f"{self.run}-cust-{n}"

    def produce(self, data: EventData, event_id: str | None = None) -> tuple[int, int]:
        """Produce ``data`` as a binary-mode CloudEvent; returns (partition, offset)."""
        record = encode(Envelope.wrap(data, id=event_id or str(uuid.uuid4()), source="/test/email"))
        return self.produce_raw(record.key, record.value, record.headers)

    def produce_raw(
        self, key: bytes, value: bytes, headers: list[tuple[str, bytes]]
    ) -> tuple[int, int]:
        producer = make_producer(self.settings.kafka)
        done: list[Message] = []
        producer.produce(
            self.topic,
            key=key,
            value=value,
            headers=list[tuple[str, str | bytes | None]](headers),
            on_delivery=lambda e, m: done.append(m),
        )
        producer.flush(30)
        assert done and done[0].error() is None, done
        partition, offset = done[0].partition(), done[0].offset()
        assert partition is not None and offset is not None
        coords = (partition, offset)
        self.produced.append(coords)
        return coords

    def rows(self) -> dict[str, dict[str, Any]]:
        """email_deliveries rows of this test's customers, by document_key."""
        with psycopg.connect(self.settings.postgres.dsn("owner")) as conn:
            cur = conn.execute(
                "SELECT * FROM email_deliveries WHERE customer_id LIKE %s", (f"{self.run}-%",)
            )
            names = [d.name for d in cur.description or ()]
            return {row[1]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}

    def committed(self) -> dict[int, int]:
        """Committed offsets of the email group on this topic (partition → offset)."""
        consumer = Consumer(
            {
                "bootstrap.servers": self.settings.kafka.bootstrap_servers,
                "group.id": self.settings.worker.email_group,
                "enable.auto.commit": False,
            }
        )
        try:
            parts = [TopicPartition(self.topic, p) for p in range(INVOICES.partitions)]
            return {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
        finally:
            consumer.close()

    def all_committed(self) -> bool:
        committed = self.committed()
        return all(committed.get(p, -1) >= o + 1 for p, o in self.produced)


def store_invoice(env: Env, data: InvoiceIssued) -> None:
    """Write ``data``'s invoice row (tests/support/documents.py): the sender renders the PDF
    from the stored document."""
    with psycopg.connect(env.settings.postgres.dsn("owner")) as conn:
        stored_invoice(conn, data)


def invoice(env: Env, n: int, *, store: bool = True, **changes: Any) -> InvoiceIssued:
    fields: dict[str, Any] = {
        "invoice_id": str(uuid.uuid4()),
        "invoice_number": f"INV-{env.run}-{n}",
        "revision": 1,
        "customer_id": env.customer(n),
        "customer_name": f"Customer {n}",
        "email": f"ap{n}@customer.example",
        "billing_period": "2026-10",
        "currency": "USD",
        "line_count": 3,
        "subtotal": Decimal("100.00"),
        "tax_total": Decimal("20.00"),
        "total": Decimal("120.00"),
        "taxes": (
            TaxAmount(
                tax_code="GB-STD",
                rate=Decimal("0.2"),
                taxable_amount=Decimal("100"),
                amount=Decimal("20.00"),
            ),
        ),
        "largest_lines": (LineSummary(description="Compute", amount=Decimal("60.5")),),
        "issued_at": ISSUED,
    }
    fields.update(changes)
    data = InvoiceIssued.model_validate(fields)
    if store:
        store_invoice(env, data)
    return data


def zero_invoice(env: Env, n: int) -> InvoiceIssued:
    return invoice(
        env,
        n,
        store=False,  # not emailed: no PDF, and its total is not subtotal + tax
        line_count=1,
        subtotal=Decimal("0.00"),
        tax_total=Decimal("0.00"),
        total=Decimal("0.004"),  # rounds to 0.00
        taxes=(),
        largest_lines=(),
    )


def start_sender(
    env: Env, **kwargs: Any
) -> tuple[threading.Event, threading.Thread, list[BaseException]]:
    stop = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            run_email_sender(env.settings, stop=stop, pool=env.pool, **kwargs)
        except BaseException as exc:  # surfaced by stop_sender
            errors.append(exc)

    thread = threading.Thread(target=target, name="email-sender-test", daemon=True)
    thread.start()
    return stop, thread, errors


def stop_sender(handle: tuple[threading.Event, threading.Thread, list[BaseException]]) -> None:
    stop, thread, errors = handle
    stop.set()
    thread.join(30)
    assert not thread.is_alive(), "sender did not stop"
    assert not errors, errors


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    run = f"em{uuid.uuid4().hex[:10]}"
    sink = Sink(free_port(), tmp_path / "maildir", tmp_path / "sink.log")
    base = Settings()
    settings = base.model_copy(
        update={
            "kafka": base.kafka.model_copy(update={"topic_prefix": f"test.{run}."}),
            "smtp": base.smtp.model_copy(update={"port": sink.port, "timeout_s": 5.0}),
            "worker": base.worker.model_copy(
                update={"email_group": f"email-sender-{run}", "metrics_port": 0}
            ),
        }
    )
    topic = invoices_topic(settings)
    spec = INVOICES.with_prefix(settings.kafka.topic_prefix)
    assert spec.name == topic
    dlq = INVOICES_DLQ.with_prefix(settings.kafka.topic_prefix)
    assert dlq.name == invoices_dlq_topic(settings)
    ensure_topics(settings.kafka, (spec, dlq))
    pool = bootstrap.postgres_pool(settings, role="email", name=f"email-test-{run}", max_size=4)
    try:
        yield Env(run, settings, pool, sink, topic)
    finally:
        sink.stop()
        pool.close()
        with psycopg.connect(settings.postgres.dsn("owner")) as conn:
            conn.execute("DELETE FROM email_deliveries WHERE customer_id LIKE %s", (f"{run}-%",))
            routed = conn.execute("DELETE FROM outbox WHERE aggregatetype = %s", (topic,)).rowcount
        # Outbox rows go through the stack's own connector (WAL, not the table): if the
        # topic were deleted before it delivered them, it would retry them for ever and
        # stall every later test that reads an invoices topic. Then keep the topic.
        names = [dlq.name]
        if routed <= 0 or _wait_delivered(settings, topic, routed):
            names.append(topic)
        else:
            warnings.warn(
                f"kept {topic}: the outbox connector had not delivered its {routed} rows",
                stacklevel=2,
            )
        admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
        for future in admin.delete_topics(names, operation_timeout=30).values():
            future.result()


def _wait_delivered(settings: Settings, topic: str, count: int, timeout_s: float = 60.0) -> bool:
    """True once ``topic`` holds at least ``count`` records (within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(KafkaException):
            if topic_size(settings, topic) >= count:
                return True
        time.sleep(0.5)
    return False


def record(
    env: Env, data: EventData, event_id: str, offset: int = 0, partition: int = 0
) -> Message:
    """A consumed-record look-alike for :meth:`EmailSender.process` (no Kafka involved)."""
    rec = encode(Envelope.wrap(data, id=event_id, source="/test/email"))
    return Message(
        topic=env.topic,
        partition=partition,
        offset=offset,
        key=rec.key,
        value=rec.value,
        headers=list[tuple[str, str | bytes | None]](rec.headers),
    )


# --------------------------------------------------------------------------- tests


def test_one_email_per_invoice_duplicates_absorbed_zero_total_skipped(env: Env) -> None:
    env.sink.start()
    before = {
        "sent": metric("invoicing_email_sent_total", document_type="invoice"),
        "dup_event": metric("invoicing_email_duplicates_total", matched="event_id"),
        "dup_doc": metric("invoicing_email_duplicates_total", matched="document"),
        "zero": metric("invoicing_email_skipped_total", reason="zero_total"),
        "invalid": metric("invoicing_email_invalid_records_total"),
        "void": metric("invoicing_email_sent_total", document_type="invoice_void"),
    }
    invoices = [invoice(env, n) for n in range(3)]
    event_ids = [str(uuid.uuid4()) for _ in invoices]
    for data, event_id in zip(invoices, event_ids, strict=True):
        env.produce(data, event_id)
    zero = zero_invoice(env, 3)
    env.produce(zero)
    env.produce(invoices[0], event_ids[0])  # the same event again
    env.produce(invoices[1])  # the same document under a new event id
    void = InvoiceVoided(
        invoice_id=invoices[2].invoice_id,
        invoice_number=invoices[2].invoice_number,
        revision=1,
        customer_id=invoices[2].customer_id,
        billing_period="2026-10",
        reason="issued to the wrong entity",
        voided_at=ISSUED,
    )
    void_event = str(uuid.uuid4())
    env.produce(void, void_event)
    env.produce(void, void_event)  # the void again: one email
    env.produce(void)  # the same void under a new event id: one email
    key = env.customer(9).encode()
    env.produce_raw(
        key, b"not json", encode(Envelope.wrap(invoices[0], id="x", source="/t")).headers
    )

    handle = start_sender(env)
    try:
        wait_until(env.all_committed, what="every record committed")
    finally:
        stop_sender(handle)

    void_ref_ = void_ref(void, recipient=invoices[2].email)
    expected = {document_ref(data).message_id: 1 for data in invoices}
    expected[void_ref_.message_id] = 1
    assert env.sink.by_message_id() == expected
    rows = env.rows()
    void_row = rows[void_ref_.document_key]
    assert (void_row["status"], void_row["event_id"]) == ("sent", void_event)
    assert void_row["recipient"] == invoices[2].email == "ap2@customer.example"
    [voided] = [m for m in list_messages(env.sink.maildir) if m["X-Voided-Invoice-Id"]]
    assert voided["X-Voided-Invoice-Id"] == invoices[2].invoice_id
    assert voided["X-Invoice-Id"] is None  # counted apart from the invoice emails
    assert str(voided["Subject"]) == f"Invoice {invoices[2].invoice_number} for 2026-10 voided"
    text_part = voided.get_body(("plain",))
    assert text_part is not None and "issued to the wrong entity" in text_part.get_content()
    assert "has been voided" in text_part.get_content()
    [pdf] = list(voided.iter_attachments())
    assert pdf.get_content_type() == "application/pdf"
    assert pdf.get_filename() == f"{invoices[2].invoice_number}.pdf"
    for data, event_id in zip(invoices, event_ids, strict=True):
        row = rows[document_ref(data).document_key]
        assert row["status"] == "sent"
        assert row["sent_at"] is not None
        assert row["attempts"] == 1
        assert row["event_id"] == event_id  # the first event claimed it
        assert row["recipient"] == data.email
    zero_row = rows[document_ref(zero).document_key]
    assert (zero_row["status"], zero_row["skip_reason"]) == ("skipped", "zero_total")
    assert zero_row["sent_at"] is None
    assert len(rows) == 5
    # every email names the outbox event it comes from (invariant 6)
    by_invoice = {
        str(m["X-Invoice-Id"]): str(m["X-Outbox-Event-Id"])
        for m in list_messages(env.sink.maildir)
        if m["X-Invoice-Id"]
    }
    assert by_invoice == {d.invoice_id: e for d, e in zip(invoices, event_ids, strict=True)}
    assert metric("invoicing_email_sent_total", document_type="invoice") - before["sent"] == 3
    # the invoice and the void, each again under the same event id and under a new one
    assert metric("invoicing_email_duplicates_total", matched="event_id") - before["dup_event"] == 2
    assert metric("invoicing_email_duplicates_total", matched="document") - before["dup_doc"] == 2
    assert metric("invoicing_email_skipped_total", reason="zero_total") - before["zero"] == 1
    assert metric("invoicing_email_invalid_records_total") - before["invalid"] == 1
    assert metric("invoicing_email_sent_total", document_type="invoice_void") - before["void"] == 1
    # the undecodable record is in the dead-letter topic as it was read, with reason and source
    [dead] = drain(env.settings.kafka, invoices_dlq_topic(env.settings), expected=1, timeout_s=30)
    assert (dead.key(), dead.value()) == (key, b"not json")
    meta = {k: text(v) for k, v in headers_of(dead) if k.startswith("dlq.")}
    assert meta["dlq.source.topic"] == env.topic
    assert meta["dlq.kind"] == "invalid" and meta["dlq.reason"]
    assert meta["dlq.consumer.group"] == env.settings.worker.email_group
    assert any(k == "ce_id" for k, _ in headers_of(dead))  # original headers kept


def test_crash_between_send_and_mark_resends_with_the_same_message_id(env: Env) -> None:
    env.sink.start()
    data = invoice(env, 1)
    event_id = str(uuid.uuid4())
    sender = EmailSender(env.settings, env.pool)
    ref = document_ref(data)
    # The crashed run: claimed, handed the email to the relay, died before marking it.
    claim = sender.store.claim(NewDelivery(event_id, ref, env.topic, 0, 7))
    assert claim.kind is ClaimKind.NEW
    SmtpTransport(env.settings.smtp).send(
        render_email(data, event_id=event_id, from_address=env.settings.smtp.from_address),
        from_address=env.settings.smtp.from_address,
        to_address=data.email,
    )
    assert env.rows()[ref.document_key]["status"] == "sending"
    resumed_before = metric("invoicing_email_resumed_total")

    result = sender.process(record(env, data, event_id, offset=7))  # the redelivery

    assert (result.outcome, result.resumed) == (Outcome.SENT, True)
    assert env.sink.by_message_id() == {ref.message_id: 2}  # recognisable by Message-ID
    row = env.rows()[ref.document_key]
    assert (row["status"], row["attempts"]) == ("sent", 2)
    assert metric("invoicing_email_resumed_total") - resumed_before == 1
    # Once marked, neither the same event nor a republished one sends again.
    assert sender.process(record(env, data, event_id, offset=7)).outcome is Outcome.DUPLICATE
    again = sender.process(record(env, data, str(uuid.uuid4()), offset=8))
    assert (again.outcome, again.reason) == (Outcome.DUPLICATE, "duplicate_document")
    assert env.sink.by_message_id() == {ref.message_id: 2}


def test_a_republished_event_resumes_a_row_left_sending(env: Env) -> None:
    env.sink.start()
    data = invoice(env, 1)
    sender = EmailSender(env.settings, env.pool)
    first = str(uuid.uuid4())
    sender.store.claim(NewDelivery(first, document_ref(data), env.topic, 0, 1))
    result = sender.process(record(env, data, str(uuid.uuid4()), offset=2))
    assert (result.outcome, result.resumed) == (Outcome.SENT, True)
    row = env.rows()[document_ref(data).document_key]
    assert (row["status"], row["event_id"], row["attempts"]) == ("sent", first, 2)
    assert env.sink.total() == 1


def test_credit_note_is_emailed_once(env: Env) -> None:
    env.sink.start()
    note = CreditNoteIssued(
        credit_note_id=str(uuid.uuid4()),
        credit_note_number=f"CN-{env.run}",
        invoice_id=str(uuid.uuid4()),
        invoice_number=f"INV-{env.run}",
        revision=1,
        customer_id=env.customer(1),
        customer_name="Customer 1",
        email="ap1@customer.example",
        billing_period="2026-10",
        currency="EUR",
        subtotal=Decimal("10"),
        tax_total=Decimal("2"),
        total=Decimal("12"),
        reason="replay",
        issued_at=ISSUED,
    )
    sender = EmailSender(env.settings, env.pool)
    assert sender.process(record(env, note, "cn-event-1")).outcome is Outcome.SENT
    assert sender.process(record(env, note, "cn-event-1")).outcome is Outcome.DUPLICATE
    messages = list_messages(env.sink.maildir)
    assert [str(m["X-Credit-Note-Id"]) for m in messages] == [note.credit_note_id]
    assert env.rows()[f"credit_note:{note.credit_note_id}"]["document_type"] == "credit_note"


class RejectingHandler:
    """aiosmtpd handler: 550 for recipients starting with ``bounce``, stores the rest."""

    def __init__(self) -> None:
        self.accepted: list[bytes] = []

    async def handle_RCPT(
        self,
        server: SMTPServer,
        session: Session,
        envelope: SmtpEnvelope,
        address: str,
        options: list[str],
    ) -> str:
        if address.startswith("bounce"):
            return "550 5.1.1 no such user"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(
        self, server: SMTPServer, session: Session, envelope: SmtpEnvelope
    ) -> str:
        assert isinstance(envelope.content, bytes)
        self.accepted.append(envelope.content)
        return "250 OK"


def test_permanent_refusal_is_recorded_skipped_and_not_retried(env: Env) -> None:
    handler = RejectingHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=env.sink.port)
    controller.start()
    try:
        sender = EmailSender(env.settings, env.pool)
        failures = metric("invoicing_email_failures_total", kind="permanent")
        bounced = invoice(env, 1, email="bounce@customer.example")
        result = sender.process(record(env, bounced, str(uuid.uuid4())))
        good = sender.process(record(env, invoice(env, 2), str(uuid.uuid4()), offset=1))
    finally:
        controller.stop()
    assert result.outcome is Outcome.SKIPPED
    assert result.reason is not None and result.reason.startswith("smtp_rejected: ")
    row = env.rows()[document_ref(bounced).document_key]
    assert row["status"] == "skipped"
    assert "550" in row["skip_reason"]
    assert good.outcome is Outcome.SENT
    assert len(handler.accepted) == 1
    assert metric("invoicing_email_failures_total", kind="permanent") - failures == 1


class SpyConsumer(Consumer):
    """A real consumer that, at every offset commit, reads the row of the record being
    committed past: it must already be final."""

    def __init__(self, config: dict[str, Any], dsn: str) -> None:
        super().__init__(config)
        self.dsn = dsn
        self.seen: list[tuple[int, int, str | None]] = []

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        with psycopg.connect(self.dsn) as conn:
            for tp in kwargs["offsets"]:
                row = conn.execute(
                    "SELECT status FROM email_deliveries WHERE source_topic = %s "
                    "AND source_partition = %s AND source_offset = %s",
                    (tp.topic, tp.partition, tp.offset - 1),
                ).fetchone()
                self.seen.append((tp.partition, tp.offset, row[0] if row else None))
        return super().commit(*args, **kwargs)


def test_no_offset_is_committed_past_an_unsent_email(env: Env) -> None:
    # The relay is down at first: nothing listens on the sink's port yet.
    transient = metric("invoicing_email_failures_total", kind="transient")
    data = invoice(env, 1)
    partition, offset = env.produce(data)
    spy = SpyConsumer(
        consumer_config(env.settings.kafka, env.settings.worker.email_group),
        env.settings.postgres.dsn("owner"),
    )
    handle = start_sender(env, consumer=spy)
    try:
        wait_until(
            lambda: metric("invoicing_email_failures_total", kind="transient") - transient >= 3,
            what="several failed attempts",
        )
        row = env.rows()[document_ref(data).document_key]
        assert row["status"] == "sending"
        assert row["attempts"] >= 3  # every retry resumes the claim
        assert env.committed().get(partition, -1) < offset + 1
        assert spy.seen == []
        env.sink.start()  # the relay comes back
        wait_until(env.all_committed, what="the offset committed after the send")
    finally:
        stop_sender(handle)
        spy.close()
    assert env.sink.by_message_id() == {document_ref(data).message_id: 1}
    assert spy.seen == [(partition, offset + 1, "sent")]
    assert env.rows()[document_ref(data).document_key]["status"] == "sent"


def test_through_the_outbox_and_debezium(env: Env) -> None:
    """The real path: outbox rows routed by Debezium to our prefixed topic."""
    env.sink.start()
    emailed = invoice(env, 1)
    zero = zero_invoice(env, 2)
    rows = [
        (str(uuid.uuid4()), emailed),
        (str(uuid.uuid4()), zero),
        (str(uuid.uuid4()), emailed),  # republished by reconciliation under a new id
    ]
    with psycopg.connect(env.settings.postgres.dsn("owner")) as conn:
        for outbox_id, data in rows:
            conn.execute(
                """
                INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload,
                                    ce_source, ce_time, document_id)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                """,
                (
                    outbox_id,
                    env.topic,
                    data.customer_id,
                    data.event_type,
                    json.dumps(data.model_dump(mode="json")),
                    "/invoicing/worker",
                    data.issued_at.isoformat().replace("+00:00", "Z"),
                    data.invoice_id,
                ),
            )
    handle = start_sender(env)
    try:
        wait_until(lambda: _topic_size(env) == 3, what="Debezium to route the 3 outbox rows")
        wait_until(lambda: _all_committed_on_topic(env), what="all outbox records committed")
    finally:
        stop_sender(handle)
    messages = list_messages(env.sink.maildir)
    assert len(messages) == 1
    assert str(messages[0]["X-Invoice-Id"]) == emailed.invoice_id
    assert str(messages[0]["X-Outbox-Event-Id"]) == rows[0][0]
    db = env.rows()
    assert db[document_ref(emailed).document_key]["event_id"] == rows[0][0]
    assert db[document_ref(zero).document_key]["status"] == "skipped"


def _watermarks(env: Env) -> dict[int, int]:
    consumer = Consumer(
        {"bootstrap.servers": env.settings.kafka.bootstrap_servers, "group.id": "wm"}
    )
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(env.topic, p), timeout=10)[1]
            for p in range(INVOICES.partitions)
        }
    finally:
        consumer.close()


def _topic_size(env: Env) -> int:
    return sum(_watermarks(env).values())


def _all_committed_on_topic(env: Env) -> bool:
    committed = env.committed()
    return all(committed.get(p, -1) >= high for p, high in _watermarks(env).items() if high > 0)


def test_cli_worker_serves_metrics_and_stops_on_sigterm(env: Env, tmp_path: Path) -> None:
    env.sink.start()
    data = invoice(env, 1)
    env.produce(data)
    metrics_port = free_port()
    environ = dict(os.environ)
    environ.update(
        {
            "INVOICING_KAFKA__TOPIC_PREFIX": env.settings.kafka.topic_prefix,
            "INVOICING_WORKER__EMAIL_GROUP": env.settings.worker.email_group,
            "INVOICING_SMTP__PORT": str(env.sink.port),
        }
    )
    log = tmp_path / "worker.log"
    cli = Path(sys.executable).parent / "invoicing"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(cli), "worker", "email", "--metrics-port", str(metrics_port)],
            env=environ,
            stdout=out,
            stderr=out,
        )
    try:
        wait_until(lambda: env.sink.total() == 1, what=f"the email; log:\n{log.read_text()}")
        wait_until(env.all_committed, what="the offset")
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
        assert b'invoicing_email_sent_total{document_type="invoice"} 1.0' in body
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "email sender stopped" in log.read_text()
