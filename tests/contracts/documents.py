"""Contract of the stored-document source (the
:class:`~streams.adapters.documents.source.DocumentSource` port): an issued document reads
back whole, lines in order and exact; what supersedes an invoice revision.

Run on the twin (:class:`~streams.adapters.documents.source.InMemoryDocuments`) and on
PostgreSQL (:class:`~streams.adapters.documents.source.PostgresDocuments`, whose harness
writes the rows as issuance does). The documents here are written out with their figures.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.adapters.documents.source import DocumentSource
from streams.core.domain.documents import Document, DocumentLine, DocumentTax, LineGroup


@dataclass
class DocumentsHarness:
    """The source under test, and how the test stores documents and moves a status."""

    source: DocumentSource
    put: Callable[[Document], None]
    set_status: Callable[[str, str], None]


ISSUED = datetime(2026, 11, 1, 0, 5, tzinfo=UTC)
#: The address every harness stores its invoices with.
RECIPIENT = "ap@customer.example"


def invoice(revision: int = 1, supersedes: str | None = None) -> Document:
    n = uuid.uuid4().hex[:8]
    lines = (
        DocumentLine("Compute <m5.large>", Decimal("900.125"), Decimal("3"), "h"),
        DocumentLine("Storage & backup", Decimal("300.3351")),
        DocumentLine("Egress", Decimal("0.0000005862"), Decimal("1.5"), "GB"),
    )
    return Document(
        kind="invoice",
        document_id=str(uuid.uuid4()),
        number=f"INV-2026-10-{n}",
        customer_id=f"cust-{n}",
        customer_name='Acme <Corp> & "Sons"',
        billing_period="2026-10",
        currency="USD",
        issued_at=ISSUED.replace(minute=revision),
        subtotal=Decimal("1200.46"),
        tax_total=Decimal("78.03"),
        total=Decimal("1278.49"),
        taxes=(DocumentTax("US-WA-STD", Decimal("0.065"), Decimal("1200.46"), Decimal("78.03")),),
        groups=(LineGroup(None, lines),),
        line_count=3,
        lines_complete=True,
        revision=revision,
        supersedes_invoice_id=supersedes,
    )


def credit_note(of: Document) -> Document:
    return Document(
        kind="credit_note",
        document_id=str(uuid.uuid4()),
        number=f"CN-{of.number}",
        customer_id=of.customer_id,
        customer_name=of.customer_name,
        billing_period=of.billing_period,
        currency=of.currency,
        issued_at=of.issued_at.replace(hour=1),
        subtotal=of.subtotal,
        tax_total=of.tax_total,
        total=of.total,
        revision=of.revision,
        credited_invoice_id=of.document_id,
        credited_invoice_number=of.number,
        reason="replay found a difference",
    )


class DocumentsContract:
    """The document source's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> DocumentsHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_an_invoice_reads_back_whole(self, harness: DocumentsHarness) -> None:
        doc = invoice()
        harness.put(doc)
        assert harness.source.load("invoice", doc.document_id) == doc
        assert harness.source.load("invoice", doc.document_id.upper()) == doc
        state = harness.source.state("invoice", doc.document_id)
        assert state is not None and (state.status, state.superseded_by) == ("issued", ())

    def test_unknown_documents_are_none(self, harness: DocumentsHarness) -> None:
        doc = invoice()
        harness.put(doc)
        missing = str(uuid.uuid4())
        assert harness.source.load("invoice", missing) is None
        assert harness.source.state("invoice", missing) is None
        assert harness.source.load("credit_note", doc.document_id) is None  # not that kind

    def test_an_invoice_knows_the_address_it_was_issued_to(self, harness: DocumentsHarness) -> None:
        """The email of a void goes there (docs/invoices.md "Void")."""
        doc = invoice()
        harness.put(doc)
        assert harness.source.recipient(doc.document_id) == RECIPIENT
        assert harness.source.recipient(str(uuid.uuid4())) is None

    def test_a_credit_note_and_a_new_revision_supersede_the_invoice(
        self, harness: DocumentsHarness
    ) -> None:
        first = invoice()
        harness.put(first)
        note = credit_note(first)
        harness.put(note)
        second = dataclasses.replace(
            invoice(revision=2, supersedes=first.document_id),
            customer_id=first.customer_id,
        )
        harness.set_status(first.document_id, "superseded")
        harness.put(second)
        assert harness.source.load("credit_note", note.document_id) == note
        state = harness.source.state("invoice", first.document_id)
        assert state is not None
        assert state.status == "superseded"
        assert [(s.kind, s.document_id, s.number) for s in state.superseded_by] == [
            ("invoice", second.document_id, second.number),  # issued at 00:02
            ("credit_note", note.document_id, note.number),  # issued at 01:01
        ]
        note_state = harness.source.state("credit_note", note.document_id)
        assert note_state is not None and note_state.status == "issued"
