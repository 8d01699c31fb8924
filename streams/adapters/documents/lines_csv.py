"""Every line of a document as a CSV file, the companion of a PDF that shows only the
largest lines (docs/email.md, "The PDF").

Format: RFC 4180 (comma-separated, ``CRLF`` line ends, fields quoted when they hold a
comma, a quote or a line break), UTF-8 without a byte-order mark, a header row
``line,description,quantity,unit,amount,currency``; one row per line in line order
(``line`` counts from 1). Amounts are exact (the stored value, never rounded, with at
least the currency's minor-unit decimals: ``199.00``, ``0.0123456``) in the currency's
units, no thousands separators; quantities exact, empty when unknown.

Text fields that a spreadsheet would read as a formula (starting with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return) are prefixed with ``'``, as OWASP's "CSV
Injection" page recommends: a usage description comes from a customer's own events.

The bytes are a function of the stored document only, like its PDF's.
"""

from __future__ import annotations

import csv
import io

from streams.core.domain.documents import Document
from streams.core.domain.formatting import format_exact
from streams.core.domain.money import canonical_decimal

__all__ = ["HEADER", "lines_csv", "lines_csv_filename"]

#: The header row.
HEADER = ("line", "description", "quantity", "unit", "amount", "currency")

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _text(value: str | None) -> str:
    if not value:
        return ""
    return f"'{value}" if value.startswith(_FORMULA_STARTS) else value


def lines_csv_filename(doc: Document) -> str:
    """``INV-2026-10-000042-lines.csv``: the PDF's name with ``-lines.csv``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in doc.number)
    return f"{safe or doc.document_id}-lines.csv"


def lines_csv(doc: Document) -> bytes:
    """Every line ``doc`` shows, as the CSV described in the module docstring (UTF-8).

    ``doc`` is the stored document with every line (``lines_complete``); a document that
    shows only part of its lines would give a partial file, so it is refused.

    Raises:
        ValueError: ``doc.lines_complete`` is false.
        UnknownCurrency: not a currency we bill in.
    """
    if not doc.lines_complete:
        raise ValueError(f"{doc.title} does not hold every line: no CSV of its lines")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(HEADER)
    for n, line in enumerate(doc.lines, start=1):
        writer.writerow(
            (
                n,
                _text(line.description),
                "" if line.quantity is None else format(canonical_decimal(line.quantity), "f"),
                _text(line.unit),
                format_exact(line.amount, doc.currency).replace(",", ""),
                doc.currency,
            )
        )
    return out.getvalue().encode("utf-8")
