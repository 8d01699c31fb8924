"""``invoicing reconcile --focus FILE``: pass-through invoices against the FOCUS file they billed.

The FOCUS demo's reconciliation, as an operator command
on any database. The file is read by :func:`streams.apps.ops.focus_expected.expected_from_file`,
with the standard ``csv`` module and **independently of the importer**
(:mod:`streams.core.domain.focus`): a row the importer maps wrongly or skips shows up
here as a difference instead of dropping out of both sides.

Per (account = ``SubAccountId``, UTC month of ``BillingPeriodStart``) of the file,
and per pass-through invoice of the file's months, a :class:`FocusPair`:

==============  ==========================================================
verdict         when
==============  ==========================================================
``match``       the current invoice's subtotal = the exact sum of the pair's
                ``BilledCost`` rounded once (half-even, the currency's minor
                unit), in the file's currency
``mismatch``    it differs (amount or currency)
``missing``     the file has the pair, no issued invoice does (``note`` says
                ``held`` when the close was held)
``unexpected``  a pass-through invoice of one of the file's months whose pair
                is not in the file
==============  ==========================================================

The invoice compared is the **current** revision (``status = 'issued'``; after a
replay apply, the corrected one). A *pass-through* invoice is one with lines,
every one of them a pre-priced usage line (its ``event_id`` is a
``usage_lines`` row), and no rated charge line (``invoice_charges``): rated invoices (plans, :mod:`streams.core.domain.rating`) are
not this file's business unless the file names their pair, and then their
subtotal is compared all the same. Rows of the file that cannot be attributed to
a pair are listed (``unreadable``) and do not change the verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

import psycopg
from psycopg.rows import class_row

from streams.apps.ops.focus_expected import Expected
from streams.core.domain.money import round_money

Verdict = Literal["match", "mismatch", "missing", "unexpected"]

__all__ = ["FocusPair", "FocusReconciliation", "Verdict", "reconcile_focus"]


@dataclass(frozen=True)
class _Invoice:
    """A current issued invoice of the file's months, as compared."""

    customer_id: str
    billing_period: str
    subtotal: Decimal
    currency: str
    invoice_number: str
    #: lines, every one a pre-priced usage line, no rated charge line
    pass_through: bool


@dataclass(frozen=True)
class FocusPair:
    """One (customer, period): the file's side (``exact`` Σ ``BilledCost`` and
    ``rounded``, ``None`` for an unexpected invoice), the invoice's (``subtotal``,
    ``invoice_number``, ``invoice_currency``, ``None`` when missing) and the verdict."""

    customer_id: str
    period: str
    currency: str | None
    exact: Decimal | None
    rounded: Decimal | None
    subtotal: Decimal | None
    invoice_number: str | None
    invoice_currency: str | None
    verdict: Verdict
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (decimals as strings)."""
        return {
            "customer_id": self.customer_id,
            "period": self.period,
            "currency": self.currency,
            "exact_billed_cost": None if self.exact is None else format(self.exact, "f"),
            "rounded": None if self.rounded is None else str(self.rounded),
            "invoice_subtotal": None if self.subtotal is None else str(self.subtotal),
            "invoice_number": self.invoice_number,
            "invoice_currency": self.invoice_currency,
            "verdict": self.verdict,
            "note": self.note,
        }


@dataclass(frozen=True)
class FocusReconciliation:
    """Every pair, in (period, customer) order, and the file's unreadable rows."""

    path: str
    rows: int
    pairs: tuple[FocusPair, ...]
    unreadable: tuple[tuple[int, str], ...]

    def of(self, verdict: Verdict) -> list[FocusPair]:
        return [pair for pair in self.pairs if pair.verdict == verdict]

    @property
    def ok(self) -> bool:
        """No mismatch, missing or unexpected invoice."""
        return all(pair.verdict == "match" for pair in self.pairs)

    def counts(self) -> dict[str, int]:
        verdicts: tuple[Verdict, ...] = ("match", "mismatch", "missing", "unexpected")
        return {verdict: len(self.of(verdict)) for verdict in verdicts}

    def to_dict(self) -> dict[str, Any]:
        """The command's ``--json``."""
        return {
            "file": self.path,
            "rows": self.rows,
            "ok": self.ok,
            "counts": self.counts(),
            "pairs": [pair.to_dict() for pair in self.pairs],
            "unreadable_rows": [{"line": line, "reason": why} for line, why in self.unreadable],
        }


def reconcile_focus(
    conn: psycopg.Connection[Any], expected: Expected, *, path: str = ""
) -> FocusReconciliation:
    """Compare the current issued invoices of ``expected``'s months with its sums.

    ``conn`` is any connection that may read ``invoices``, ``invoice_lines``,
    ``usage_lines`` and ``period_closes`` (autocommit or not: it only reads).

    Raises:
        UnknownCurrency: the file bills in a currency we do not (its pairs cannot be
            rounded).
    """
    periods = expected.periods
    # Rated charge lines (docs/rating.md) live in invoice_charges where it exists.
    has_charges = conn.execute("SELECT to_regclass('invoice_charges') IS NOT NULL").fetchone() == (
        True,
    )
    no_charges = (
        "AND NOT EXISTS (SELECT 1 FROM invoice_charges c WHERE c.invoice_id = i.invoice_id)"
        if has_charges
        else ""
    )
    with conn.cursor(row_factory=class_row(_Invoice)) as cur:
        cur.execute(
            f"""
            SELECT i.customer_id, i.billing_period, i.subtotal, btrim(i.currency) AS currency,
                   i.invoice_number,
                   i.line_count > 0 AND NOT EXISTS (
                       SELECT 1 FROM invoice_lines l
                        WHERE l.invoice_id = i.invoice_id
                          AND NOT EXISTS (SELECT 1 FROM usage_lines u WHERE u.event_id = l.event_id)
                   ) {no_charges} AS pass_through
              FROM invoices i
             WHERE i.status = 'issued' AND i.billing_period = ANY(%s)
            """,  # the only interpolation: one of two constant fragments
            (periods,),
        )
        invoices = {(row.customer_id, row.billing_period): row for row in cur.fetchall()}
    held = {
        (customer, period)
        for customer, period in conn.execute(
            "SELECT DISTINCT customer_id, billing_period FROM period_closes "
            "WHERE outcome = 'held' AND billing_period = ANY(%s)",
            (periods,),
        ).fetchall()
    }
    pairs: list[FocusPair] = []
    for key, exact in expected.sums.items():
        currency = expected.currency[key]
        rounded = round_money(exact, currency)
        invoice = invoices.get(key)
        if invoice is None:
            note = "held" if key in held else None
            pairs.append(
                FocusPair(*key, currency, exact, rounded, None, None, None, "missing", note)
            )
            continue
        same = invoice.subtotal == rounded and invoice.currency == currency
        pairs.append(
            FocusPair(
                *key,
                currency,
                exact,
                rounded,
                invoice.subtotal,
                invoice.invoice_number,
                invoice.currency,
                "match" if same else "mismatch",
                None if invoice.currency == currency else "currency differs",
            )
        )
    for key, invoice in invoices.items():
        if key not in expected.sums and invoice.pass_through:
            pairs.append(
                FocusPair(
                    *key,
                    None,
                    None,
                    None,
                    invoice.subtotal,
                    invoice.invoice_number,
                    invoice.currency,
                    "unexpected",
                )
            )
    pairs.sort(key=lambda pair: (pair.period, pair.customer_id))
    return FocusReconciliation(path, expected.rows, tuple(pairs), expected.unreadable)
