"""What a FOCUS file says each (customer, month) must be invoiced, read with ``csv`` only."""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

#: The bundled sample, relative to the project root.
DEFAULT_SAMPLE = Path("examples/focus/focus_sample.csv")


@dataclass(frozen=True)
class Expected:
    """What the file says each (customer, period) must be invoiced: exact sums and
    currency; ``rows`` summed, and ``unreadable`` rows (line number, reason) that
    could not be attributed to a (customer, period)."""

    sums: dict[tuple[str, str], Decimal]
    currency: dict[tuple[str, str], str]
    rows: int
    unreadable: tuple[tuple[int, str], ...] = ()

    @property
    def periods(self) -> list[str]:
        return sorted({period for _, period in self.sums})


def _utc_month(text: str) -> str:
    """``YYYY-MM`` of a FOCUS date-time in UTC: without an offset it is UTC (FOCUS 1.0
    requires UTC date-times), with one it is converted. Raises ValueError otherwise."""
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return f"{moment.year:04d}-{moment.month:02d}"


def expected_from_file(path: Path, *, customer_prefix: str = "") -> Expected:
    """Exact sum of ``BilledCost`` per (``SubAccountId``, UTC month of
    ``BillingPeriodStart``) of a FOCUS CSV, read with the standard ``csv`` module only.

    Deliberately independent of the importer (:mod:`streams.core.domain.focus`): a row the
    importer maps wrongly or skips shows up as a mismatch here instead of dropping out
    of both sides. Rows without a usable ``SubAccountId``, ``BillingPeriodStart``,
    ``BilledCost`` or ``BillingCurrency`` (empty or the literal ``NULL``) are listed
    in ``unreadable`` with their line number (the header is line 1). Money is
    ``Decimal``; nothing is rounded here.

    Raises:
        OSError: the file cannot be read.
    """
    sums: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    currency: dict[tuple[str, str], str] = {}
    unreadable: list[tuple[int, str]] = []
    rows = 0
    with path.open(newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            line = reader.line_num
            values = {
                name: (row.get(name) or "").strip()
                for name in ("SubAccountId", "BillingPeriodStart", "BilledCost", "BillingCurrency")
            }
            empty = [name for name, value in values.items() if value in ("", "NULL")]
            if empty:
                unreadable.append((line, f"missing {', '.join(empty)}"))
                continue
            try:
                period = _utc_month(values["BillingPeriodStart"])
                amount = Decimal(values["BilledCost"])
            except (ValueError, ArithmeticError) as exc:
                unreadable.append((line, f"unreadable value: {exc}"))
                continue
            if not amount.is_finite():
                unreadable.append((line, f"BilledCost {values['BilledCost']!r} is not finite"))
                continue
            key = (customer_prefix + values["SubAccountId"], period)
            sums[key] += amount
            currency[key] = values["BillingCurrency"]
            rows += 1
    return Expected(dict(sums), currency, rows, tuple(unreadable))
