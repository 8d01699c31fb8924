"""The CSV of every line (streams/adapters/documents/lines_csv.py) and the largest-lines
view the PDF shows (streams/core/domain/documents.py::largest_only)."""

from __future__ import annotations

import csv
import dataclasses
import io
from decimal import Decimal

import pytest

from streams.adapters.documents.lines_csv import HEADER, lines_csv, lines_csv_filename
from streams.core.domain.documents import Document, DocumentLine, LineGroup, largest_only
from tests.unit.documents import samples


def rows(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))


def with_lines(*lines: DocumentLine) -> Document:
    return dataclasses.replace(
        samples.invoice(), groups=(LineGroup(None, lines),), line_count=len(lines)
    )


def test_every_line_exactly_in_line_order_with_crlf() -> None:
    doc = with_lines(
        DocumentLine("Compute, us-east-1", Decimal("12.004601"), Decimal("3"), "h"),
        DocumentLine('Storage "hot"', Decimal("199"), None, None),
        DocumentLine("Refund", Decimal("-0.5")),
    )
    data = lines_csv(doc)
    assert data.count(b"\r\n") == 4 and not data.startswith(b"\xef\xbb\xbf")
    assert rows(data) == [
        list(HEADER),
        ["1", "Compute, us-east-1", "3", "h", "12.004601", "USD"],
        ["2", 'Storage "hot"', "", "", "199.00", "USD"],
        ["3", "Refund", "", "", "-0.50", "USD"],
    ]
    assert lines_csv(doc) == data  # the same bytes for the same document
    assert lines_csv_filename(doc) == "INV-2026-10-000042-lines.csv"


@pytest.mark.parametrize("text", ["=HYPERLINK(1)", "+1", "-2+3", "@SUM(A1)", "\tx"])
def test_what_a_spreadsheet_would_run_is_prefixed(text: str) -> None:
    (_, row) = rows(lines_csv(with_lines(DocumentLine(text, Decimal(1), Decimal(1), text))))
    assert row[1] == f"'{text}" and row[3] == f"'{text}"


def test_a_partial_view_has_no_csv() -> None:
    doc = largest_only(samples.invoice(lines=5), 2)
    with pytest.raises(ValueError, match="does not hold every line"):
        lines_csv(doc)


def test_largest_only_keeps_the_largest_by_absolute_amount_ties_in_line_order() -> None:
    doc = with_lines(
        DocumentLine("a", Decimal("1")),
        DocumentLine("b", Decimal("-5")),
        DocumentLine("c", Decimal("3")),
        DocumentLine("d", Decimal("3")),
        DocumentLine("e", Decimal("0")),
    )
    shown = largest_only(doc, 3)
    assert [line.description for line in shown.lines] == ["b", "c", "d"]
    assert not shown.lines_complete and shown.line_count == 5
    assert (shown.subtotal, shown.total, shown.taxes) == (doc.subtotal, doc.total, doc.taxes)
    assert largest_only(doc, 5) is doc  # within the bound: unchanged


def test_largest_only_leaves_rated_invoices_and_credit_notes_whole() -> None:
    rated = dataclasses.replace(samples.invoice(lines=9), exact_total=Decimal("108.041409"))
    assert largest_only(rated, 2) is rated
    note = samples.credit_note()
    assert largest_only(note, 1) is note
    with pytest.raises(ValueError, match="at least 1"):
        largest_only(samples.invoice(), 0)
