"""The email sender attaches the stored document's PDF and links the hosted page (twins:
in-memory Kafka, deliveries, mail transport and documents)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest

from streams.adapters.documents.lines_csv import lines_csv
from streams.adapters.documents.pdf import PDF_MAX_LINES, render_pdf
from streams.adapters.documents.source import InMemoryDocuments
from streams.adapters.documents.tokens import PageLinks, TokenSigner
from streams.adapters.memory.store import tables
from streams.apps.email import attachments
from streams.apps.email.prerender import Prerenderer
from streams.apps.email.sender import EmailSender, Outcome
from streams.apps.email.twin import InMemoryDeliveryStore
from streams.core.domain.documents import Document
from streams.core.domain.events import InvoiceIssued, InvoiceVoided, TaxAmount
from streams.settings import Settings
from tests.support.twins import Twins
from tests.unit.documents import samples


@pytest.fixture
def twins(settings: Settings) -> Twins:
    return Twins.create(settings)


def sender(
    twins: Twins,
    documents: InMemoryDocuments,
    links: PageLinks,
    *,
    prerender: Prerenderer | None = None,
    stop: threading.Event | None = None,
) -> EmailSender:
    consumer = twins.kafka.consumer(twins.settings.worker.email_group)
    consumer.subscribe([twins.invoices_topic])
    return EmailSender(
        twins.settings,
        deliveries=InMemoryDeliveryStore(twins.db, lock_timeout_s=2.0),
        consumer=consumer,
        transport=twins.mail,
        documents=documents,
        links=links,
        prerender=prerender,
        stop=stop,
    )


def event_of(doc_lines: int = 3) -> InvoiceIssued:
    return InvoiceIssued(
        invoice_id=samples.INVOICE_ID,
        invoice_number="INV-2026-10-000042",
        revision=1,
        customer_id="cust-1",
        customer_name='Acme <Corp> & "Sons"',
        email="ap@acme.example",
        billing_period="2026-10",
        currency="USD",
        line_count=doc_lines,
        subtotal=Decimal("36.01"),
        tax_total=Decimal("2.34"),
        total=Decimal("38.35"),
        taxes=(
            TaxAmount(
                tax_code="US-WA-STD",
                rate=Decimal("0.065"),
                taxable_amount=Decimal("36.01"),
                amount=Decimal("2.34"),
            ),
        ),
        issued_at=samples.ISSUED,
    )


def handle_next(s: EmailSender) -> Outcome:
    consumer = s._consumer
    assert consumer is not None
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        msg = consumer.poll(0.05)
        if msg is not None and msg.error() is None:
            return s.handle(msg).outcome
    raise AssertionError("no record came")


LINKS = PageLinks("https://billing.example", TokenSigner(["k" * 32]), timedelta(days=90))


def test_the_email_carries_the_stored_documents_pdf_and_the_page_link(twins: Twins) -> None:
    documents = InMemoryDocuments()
    stored = samples.invoice()
    documents.put(stored)
    twins.send(event_of(), event_id=str(uuid.uuid4()), topic=twins.invoices_topic)
    assert handle_next(sender(twins, documents, LINKS)) is Outcome.SENT
    (sent,) = twins.mail.sent
    message = sent.message
    assert message.get_content_type() == "multipart/mixed"
    (attachment,) = list(message.iter_attachments())
    assert attachment.get_content_type() == "application/pdf"
    assert attachment.get_filename() == "INV-2026-10-000042.pdf"
    assert attachment.get_content() == render_pdf(stored)  # the stored document's bytes
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    link = LINKS.url("invoice", samples.INVOICE_ID, samples.ISSUED)
    assert f"View it online: {link}" in text.get_content()
    assert f'href="{link}"' in html.get_content()


def test_a_long_invoice_also_carries_the_csv_of_every_line(twins: Twins) -> None:
    documents = InMemoryDocuments()
    stored = samples.invoice(lines=PDF_MAX_LINES + 1)
    documents.put(stored)
    twins.send(event_of(PDF_MAX_LINES + 1), event_id=str(uuid.uuid4()), topic=twins.invoices_topic)
    assert handle_next(sender(twins, documents, LINKS)) is Outcome.SENT
    (sent,) = twins.mail.sent
    pdf, lines = list(sent.message.iter_attachments())
    assert pdf.get_content() == render_pdf(stored)
    assert lines.get_content_type() == "text/csv"
    assert lines.get_filename() == "INV-2026-10-000042-lines.csv"
    assert lines.get_content().encode("utf-8") == lines_csv(stored)
    text = sent.message.get_body(("plain",))
    assert text is not None
    assert "is attached: INV-2026-10-000042-lines.csv" in text.get_content()


def test_a_redelivered_or_republished_record_renders_no_pdf(
    twins: Twins, monkeypatch: pytest.MonkeyPatch
) -> None:
    documents = InMemoryDocuments()
    documents.put(samples.invoice())
    renders: list[str] = []

    def counting(doc: Document) -> bytes:
        renders.append(doc.document_id)
        return render_pdf(doc)

    monkeypatch.setattr(attachments, "render_pdf", counting)
    event_id = str(uuid.uuid4())
    for again in (event_id, event_id, str(uuid.uuid4())):
        twins.send(event_of(), event_id=again, topic=twins.invoices_topic)
    s = sender(twins, documents, LINKS)
    assert [handle_next(s) for _ in range(3)] == [
        Outcome.SENT,
        Outcome.DUPLICATE,
        Outcome.DUPLICATE,
    ]
    assert renders == [samples.INVOICE_ID] and len(twins.mail.sent) == 1


def test_an_event_whose_document_is_not_stored_is_recorded_not_rendered(twins: Twins) -> None:
    twins.send(event_of(), event_id=str(uuid.uuid4()), topic=twins.invoices_topic)
    assert handle_next(sender(twins, InMemoryDocuments(), LINKS)) is Outcome.SKIPPED
    assert twins.mail.sent == []
    (row,) = twins.rows(tables.EMAIL_DELIVERIES)
    assert row.status == "skipped"
    assert row.skip_reason.startswith("render_failed: ") and "is not stored" in row.skip_reason


def void_of(reason: str = "billed to <the> wrong entity") -> InvoiceVoided:
    return InvoiceVoided(
        invoice_id=samples.INVOICE_ID,
        invoice_number="INV-2026-10-000042",
        revision=1,
        customer_id="cust-1",
        billing_period="2026-10",
        reason=reason,
        voided_at=samples.ISSUED + timedelta(days=3),
    )


def test_a_void_gets_one_email_with_the_voided_invoices_pdf_and_page(twins: Twins) -> None:
    documents = InMemoryDocuments()
    stored = samples.invoice()
    documents.put(stored, recipient="ap@acme.example")
    event_id = str(uuid.uuid4())
    s = sender(twins, documents, LINKS)
    for again in (event_id, event_id, str(uuid.uuid4())):  # then a redelivery, a republish
        twins.send(void_of(), event_id=again, topic=twins.invoices_topic)
    assert [handle_next(s) for _ in range(3)] == [
        Outcome.SENT,
        Outcome.DUPLICATE,
        Outcome.DUPLICATE,
    ]
    (sent,) = twins.mail.sent
    message = sent.message
    assert sent.to_address == "ap@acme.example"
    assert message["Message-ID"] == f"<void-{samples.INVOICE_ID}-r1@invoicing.local>"
    assert message["X-Document-Key"] == f"invoice_void:{samples.INVOICE_ID}:r1"
    assert message["X-Voided-Invoice-Id"] == samples.INVOICE_ID
    assert message["X-Invoice-Id"] is None
    assert str(message["Subject"]) == "Invoice INV-2026-10-000042 for 2026-10 voided"
    (attachment,) = list(message.iter_attachments())
    assert attachment.get_content() == render_pdf(stored)  # the voided invoice's bytes
    text = message.get_body(("plain",))
    html = message.get_body(("html",))
    assert text is not None and html is not None
    assert "has been voided" in text.get_content()
    assert "Reason:          billed to <the> wrong entity" in text.get_content()
    assert "billed to &lt;the&gt; wrong entity" in html.get_content()  # escaped
    assert "2026-11-04 00:05 UTC" in text.get_content()
    link = LINKS.url("invoice", samples.INVOICE_ID, samples.ISSUED)
    assert f"View it online: {link}" in text.get_content()


def test_a_void_of_an_invoice_not_stored_is_recorded_not_sent(twins: Twins) -> None:
    twins.send(void_of(), event_id=str(uuid.uuid4()), topic=twins.invoices_topic)
    assert handle_next(sender(twins, InMemoryDocuments(), LINKS)) is Outcome.SKIPPED
    assert twins.mail.sent == []
    (row,) = twins.rows(tables.EMAIL_DELIVERIES)
    assert (row.status, row.document_key) == ("skipped", f"invoice_void:{samples.INVOICE_ID}:r1")
    assert row.skip_reason.startswith("render_failed: ") and "is not stored" in row.skip_reason
