"""Invoice computation: usage lines + their taxes → invoice totals (pure, no I/O).

Rounding rule (docs/design.md "Money and time"): line amounts keep full precision;
the invoice **subtotal** and **each tax amount** are rounded **once**, to the
currency's minor unit, half-even (:func:`streams.core.domain.money.round_money`).
A line is never rounded on its own: 1,000 lines of ``0.004`` make a subtotal
of ``4.00``, not ``0.00``.

Sums are exact: they run in a local decimal context wide enough for any
realistic invoice, with ``Inexact`` trapped, so a sum that could not be held
exactly raises instead of being rounded silently.

Shapes:

* :class:`UsageLine` — one ``usage.recorded`` event as read from Kafka, with its
  source coordinates (topic, partition, offset).
* :class:`TaxLine` — what the tax client sends per line; :class:`TaxedLine` —
  what it gets back (``tax`` unrounded).
* :class:`PricedInvoice` — an invoice before tax (:func:`price_invoice` runs
  every rule on the lines); :func:`apply_tax` adds the tax service's answers.
* :class:`InvoiceTotals` — what an invoice revision states; its parts are the
  models of :mod:`streams.core.domain.events` so they go to ``invoice.issued`` as is.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from streams.core.domain.errors import InvoiceRuleViolation
from streams.core.domain.events import (
    ChargeSummary,
    LineSummary,
    RatingSummary,
    SourceRange,
    TaxAmount,
)
from streams.core.domain.money import InvalidAmount, round_money

#: Significant digits of the exact sums: far beyond any invoice (a 10^20 total
#: with 40 decimals still fits), small enough to stay fast.
_SUM_PRECISION = 80


@contextmanager
def _exact() -> Iterator[None]:
    """A decimal context for exact sums: wide, and any rounding is an error."""
    with decimal.localcontext() as ctx:
        ctx.prec = _SUM_PRECISION
        ctx.traps[decimal.Inexact] = True
        ctx.traps[decimal.Rounded] = False
        yield


def _require_decimal(value: object, what: str) -> None:
    if not isinstance(value, Decimal) or not value.is_finite():
        raise InvalidAmount(
            f"{what} must be a finite Decimal, got {type(value).__name__} {value!r}"
        )


@dataclass(frozen=True)
class UsageLine:
    """One usage line of a customer's billing period, with where it was read.

    ``amount`` is the billed cost in ``currency`` units, exact, any sign.
    ``event_id`` is the ``usage.recorded`` event's id (CloudEvents ``ce_id``);
    it doubles as the line id towards the tax service.

    Raises:
        InvalidAmount: ``amount`` (or ``quantity``) is not a finite ``Decimal``.
        InvoiceRuleViolation: ``event_time`` is naive.
    """

    event_id: str
    customer_id: str
    billing_period: str
    amount: Decimal
    currency: str
    quantity: Decimal | None
    unit: str | None
    description: str | None
    sku_id: str | None
    region_id: str | None
    charge_category: str | None
    #: Start of the charge (UTC).
    event_time: datetime
    source_topic: str
    source_partition: int
    source_offset: int

    def __post_init__(self) -> None:
        _require_decimal(self.amount, f"line {self.event_id!r} amount")
        if self.quantity is not None:
            _require_decimal(self.quantity, f"line {self.event_id!r} quantity")
        if self.event_time.tzinfo is None or self.event_time.utcoffset() is None:
            raise InvoiceRuleViolation(f"line {self.event_id!r} has a naive event_time")

    def tax_line(self, tax_code: str | None = None) -> TaxLine:
        """This line as the tax service takes it (``line_id`` = ``event_id``)."""
        return TaxLine(
            line_id=self.event_id, amount=self.amount, region_id=self.region_id, tax_code=tax_code
        )


@dataclass(frozen=True)
class TaxLine:
    """One line of a tax request: exact ``amount`` in the invoice currency, the
    region it was consumed in (``None`` = unknown/global) and an optional product
    tax code (``None`` lets the tax service decide)."""

    line_id: str
    amount: Decimal
    region_id: str | None
    tax_code: str | None


@dataclass(frozen=True)
class TaxedLine:
    """The tax service's answer for one line: the code and ``rate`` it applied
    (a fraction, ``0.2`` = 20 %) and the line's ``tax`` in currency units at full
    precision (never rounded per line).

    Raises:
        InvalidAmount: ``rate`` or ``tax`` is not a finite ``Decimal``.
    """

    line_id: str
    tax_code: str
    rate: Decimal
    tax: Decimal

    def __post_init__(self) -> None:
        _require_decimal(self.rate, f"tax rate of line {self.line_id!r}")
        _require_decimal(self.tax, f"tax of line {self.line_id!r}")


@dataclass(frozen=True)
class InvoiceTotals:
    """The figures of one invoice revision, in ``currency`` units.

    * ``subtotal`` — exact sum of the line amounts, rounded once (half-even).
    * ``taxes`` — one :class:`TaxAmount` per ``(tax_code, rate)``, sorted by code
      then rate; ``taxable_amount`` exact, ``amount`` rounded once.
    * ``tax_total`` — sum of the rounded tax amounts; ``total = subtotal + tax_total``.
    * ``largest_lines`` — the largest lines by absolute amount (ties: event id).
    * ``source`` — per (topic, partition), the first and last offset of the lines
      (docs/design.md, invariant 6), sorted by topic then partition.
    * ``charges`` and ``rating`` — a rated invoice's charge lines and rating summary
      (:class:`PricedInvoice`); ``()`` and None for an invoice of pre-priced lines only.
    """

    currency: str
    line_count: int
    subtotal: Decimal
    taxes: tuple[TaxAmount, ...]
    tax_total: Decimal
    total: Decimal
    largest_lines: tuple[LineSummary, ...]
    source: tuple[SourceRange, ...]
    charges: tuple[ChargeSummary, ...] = ()
    rating: RatingSummary | None = None


def describe_line(line: UsageLine) -> str:
    """A usage line's text on the invoice (:class:`LineSummary` needs one): its
    description; FOCUS rows always carry ChargeDescription, other sources may not,
    so else what identifies the charge best (SKU, charge category, event id)."""
    return line.description or line.sku_id or line.charge_category or line.event_id


@dataclass(frozen=True)
class PricedInvoice:
    """An invoice before tax: its lines checked, its subtotal and summaries computed.

    Everything that can refuse the *data* of an invoice happens while pricing it
    (:func:`price_invoice`), so that a caller can price first and call the tax
    service only for an invoice that will be accepted (the tax service commits a
    document per idempotency key; see :func:`apply_tax`).

    * ``lines`` — the distinct usage lines, in input order, each at the amount billed
      (a plan's markup applied: :mod:`streams.core.domain.rating.priced`).
    * ``charges`` — a rated invoice's charge lines (not usage events), each taxed
      under its ``line_id``; ``()`` for an invoice of pre-priced lines only.
    * ``rating`` — a rated invoice's :class:`~streams.core.domain.events.RatingSummary`
      (None otherwise): the invoice event carries it.
    * ``subtotal`` — exact sum of the line and charge amounts, rounded once (half-even).
    * ``largest_lines`` and ``source`` — as in :class:`InvoiceTotals`.
    """

    currency: str
    lines: tuple[UsageLine, ...]
    subtotal: Decimal
    largest_lines: tuple[LineSummary, ...]
    source: tuple[SourceRange, ...]
    charges: tuple[ChargeSummary, ...] = ()
    rating: RatingSummary | None = None

    @property
    def line_count(self) -> int:
        """Invoice lines: usage lines and charges."""
        return len(self.lines) + len(self.charges)

    def tax_lines(self) -> list[TaxLine]:
        """The tax document's lines: each charge (``line_id``, no region), then each
        usage line (``event_id``), in invoice order. One tax line per invoice line."""
        return [
            TaxLine(line_id=charge.line_id, amount=charge.amount, region_id=None, tax_code=None)
            for charge in self.charges
        ] + [line.tax_line() for line in self.lines]


def price_invoice(lines: Sequence[UsageLine], *, currency: str, largest: int = 5) -> PricedInvoice:
    """Check ``lines`` and price the invoice they make, before any tax.

    Rules (docs/design.md "Money and time" and invariant 3): every line is
    counted exactly once, in the invoice currency; the subtotal is rounded once,
    at the end. Zero lines give a zero subtotal.

    Args:
        lines: the distinct usage lines of one customer and billing period.
        currency: the invoice currency (ISO 4217); every line must be in it.
        largest: how many lines go to ``largest_lines`` (``>= 0``).

    Raises:
        InvoiceRuleViolation: lines in another currency; lines of more than one
            customer or billing period; duplicate event ids; ``largest < 0``; a
            sum that cannot be held exactly.
        UnknownCurrency: ``currency`` is not one we bill in.
    """
    if largest < 0:
        raise InvoiceRuleViolation(f"largest must be >= 0, got {largest}")
    round_money(Decimal(0), currency)  # refuse an unknown currency even with no lines

    seen: set[str] = set()
    for line in lines:
        if line.event_id in seen:
            raise InvoiceRuleViolation(f"duplicate usage event id {line.event_id!r}")
        seen.add(line.event_id)
    _check_same(lines, "currency", currency)
    _check_same(lines, "customer_id", None)
    _check_same(lines, "billing_period", None)

    subtotal = round_money(_sum(line.amount for line in lines), currency)
    ranked = sorted(lines, key=lambda line: (-abs(line.amount), line.event_id))[:largest]
    largest_lines = tuple(
        LineSummary(
            description=describe_line(line),
            amount=line.amount,
            quantity=line.quantity,
            unit=line.unit,
        )
        for line in ranked
    )
    return PricedInvoice(
        currency=currency,
        lines=tuple(lines),
        subtotal=subtotal,
        largest_lines=largest_lines,
        source=source_ranges(lines),
    )


def apply_tax(priced: PricedInvoice, taxed: Sequence[TaxedLine]) -> InvoiceTotals:
    """The totals of a priced invoice with the tax service's answers.

    Only the answers are checked here: with a well-formed answer this cannot
    fail, whatever the lines were (they were checked by :func:`price_invoice`).

    Args:
        priced: the invoice from :func:`price_invoice` (or, rated, from
            :func:`streams.core.domain.rating.priced_invoice`).
        taxed: exactly one :class:`TaxedLine` per line (``line_id`` = ``event_id``) and
            per charge (``line_id``): :meth:`PricedInvoice.tax_lines`.

    Raises:
        InvoiceRuleViolation: a line with no or several taxed lines; a taxed line
            for an unknown line; a tax sum that cannot be held exactly.
    """
    currency = priced.currency
    amounts: dict[str, Decimal] = {charge.line_id: charge.amount for charge in priced.charges}
    for line in priced.lines:
        if line.event_id in amounts:
            raise InvoiceRuleViolation(f"line id {line.event_id!r} is used twice on the invoice")
        amounts[line.event_id] = line.amount
    by_id = amounts
    tax_of: dict[str, TaxedLine] = {}
    for answer in taxed:
        if answer.line_id not in by_id:
            raise InvoiceRuleViolation(f"tax answer for unknown line {answer.line_id!r}")
        if answer.line_id in tax_of:
            raise InvoiceRuleViolation(f"line {answer.line_id!r} has more than one tax answer")
        tax_of[answer.line_id] = answer
    untaxed = [event_id for event_id in by_id if event_id not in tax_of]
    if untaxed:
        shown = ", ".join(repr(e) for e in untaxed[:5])
        raise InvoiceRuleViolation(f"{len(untaxed)} line(s) without a tax answer: {shown}")

    groups: dict[tuple[str, Decimal], list[str]] = {}
    for line_id in by_id:
        answer = tax_of[line_id]
        # Decimal("0.20") == Decimal("0.2") and they hash alike: one group.
        groups.setdefault((answer.tax_code, answer.rate), []).append(line_id)
    taxes = tuple(
        TaxAmount(
            tax_code=code,
            rate=rate,
            taxable_amount=_sum(by_id[line_id] for line_id in members),
            amount=round_money(_sum(tax_of[line_id].tax for line_id in members), currency),
        )
        for (code, rate), members in sorted(groups.items(), key=lambda item: item[0])
    )
    tax_total = _sum(tax.amount for tax in taxes)  # already at the minor unit: exact
    total = _sum((priced.subtotal, tax_total))
    return InvoiceTotals(
        currency=currency,
        line_count=priced.line_count,
        subtotal=priced.subtotal,
        taxes=taxes,
        tax_total=tax_total,
        total=total,
        largest_lines=priced.largest_lines,
        source=priced.source,
        charges=priced.charges,
        rating=priced.rating,
    )


def compute_invoice(
    lines: Sequence[UsageLine],
    taxed: Sequence[TaxedLine],
    *,
    currency: str,
    largest: int = 5,
) -> InvoiceTotals:
    """The totals of an invoice over ``lines`` with their ``taxed`` answers:
    :func:`price_invoice` then :func:`apply_tax`.

    Rules (docs/design.md "Money and time" and invariant 3): every line is
    counted exactly once and amounts are rounded once, at the end. Zero lines
    give a zero invoice (``subtotal`` ``0.00`` in USD).

    Args:
        lines: the distinct usage lines of one customer and billing period.
        taxed: exactly one :class:`TaxedLine` per line (``line_id`` = ``event_id``).
        currency: the invoice currency (ISO 4217); every line must be in it.
        largest: how many lines go to ``largest_lines`` (``>= 0``).

    Raises:
        InvoiceRuleViolation: lines in another currency; lines of more than one
            customer or billing period; duplicate event ids; a line with no or
            several taxed lines; a taxed line for an unknown line; ``largest < 0``;
            a sum that cannot be held exactly.
        UnknownCurrency: ``currency`` is not one we bill in.
    """
    return apply_tax(price_invoice(lines, currency=currency, largest=largest), taxed)


def source_ranges(lines: Iterable[UsageLine]) -> tuple[SourceRange, ...]:
    """Per (topic, partition) the lowest and highest offset of ``lines``, sorted."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for line in lines:
        key = (line.source_topic, line.source_partition)
        low, high = spans.get(key, (line.source_offset, line.source_offset))
        spans[key] = (min(low, line.source_offset), max(high, line.source_offset))
    return tuple(
        SourceRange(topic=topic, partition=partition, first_offset=low, last_offset=high)
        for (topic, partition), (low, high) in sorted(spans.items())
    )


def lines_before_marker(
    lines: Iterable[UsageLine], marker_partition: int, marker_offset: int
) -> list[UsageLine]:
    """The lines that precede a ``billing_period.closed`` marker, in input order.

    This is docs/design.md, invariant 3 ("the distinct usage events of that customer and
    period that precede its close marker"): a customer's events are keyed by the
    customer id, so all of them are on one partition and "precede" means a lower
    offset on the marker's partition. Usage at or after the marker's offset is
    left for a later revision. Duplicates are *not* removed here.

    Raises:
        InvoiceRuleViolation: a line from another partition than the marker's
            (the one-partition-per-customer invariant is broken; refusing beats
            guessing an order across partitions).
    """
    kept: list[UsageLine] = []
    for line in lines:
        if line.source_partition != marker_partition:
            raise InvoiceRuleViolation(
                f"line {line.event_id!r} is on partition {line.source_partition}, "
                f"the close marker on {marker_partition}: a customer's events must share one partition"
            )
        if line.source_offset < marker_offset:
            kept.append(line)
    return kept


def _sum(values: Iterable[Decimal]) -> Decimal:
    """Exact sum; refuses (never in practice) a sum it would have to round."""
    total = Decimal(0)
    try:
        with _exact():
            for value in values:
                total += value
    except decimal.Inexact:
        raise InvoiceRuleViolation(
            f"a sum exceeds {_SUM_PRECISION} significant digits and cannot be exact"
        ) from None
    return total


def _check_same(lines: Sequence[UsageLine], field: str, expected: str | None) -> None:
    seen = sorted({str(getattr(line, field)) for line in lines})
    if expected is not None and any(value != expected for value in seen):
        raise InvoiceRuleViolation(
            f"every line must be in the invoice {field} {expected!r}, found {seen}"
        )
    if len(seen) > 1:
        raise InvoiceRuleViolation(f"lines of one invoice must share one {field}, found {seen}")
