"""PDF rendering cost per line (docs/benchmarks.md, "PDF").

``python -m benchmarks.bench_pdf [--lines 1,100,1000,3000] [--repeat 3]`` renders a
pre-priced invoice of N lines with :func:`streams.adapters.documents.pdf.render_pdf` (at
most ``PDF_MAX_LINES`` laid out) and prints, per N, the best of ``--repeat`` runs: that
PDF, the HTML alone (Jinja2, the same template), milliseconds per line above the same
run's 1-line document (WeasyPrint's fixed cost of a page, fonts and file), and the same
document with **every** line laid out (the same run's baseline: what the PDF cost before
it was bounded), and the same bounded PDF laid out from the HTML with the style sheet
inlined and a new font configuration per render (the same run's baseline of the parsed
sheet that :func:`~streams.adapters.documents.pdf.render_pdf` keeps per thread). Run it
alone on a quiet machine; it prints the load average at the start.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime
from decimal import Decimal

from streams.adapters.documents.pdf import render_document_html, render_pdf
from streams.adapters.documents.templates import render
from streams.core.domain.documents import Document, DocumentLine, DocumentTax, LineGroup


def document(lines: int) -> Document:
    """A pre-priced invoice of ``lines`` lines of 1.234567 USD, 6.5 % tax."""
    subtotal = Decimal("1.234567") * lines
    return Document(
        kind="invoice",
        document_id="3f2504e0-4f89-11d3-9a0c-0305e82c3301",
        number="INV-2026-10-000042",
        customer_id="cust-1",
        customer_name="Acme Corp",
        billing_period="2026-10",
        currency="USD",
        issued_at=datetime(2026, 11, 1, tzinfo=UTC),
        subtotal=subtotal,
        tax_total=Decimal(0),
        total=subtotal,
        taxes=(DocumentTax("US-WA-STD", Decimal("0.065"), subtotal, Decimal(0)),),
        groups=(
            LineGroup(
                None,
                tuple(
                    DocumentLine(
                        f"Compute: m5.large hours, us-east-1, line {i}",
                        Decimal("1.234567"),
                        Decimal("3"),
                        "h",
                    )
                    for i in range(lines)
                ),
            ),
        ),
        line_count=lines,
    )


def every_line_pdf(doc: Document) -> bytes:
    """The baseline: the same template with every line laid out (no bound)."""
    from weasyprint import HTML

    return bytes(HTML(string=render("document.html.j2", doc=doc, lines_file=None)).write_pdf())


def inlined_sheet_pdf(doc: Document) -> bytes:
    """The baseline of the parsed sheet: the bounded PDF's HTML with its ``<style>``
    inlined, parsed again by WeasyPrint, fontconfig set up again (the renderer before)."""
    from weasyprint import HTML

    return bytes(HTML(string=render_document_html(doc)).write_pdf())


def best(fn: object, repeat: int) -> float:
    assert callable(fn)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", default="1,100,1000,3000")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    render_pdf(document(1))  # load Pango and the fonts once
    sizes = [int(n) for n in args.lines.split(",")]
    base = best(lambda: render_pdf(document(1)), args.repeat)
    print(
        f"{'lines':>6} {'pdf s':>8} {'html s':>8} {'ms/line above 1 line':>21} {'bytes':>9}"
        f" {'every line s':>13} {'ratio':>6} {'inlined sheet s':>16} {'ratio':>6}"
    )
    print(f"{1:>6} {base:>8.3f} {'':>8} {'(1-line baseline)':>21}")
    for n in sizes:
        doc = document(n)
        pdf_s = best(lambda doc=doc: render_pdf(doc), args.repeat)
        html_s = best(lambda doc=doc: render_document_html(doc), args.repeat)
        size = len(render_pdf(doc))
        per_line = (pdf_s - base) * 1000 / max(1, n - 1)
        full_s = best(lambda doc=doc: every_line_pdf(doc), args.repeat)
        inlined_s = best(lambda doc=doc: inlined_sheet_pdf(doc), args.repeat)
        print(
            f"{n:>6} {pdf_s:>8.3f} {html_s:>8.3f} {per_line:>21.2f} {size:>9}"
            f" {full_s:>13.3f} {pdf_s / full_s:>6.3f} {inlined_s:>16.3f} {pdf_s / inlined_s:>6.3f}"
        )


if __name__ == "__main__":
    main()
