"""A document's PDF: ``document.html.j2`` rendered, then laid out by WeasyPrint
(docs/decisions/0050-pdf-rendering.md).

**Same bytes for the same document.** The PDF is a function of the stored document only:
the template shows no status, link, event id or clock; WeasyPrint writes no creation
date unless the HTML names one, and derives the file identifier from the content; the
fonts are DejaVu Sans (Debian ``fonts-dejavu-core``, installed by ``scripts/setup.sh``)
subset into the file. So the email sender and the hosted page produce the same bytes for
one document revision on machines set up alike (same WeasyPrint, Pango and fonts:
pinned in ``pyproject.toml`` and ``scripts/setup.sh``). ``tests/unit/documents`` checks it.

**Bounded.** WeasyPrint's cost grows with every table row it lays out (a few milliseconds
per line: docs/benchmarks.md, "PDF"), so the PDF of a pre-priced invoice of more than
:data:`PDF_MAX_LINES` lines shows its largest lines
(:func:`streams.core.domain.documents.largest_only`) and says that every line is in the CSV
file sent with it (:mod:`.lines_csv`) and on the hosted page. A constant, not a setting:
the email sender and the portal must render the same bytes.

**Parsed once.** WeasyPrint parses a ``<style>`` element and sets up fontconfig on every
render; the style sheet is the same for every document, so each thread keeps one parsed
:class:`weasyprint.CSS` and one ``FontConfiguration`` (WeasyPrint's documented way to share
them: ``write_pdf(stylesheets=…, font_config=…)``) and the PDF's HTML carries no
``<style>``. Same bytes as with the inlined sheet (a unit test compares them); about 0.84 of
the time per PDF (docs/benchmarks.md, "PDF"). Per thread, because the portal renders in
its executor's threads and a font configuration holds Pango/fontconfig objects.

Errors: :class:`PdfError` when the document cannot be laid out (a bug of the template or
of the renderer); the filters' ``UnknownCurrency`` / ``InvalidAmount`` propagate.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from streams.adapters.documents.lines_csv import lines_csv_filename
from streams.adapters.documents.templates import render, stylesheet
from streams.core.domain.documents import Document, largest_only
from streams.errors import InvoicingError

__all__ = [
    "PDF_MAX_LINES",
    "PdfError",
    "needs_lines_csv",
    "pdf_filename",
    "render_document_html",
    "render_pdf",
]

#: Most lines a PDF lays out: with the summary and the totals, one A4 page, so WeasyPrint
#: lays it out once (a second page costs a second pass for "Page n of m"). More lines go
#: to the CSV of every line. Measured in docs/benchmarks.md ("PDF").
PDF_MAX_LINES = 25

#: WeasyPrint and fontTools log every font subset at INFO/DEBUG; keep them quiet.
for _name in ("weasyprint", "fontTools"):
    logging.getLogger(_name).setLevel(logging.WARNING)


class PdfError(InvoicingError):
    """The document's PDF could not be rendered."""


def needs_lines_csv(doc: Document) -> bool:
    """Whether ``doc``'s PDF leaves lines out, so that the CSV of every line goes with it."""
    return largest_only(doc, PDF_MAX_LINES) is not doc


def render_document_html(doc: Document, *, inline_css: bool = True) -> str:
    """The HTML the PDF is laid out from (``document.html.j2``): at most
    :data:`PDF_MAX_LINES` lines of ``doc`` (the stored document, every line), with the
    style sheet inlined (default) or, with ``inline_css=False``, without it (the renderer
    passes its parsed copy)."""
    shown = largest_only(doc, PDF_MAX_LINES)
    lines_file = None if shown is doc else lines_csv_filename(doc)
    extra = {} if inline_css else {"css": ""}
    return render("document.html.j2", doc=shown, lines_file=lines_file, **extra)


_parsed = threading.local()


def _style() -> tuple[Any, Any]:
    """This thread's parsed style sheet and font configuration (built on first use)."""
    found = getattr(_parsed, "style", None)
    if found is None:
        from weasyprint import CSS
        from weasyprint.text.fonts import FontConfiguration

        fonts = FontConfiguration()
        found = (CSS(string=stylesheet(), font_config=fonts), fonts)
        _parsed.style = found
    return found


def pdf_filename(doc: Document) -> str:
    """The PDF's file name: the document number, ``INV-2026-10-000042.pdf``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in doc.number)
    return f"{safe or doc.document_id}.pdf"


def render_pdf(doc: Document) -> bytes:
    """The PDF of ``doc`` (the stored document, every line; A4, page numbers "Page n of
    m"), deterministic bytes, at most :data:`PDF_MAX_LINES` lines laid out.

    Raises:
        PdfError: WeasyPrint failed to lay the document out.
    """
    html = render_document_html(doc, inline_css=False)
    from weasyprint import HTML  # imported here: loading Pango takes a second

    try:
        css, fonts = _style()
        data = HTML(string=html).write_pdf(stylesheets=[css], font_config=fonts)
    except Exception as exc:  # WeasyPrint raises whatever its layout code meets
        raise PdfError(f"cannot render the PDF of {doc.title}: {exc}") from exc
    if not data:
        raise PdfError(f"WeasyPrint returned no PDF for {doc.title}")
    return bytes(data)
