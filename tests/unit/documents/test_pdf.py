"""The document PDF (streams/adapters/documents/pdf.py): the same bytes for the same
document, read back with poppler's pdftotext, page 1 turned into a PNG with pdftoppm.

The PNG of page 1 is kept under ``.local/test-artifacts/pdf/`` for people to look at.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from streams.adapters.documents.pdf import (
    PDF_MAX_LINES,
    needs_lines_csv,
    pdf_filename,
    render_document_html,
    render_pdf,
)
from streams.core.domain.documents import Document, LineGroup
from tests.unit.documents import samples

ARTIFACTS = Path(__file__).resolve().parents[3] / ".local" / "test-artifacts" / "pdf"


def tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:  # scripts/setup.sh installs poppler-utils: a missing tool is a failure
        pytest.fail(f"{name} not found: run scripts/setup.sh (Debian poppler-utils)")
    return found


def pdftotext(pdf: bytes, tmp_path: Path, name: str = "doc") -> str:
    path = tmp_path / f"{name}.pdf"
    path.write_bytes(pdf)
    out = subprocess.run(
        [tool("pdftotext"), "-layout", str(path), "-"], check=True, capture_output=True
    )
    return out.stdout.decode()


def test_the_same_document_is_the_same_bytes() -> None:
    doc = samples.invoice()
    first = render_pdf(doc)
    again = render_pdf(dataclasses.replace(doc))  # an equal document, built again
    assert first.startswith(b"%PDF-")
    assert first == again
    other = render_pdf(dataclasses.replace(doc, revision=2))
    assert other != first  # and the bytes do depend on the document


def test_the_parsed_style_sheet_gives_the_bytes_of_the_inlined_one() -> None:
    """The renderer passes a parsed copy of the style sheet, one per thread; the PDF is the
    one WeasyPrint lays out from the HTML with the sheet inlined, in any thread."""
    from weasyprint import HTML

    doc = samples.invoice()
    inlined = HTML(string=render_document_html(doc)).write_pdf()
    assert "<style>" in render_document_html(doc)
    assert "<style>" not in render_document_html(doc, inline_css=False)
    unstyled = HTML(string=render_document_html(doc, inline_css=False)).write_pdf()
    assert unstyled != inlined  # the sheet matters, so equal bytes below mean it was applied
    assert render_pdf(doc) == inlined
    assert render_pdf(doc) == inlined  # the thread's second use of the parsed copy
    found: list[bytes] = []
    other = threading.Thread(target=lambda: found.append(render_pdf(doc)))
    other.start()
    other.join(60)
    assert found == [inlined]


def test_the_pdf_reads_back_number_lines_totals_and_tax(tmp_path: Path) -> None:
    text = pdftotext(render_pdf(samples.invoice()), tmp_path)
    assert "Invoice INV-2026-10-000042" in text
    assert "2026-10" in text
    assert 'Acme <Corp> & "Sons" (cust-1)' in text  # escaped in HTML, shown as written
    for i in range(3):
        assert f"Compute line {i}" in text
    assert text.count("12.004601 USD") == 3  # every line, exact
    assert "36.01 USD" in text  # subtotal
    assert "US-WA-STD (6.5%)" in text
    assert "2.34 USD" in text  # tax
    assert "38.35 USD" in text  # total
    assert "Page 1 of 1" in text


def long_invoice(lines: int) -> Document:
    """An invoice of ``lines`` lines, line ``i`` charging ``i`` cents plus a millionth."""
    doc = samples.invoice(lines=lines)
    shown = tuple(
        dataclasses.replace(line, amount=Decimal(i) / 100 + Decimal("0.000001"))
        for i, line in enumerate(doc.lines)
    )
    return dataclasses.replace(doc, groups=(LineGroup(None, shown),))


def test_a_pdf_lays_out_every_line_up_to_the_bound(tmp_path: Path) -> None:
    text = pdftotext(render_pdf(samples.invoice(lines=PDF_MAX_LINES)), tmp_path)
    assert all(
        f"Compute line {i}\n" in text or f"Compute line {i} " in text for i in range(PDF_MAX_LINES)
    )
    assert "lines.csv" not in text
    assert not needs_lines_csv(samples.invoice(lines=PDF_MAX_LINES))


def test_a_longer_invoice_shows_its_largest_lines_and_names_the_csv(tmp_path: Path) -> None:
    doc = long_invoice(120)
    assert needs_lines_csv(doc)
    text = pdftotext(render_pdf(doc), tmp_path)
    shown = [i for i in range(120) if f"Compute line {i}\n" in text or f"Compute line {i} " in text]
    assert shown == list(range(120 - PDF_MAX_LINES, 120))  # the largest, only them
    assert f"The {PDF_MAX_LINES} largest of 120 lines" in text
    assert "INV-2026-10-000042-lines.csv" in " ".join(text.split())
    assert "36.01 USD" in text and "38.35 USD" in text  # the document's totals stand
    assert "1.19 USD" in text  # the largest line, rounded: the exact one is in the CSV
    assert "1.19000" not in text
    # and the cost is bounded: 10x the lines, the same one page
    pages = {n: pdftotext(render_pdf(long_invoice(n)), tmp_path, f"d{n}") for n in (120, 1200)}
    assert "Page 1 of 1" in pages[120] and "Page 1 of 1" in pages[1200]


def test_a_credit_note_pdf(tmp_path: Path) -> None:
    text = pdftotext(render_pdf(samples.credit_note()), tmp_path)
    assert "Credit note CN-2026-10-000007" in text
    assert "INV-2026-10-000042 (revision 1)" in text
    assert "replay found a difference" in text
    assert "Total credited" in text and "38.35 USD" in text


def test_page_one_becomes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "invoice.pdf"
    path.write_bytes(render_pdf(samples.invoice(lines=40)))
    subprocess.run(
        [
            tool("pdftoppm"),
            "-png",
            "-r",
            "80",
            "-f",
            "1",
            "-l",
            "1",
            "-singlefile",
            str(path),
            str(tmp_path / "page1"),
        ],
        check=True,
    )
    png = (tmp_path / "page1.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width = int.from_bytes(png[16:20], "big")
    height = int.from_bytes(png[20:24], "big")
    # A4 is 595.28 x 841.89 pt; at 80 dpi 661.4 x 935.4 px, which pdftoppm rounds up
    assert (width, height) == (662, 936)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "invoice-page1.png").write_bytes(png)


def test_the_html_escapes_what_the_customer_wrote() -> None:
    html = render_document_html(samples.invoice(customer_name="<script>x</script>"))
    assert "<script>" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html


def test_fonts_are_the_pinned_dejavu_sans(tmp_path: Path) -> None:
    path = tmp_path / "doc.pdf"
    path.write_bytes(render_pdf(samples.invoice()))
    fonts = subprocess.run(
        [tool("pdffonts"), str(path)], check=True, capture_output=True
    ).stdout.decode()
    assert "DejaVuSans" in fonts.replace("-", "")
    assert "Serif" not in fonts


def test_the_file_is_named_after_the_number() -> None:
    assert pdf_filename(samples.invoice()) == "INV-2026-10-000042.pdf"
    assert pdf_filename(samples.invoice(number="INV/../x")) == "INV_.._x.pdf"


def test_rated_lines_show_how_they_were_computed(tmp_path: Path) -> None:
    from streams.core.domain.documents import DocumentLine, LineGroup

    doc = samples.invoice(
        groups=(
            LineGroup(
                "Plan relay v2 (2026-10-01..2026-10-31)",
                (
                    DocumentLine(
                        "API calls", Decimal("187.6536"), detail=("93,826.8 call x 0.002",)
                    ),
                ),
            ),
        ),
        exact_total=Decimal("187.6536"),
        subtotal=Decimal("187.65"),
    )
    text = pdftotext(render_pdf(doc), tmp_path)
    assert "Plan relay v2 (2026-10-01..2026-10-31)" in text
    assert "93,826.8 call x 0.002" in text
    assert "187.6536 USD" in text
    assert "187.65 USD" in text


def test_the_issue_time_is_shown_in_utc_whatever_zone_it_comes_in() -> None:
    from datetime import timedelta, timezone

    paris = samples.ISSUED.astimezone(timezone(timedelta(hours=1)))
    assert "2026-11-01 00:05 UTC" in render_document_html(samples.invoice(issued_at=paris))
    assert render_pdf(samples.invoice(issued_at=paris)) == render_pdf(samples.invoice())
