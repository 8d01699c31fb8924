"""The email sender's PDFs rendered ahead in processes (streams/apps/email/prerender.py):
the same bytes, nothing rendered for a record whose email is final, a render failure
recorded as before, a dead render process replaced, a hung one killed after
``email_render_timeout_s`` (and replaced, or at the stop), and a transient failure giving
back every later record of the poll (twins: in-memory Kafka, deliveries, mail, documents;
the render processes are real)."""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal

import pydantic
import pytest
from prometheus_client import REGISTRY

from streams.adapters.documents.lines_csv import lines_csv
from streams.adapters.documents.pdf import PDF_MAX_LINES, render_pdf
from streams.adapters.documents.source import InMemoryDocuments
from streams.apps.email import attachments
from streams.apps.email.errors import RenderError, SmtpTransientError
from streams.apps.email.prerender import Prerenderer
from streams.apps.email.records import first_of_each_partition
from streams.apps.email.render import document_ref
from streams.apps.email.sender import EmailSender
from streams.apps.email.twin import InMemoryDeliveryStore
from streams.core.domain.documents import Document
from streams.core.domain.events import InvoiceIssued
from streams.settings import Settings
from streams.settings.processes import WorkerSettings
from tests.support.twins import Twins
from tests.unit.documents import samples
from tests.unit.documents.test_email_attachment import LINKS, event_of, sender


@pytest.fixture
def twins(settings: Settings) -> Twins:
    return Twins.create(settings)


@pytest.fixture(scope="module")
def prerender() -> Iterator[Prerenderer]:
    """Two render processes (started once for the module: about a second each)."""
    pool = Prerenderer(2, limit=4)
    yield pool
    pool.close()


def numbered(n: int, lines: int = 3) -> tuple[Document, InvoiceIssued]:
    """Invoice ``n``: its stored document and its ``invoice.issued`` event."""
    invoice_id = str(uuid.UUID(int=n + 1))
    number = f"INV-2026-10-{n:06d}"
    stored = samples.invoice(lines, document_id=invoice_id, number=number)
    event = event_of(lines).model_copy(update={"invoice_id": invoice_id, "invoice_number": number})
    return stored, event


def sender_of(
    twins: Twins, documents: InMemoryDocuments, prerender: Prerenderer, stop: threading.Event
) -> EmailSender:
    return sender(twins, documents, LINKS, prerender=prerender, stop=stop)


def run_until(
    s: EmailSender, stop: threading.Event, done: Callable[[], bool], timeout_s: float = 30
) -> None:
    """Run ``s`` in a thread until ``done()`` holds (or the timeout), then stop it."""
    thread = threading.Thread(target=s.run, kwargs={"poll_timeout_s": 0.05, "pause_s": 0.05})
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        thread.join(10)
    assert done(), "the sender did not finish in time"


def test_pdfs_rendered_ahead_are_the_bytes_the_sender_would_render(
    twins: Twins, prerender: Prerenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = InMemoryDocuments()
    invoices = [numbered(n, lines=PDF_MAX_LINES + 1 if n == 2 else 3) for n in range(1, 5)]
    for stored, event in invoices:
        documents.put(stored)
        twins.send(event, topic=twins.invoices_topic)
    in_sender: list[str] = []  # renders in the sender's own process (the pool's are not seen)

    def counting(doc: Document) -> bytes:
        in_sender.append(doc.number)
        return render_pdf(doc)

    monkeypatch.setattr(attachments, "render_pdf", counting)
    stop = threading.Event()
    s = sender_of(twins, documents, prerender, stop)
    run_until(s, stop, lambda: len(twins.mail.sent) == len(invoices))
    assert in_sender == []  # every PDF came from the render processes
    by_number = {stored.number: stored for stored, _ in invoices}
    for sent in twins.mail.sent:
        files = list(sent.message.iter_attachments())
        stored = by_number[str(files[0].get_filename()).removesuffix(".pdf")]
        assert files[0].get_content() == render_pdf(stored)
        if len(files) == 2:  # the long one: the CSV of every line too
            assert files[1].get_content().encode("utf-8") == lines_csv(stored)
    assert sorted(m.message["X-Invoice-Id"] for m in twins.mail.sent) == sorted(
        stored.document_id for stored, _ in invoices
    )
    assert len(prerender) == 0  # nothing left pending after the poll


def test_nothing_is_rendered_ahead_for_a_final_email_or_a_zero_total(
    twins: Twins, prerender: Prerenderer
) -> None:
    documents = InMemoryDocuments()
    (sent_doc, sent_event), (zero_doc, zero_event), (new_doc, new_event) = (
        numbered(n) for n in (11, 12, 13)
    )
    zero_event = zero_event.model_copy(update={"total": Decimal("0.004")})
    for stored in (sent_doc, zero_doc, new_doc):
        documents.put(stored)
    deliveries = InMemoryDeliveryStore(twins.db, lock_timeout_s=2.0)
    stop = threading.Event()
    s = sender_of(twins, documents, prerender, stop)
    twins.send(sent_event, topic=twins.invoices_topic)
    run_until(s, stop, lambda: len(twins.mail.sent) == 1)  # its row is 'sent' now
    started = prerender.prepare(
        [sent_event, zero_event, new_event],
        deliveries=deliveries,
        documents=documents,
        domain="invoicing.local",
    )
    assert started == 1 and len(prerender) == 1
    files = prerender.take(document_ref(new_event))
    assert files is not None and files.pdf.content == render_pdf(new_doc)
    assert prerender.take(document_ref(sent_event)) is None  # never submitted


def test_a_render_failure_in_a_process_is_the_senders_render_failure(
    prerender: Prerenderer,
) -> None:
    stored, event = numbered(21)
    broken = samples.invoice(
        3, document_id=stored.document_id, number=stored.number, currency="XTS"
    )
    ref = document_ref(event)
    assert prerender.submit(broken, ref)
    with pytest.raises(RenderError) as ahead:
        prerender.take(ref)
    with pytest.raises(RenderError) as here:
        attachments.stored_pdf(broken, ref)
    assert ahead.value.reason == here.value.reason


def test_a_dead_render_process_leaves_the_pdf_to_the_sender_and_is_replaced() -> None:
    pool = Prerenderer(1, limit=2)
    try:
        stored, event = numbered(31)
        ref = document_ref(event)
        assert pool.submit(stored, ref) and pool.take(ref) is not None  # started, warm
        for pid in list(pool._pool._processes):  # the native layout code crashing
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        pool.submit(stored, ref)
        assert pool.take(ref) is None  # the sender renders this one itself
        assert pool.submit(stored, ref)  # a new pool for the next records
        files = pool.take(ref)
        assert files is not None and files.pdf.content == render_pdf(stored)
    finally:
        pool.close()


def test_a_hung_render_process_is_killed_after_the_timeout_and_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = Prerenderer(1, limit=2)  # the default timeout while the process starts
    hung: list[multiprocessing.process.BaseProcess] = []
    try:
        stored, event = numbered(32)
        ref = document_ref(event)
        assert pool.submit(stored, ref) and pool.take(ref) is not None  # started, warm
        hung = list(pool._pool._processes.values())
        for process in hung:  # the native layout code stuck: the process never answers
            assert process.pid is not None
            os.kill(process.pid, signal.SIGSTOP)
        pool.timeout_s = 0.5
        timeouts = REGISTRY.get_sample_value("invoicing_email_render_timeouts_total") or 0.0
        assert pool.submit(stored, ref)
        started = time.monotonic()
        with caplog.at_level("ERROR", logger="streams.apps.email.prerender"):
            assert pool.take(ref) is None  # the sender renders this one itself
        waited = time.monotonic() - started
        assert 0.45 <= waited < 0.5 + 5.0  # the timeout, then the kill (not for ever)
        assert [p.is_alive() for p in hung] == [False] * len(hung)  # killed, reaped
        assert ref.document_key in caplog.text and "0.5 s" in caplog.text
        assert REGISTRY.get_sample_value("invoicing_email_render_timeouts_total") == timeouts + 1
        pool.timeout_s = 30.0  # the new pool's process starts (about a second)
        assert pool.submit(stored, ref)  # a new pool for the next records
        files = pool.take(ref)
        assert files is not None and files.pdf.content == render_pdf(stored)
        assert set(pool._pool._processes).isdisjoint(p.pid for p in hung)
    finally:
        for process in hung:  # a failed assertion must not leave it stopped
            if process.is_alive():
                process.kill()
        pool.close()


def test_a_hung_render_process_does_not_hold_the_stop() -> None:
    pool = Prerenderer(1, limit=2)
    hung: list[multiprocessing.process.BaseProcess] = []
    try:
        stored, event = numbered(33)
        ref = document_ref(event)
        assert pool.submit(stored, ref) and pool.take(ref) is not None  # started, warm
        hung = list(pool._pool._processes.values())
        for process in hung:
            assert process.pid is not None
            os.kill(process.pid, signal.SIGSTOP)
        assert pool.submit(stored, ref)  # in the stopped process when the sender stops
        pool.timeout_s = 0.5
        started = time.monotonic()
        pool.close()
        assert time.monotonic() - started < 0.5 + 5.0  # the timeout, then the kill
        assert [p.is_alive() for p in hung] == [False] * len(hung)
    finally:
        for process in hung:
            if process.is_alive():
                process.kill()
        pool.close()


@pytest.mark.parametrize("timeout_s", [0.0, -1.0, float("nan")])
def test_a_render_timeout_not_above_zero_is_refused(timeout_s: float) -> None:
    with pytest.raises(pydantic.ValidationError, match="email_render_timeout_s"):
        WorkerSettings.model_validate({"email_render_timeout_s": timeout_s})
    with pytest.raises(ValueError, match="timeout_s > 0"):
        Prerenderer(1, timeout_s=timeout_s)
    assert WorkerSettings().email_render_timeout_s == 30.0  # the default


def test_a_transient_failure_gives_back_the_rest_of_the_poll_in_order(
    twins: Twins, prerender: Prerenderer
) -> None:
    documents = InMemoryDocuments()
    invoices = [numbered(n) for n in range(41, 45)]
    for n, (stored, event) in enumerate(invoices):  # two partitions, alternating
        documents.put(stored)
        customer = twins.customer_on(n % 2)
        twins.send(event.model_copy(update={"customer_id": customer}), topic=twins.invoices_topic)
    refusals = [SmtpTransientError("421 try again later", 421)] * 2
    real_send = twins.mail.send

    def flaky(*args: object, **kwargs: object) -> None:
        if len(twins.mail.sent) == 1 and refusals:  # the second email of the poll
            raise refusals.pop()
        real_send(*args, **kwargs)  # type: ignore[arg-type]

    twins.mail.send = flaky  # type: ignore[method-assign]
    stop = threading.Event()
    s = sender_of(twins, documents, prerender, stop)
    s.retry_budget_s = 0.01  # give the record back at its first refusal
    run_until(s, stop, lambda: len(twins.mail.sent) == len(invoices))
    sent = [m.message["X-Invoice-Id"] for m in twins.mail.sent]
    assert sorted(sent) == sorted(stored.document_id for stored, _ in invoices)
    assert len(set(sent)) == len(sent)  # each once
    committed = twins.committed(twins.invoices_topic, twins.settings.worker.email_group)
    assert sum(committed.values()) == len(invoices) and len(committed) == 2


def test_first_of_each_partition_is_where_each_partition_resumes(twins: Twins) -> None:
    a, b = twins.customer_on(0), twins.customer_on(1)
    for customer in (a, a, b, a, b):
        twins.customer(customer)
    consumer = twins.kafka.consumer("g")
    consumer.subscribe([twins.topic])
    records = consumer.consume(10, 1.0)
    assert len(records) == 5
    firsts = [(m.partition(), m.offset()) for m in first_of_each_partition(records[1:])]
    by_partition: dict[int | None, int | None] = {}
    for m in records[1:]:
        by_partition.setdefault(m.partition(), m.offset())
    assert firsts == list(by_partition.items())


def test_a_stop_mid_poll_gives_the_rest_back_to_the_next_poll(
    twins: Twins, prerender: Prerenderer
) -> None:
    documents = InMemoryDocuments()
    invoices = [numbered(n) for n in range(51, 55)]
    for stored, event in invoices:
        documents.put(stored)
        twins.send(event, topic=twins.invoices_topic)
    stop = threading.Event()
    real_send = twins.mail.send

    def stopping(*args: object, **kwargs: object) -> None:
        real_send(*args, **kwargs)  # type: ignore[arg-type]
        stop.set()  # SIGTERM while the first email of the poll goes out

    twins.mail.send = stopping  # type: ignore[method-assign]
    s = sender_of(twins, documents, prerender, stop)
    s.run(poll_timeout_s=0.5, pause_s=0.05)
    assert len(twins.mail.sent) == 1  # the record in hand finished, the rest given back
    twins.mail.send = real_send  # type: ignore[method-assign]
    stop.clear()
    run_until(s, stop, lambda: len(twins.mail.sent) == len(invoices))  # the same consumer
    sent = [m.message["X-Invoice-Id"] for m in twins.mail.sent]
    assert sorted(sent) == sorted(stored.document_id for stored, _ in invoices)
