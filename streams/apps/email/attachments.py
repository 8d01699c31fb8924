"""What an email carries beside its text: the document's PDF, the CSV of every line when
the PDF shows only the largest ones, and the link to its hosted page (docs/email.md).

The PDF is rendered from the **stored** document (every line), never from the event (which
carries a pre-priced invoice's largest lines only), so the attachment and the hosted
page's download are the same bytes (:mod:`streams.adapters.documents.pdf`). An event
whose document is not stored cannot have happened through the outbox (the event and the
rows are written in one transaction): it is a render failure, recorded ``'skipped'``.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.adapters.documents.lines_csv import lines_csv, lines_csv_filename
from streams.adapters.documents.pdf import PdfError, needs_lines_csv, pdf_filename, render_pdf
from streams.adapters.documents.source import DocumentSource
from streams.apps.email.errors import RenderError
from streams.apps.email.render import Attachment, DocumentRef
from streams.core.domain.documents import Document, DocumentKind
from streams.core.domain.money import InvalidAmount, UnknownCurrency

__all__ = ["DocumentFiles", "document_pdf", "stored_document", "stored_pdf"]


@dataclass(frozen=True)
class DocumentFiles:
    """The files of a document's email: its PDF, and the CSV of every line when the PDF
    shows only the largest ones (:data:`streams.adapters.documents.pdf.PDF_MAX_LINES`)."""

    pdf: Attachment
    lines: Attachment | None = None


def stored_document(documents: DocumentSource, ref: DocumentRef) -> Document | None:
    """The stored document ``ref`` names (every line), None when it is not stored.

    Raises:
        psycopg.Error: the database failed (classified by the caller).
    """
    kind: DocumentKind = "credit_note" if ref.document_type == "credit_note" else "invoice"
    return documents.load(kind, ref.document_id)


def document_pdf(documents: DocumentSource, ref: DocumentRef) -> DocumentFiles:
    """The PDF (and CSV of lines) of the stored document ``ref`` names, named after its
    number.

    Raises:
        RenderError: the document is not stored, or its PDF cannot be rendered.
        psycopg.Error: the database failed (classified by the caller).
    """
    stored = stored_document(documents, ref)
    if stored is None:
        raise RenderError(f"{ref.document_key} is not stored: no PDF can be made")
    return stored_pdf(stored, ref)


def stored_pdf(stored: Document, ref: DocumentRef) -> DocumentFiles:
    """The PDF of ``stored`` (loaded already, every line) named after its number, and
    the CSV of every line when the PDF leaves some out.

    Raises:
        RenderError: its PDF or CSV cannot be rendered.
    """
    try:
        pdf = Attachment(pdf_filename(stored), render_pdf(stored))
        lines = (
            Attachment(lines_csv_filename(stored), lines_csv(stored), "text", "csv")
            if needs_lines_csv(stored)
            else None
        )
    except (PdfError, UnknownCurrency, InvalidAmount, ValueError) as exc:
        raise RenderError(f"PDF of {ref.document_key}: {exc}") from exc
    return DocumentFiles(pdf, lines)
