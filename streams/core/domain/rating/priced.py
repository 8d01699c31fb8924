"""A rated invoice as the billing kernel issues it: :class:`~streams.core.domain.rating.RatedInvoice`
→ :class:`~streams.core.domain.invoice.PricedInvoice` (pure, exact).

The invoice job and the replay both rate with :func:`streams.core.domain.rating.rate`
and turn the result into the priced invoice that is taxed and issued with
:func:`priced_invoice`, so the subtotal, the lines and the event of an invoice
and of its replay are made by the same code.

What an issued rated invoice states (docs/rating.md "Wiring"):

* **usage lines** — each pre-priced ``usage.recorded`` line at the amount billed
  (its plan version's markup applied; at cost without a subscription), with its
  event id and source coordinates as before;
* **charges** — each :class:`~streams.core.domain.rating.ChargeLine` as a
  :class:`~streams.core.domain.events.ChargeSummary` (metric, quantity, unit price or
  tiers or packages, proration, true-up, plan code and version, exact amount),
  taxed under its deterministic ``line_id``;
* **rating** — a :class:`~streams.core.domain.events.RatingSummary`: the segments, the
  pre-priced lines per plan version (cost, markup, billed), the number of
  metered events rated, and ``exact_total`` — the exact sum of every line, of
  which the subtotal is the one rounding (half-even, minor unit).

A customer with **no segment and no charge in the period** (pure pass-through,
the FOCUS re-billing) gets exactly :func:`~streams.core.domain.invoice.price_invoice`
of its lines: no ``charges``, no ``rating``, the same largest lines and source,
so its invoice, its event and its email are what they were before rating.

Rounding: one rule (docs/design.md "Money and time"): the lines are exact, the subtotal is
their exact sum rounded once; :func:`priced_invoice` checks that the rating's
``subtotal`` is that figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import date
from decimal import Decimal

from streams.core.domain.errors import InvoiceRuleViolation
from streams.core.domain.events import (
    ChargeSummary,
    DayRange,
    LineSummary,
    PackageSummary,
    PassThroughSummary,
    ProrationSummary,
    RatingSummary,
    SegmentSummary,
    SourceRange,
    TierSummary,
    TrueUpSummary,
)
from streams.core.domain.invoice import (
    PricedInvoice,
    UsageLine,
    describe_line,
    price_invoice,
    source_ranges,
)
from streams.core.domain.money import round_money
from streams.core.domain.rating import _exact
from streams.core.domain.rating.rated import ChargeLine, PassThroughLine, RatedInvoice
from streams.core.domain.rating.segments import Segment

__all__ = ["charge_summary", "is_rated", "largest_lines", "priced_invoice", "segment_summary"]


def _days(ranges: Sequence[tuple[date, date]]) -> tuple[DayRange, ...]:
    return tuple(DayRange(first=first, last=last) for first, last in ranges)


def charge_summary(line: ChargeLine) -> ChargeSummary:
    """The invoice event's form of a rated charge line (every field, exact)."""
    return ChargeSummary(
        line_id=line.line_id,
        plan_code=line.plan_code,
        plan_version=line.plan_version,
        charge_code=line.charge_code,
        charge_model=line.charge_model,
        description=line.description,
        days=_days(line.days),
        metric=line.metric,
        group_value=line.group_value,
        unit=line.unit,
        quantity=line.quantity,
        unit_price=line.unit_price,
        tiers=tuple(
            TierSummary(
                tier=part.tier,
                above=part.above,
                up_to=part.up_to,
                units=part.units,
                unit_price=part.unit_price,
                flat_amount=part.flat_amount,
                amount=part.amount,
            )
            for part in line.tiers
        ),
        package=None
        if line.package is None
        else PackageSummary(
            package_size=line.package.package_size,
            price=line.package.price,
            free_units=line.package.free_units,
            packages=line.package.packages,
        ),
        proration=None
        if line.proration is None
        else ProrationSummary(
            days=line.proration.days,
            days_in_period=line.proration.days_in_period,
            full_amount=line.proration.full_amount,
        ),
        true_up=None
        if line.true_up is None
        else TrueUpSummary(minimum=line.true_up.minimum, charged=line.true_up.charged),
        amount=line.amount,
    )


def segment_summary(segment: Segment) -> SegmentSummary:
    """The invoice event's form of a segment."""
    return SegmentSummary(
        plan_code=segment.plan_code,
        plan_version=segment.plan_version,
        days=_days(segment.ranges),
        day_count=segment.day_count,
        days_in_period=segment.days_in_period,
    )


def _pass_through_summaries(lines: Sequence[PassThroughLine]) -> tuple[PassThroughSummary, ...]:
    """Per plan version (in order of first appearance; at cost = plan None)."""
    groups: dict[tuple[str | None, int | None], list[PassThroughLine]] = {}
    for line in lines:
        groups.setdefault((line.plan_code, line.plan_version), []).append(line)
    return tuple(
        PassThroughSummary(
            plan_code=code,
            plan_version=version,
            markup_percent=members[0].markup_percent,
            lines=len(members),
            cost=_exact.total([m.usage.amount for m in members]),
            amount=_exact.total([m.amount for m in members]),
        )
        for (code, version), members in groups.items()
    )


def is_rated(rated: RatedInvoice) -> bool:
    """Whether the invoice is a rated one (a segment or a charge in the period), as
    opposed to pure pass-through (the pre-priced lines at cost, as before rating)."""
    return bool(rated.segments or rated.lines)


def _billed(line: PassThroughLine) -> UsageLine:
    if line.amount == line.usage.amount:
        return line.usage
    return dataclasses.replace(line.usage, amount=line.amount)


def _merge_sources(
    first: Sequence[SourceRange], second: Sequence[SourceRange]
) -> tuple[SourceRange, ...]:
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for item in (*first, *second):
        key = (item.topic, item.partition)
        low, high = spans.get(key, (item.first_offset, item.last_offset))
        spans[key] = (min(low, item.first_offset), max(high, item.last_offset))
    return tuple(
        SourceRange(topic=topic, partition=partition, first_offset=low, last_offset=high)
        for (topic, partition), (low, high) in sorted(spans.items())
    )


def largest_lines(
    charges: Sequence[ChargeSummary], lines: Sequence[UsageLine], largest: int = 5
) -> tuple[LineSummary, ...]:
    """The ``largest`` lines of a rated invoice by absolute amount, charges and usage
    lines together (ties: line id / event id), as :class:`LineSummary`."""
    ranked: list[tuple[Decimal, str, LineSummary]] = [
        (
            -abs(c.amount),
            c.line_id,
            LineSummary(
                description=c.description, amount=c.amount, quantity=c.quantity, unit=c.unit
            ),
        )
        for c in charges
    ] + [
        (
            -abs(line.amount),
            line.event_id,
            LineSummary(
                description=describe_line(line),
                amount=line.amount,
                quantity=line.quantity,
                unit=line.unit,
            ),
        )
        for line in lines
    ]
    ranked.sort(key=lambda item: (item[0], item[1]))
    return tuple(summary for _, _, summary in ranked[: max(0, largest)])


def priced_invoice(
    rated: RatedInvoice,
    *,
    metered_events: int = 0,
    metered_source: Sequence[SourceRange] = (),
    largest: int = 5,
) -> PricedInvoice:
    """The priced invoice of ``rated`` (module docstring), ready for the tax call.

    Args:
        rated: from :func:`streams.core.domain.rating.rate` / ``rate_events``; must not be held.
        metered_events: how many distinct metered events were rated (for the summary).
        metered_source: per (topic, partition) the offsets of those events; merged
            into the invoice's ``source`` with the usage lines' (invariant 6).
        largest: how many lines go to ``largest_lines``.

    Raises:
        InvoiceRuleViolation: ``rated`` is held (check ``rated.holds`` first); the
            usage lines break an invoice rule (see
            :func:`~streams.core.domain.invoice.price_invoice`); the rating's subtotal is
            not the exact sum of its lines rounded once (a bug, never billed).
        UnknownCurrency: the invoice currency is not one we bill in.
    """
    if rated.held:
        raise InvoiceRuleViolation(
            "a held rated invoice cannot be priced: " + "; ".join(str(h) for h in rated.holds)
        )
    billed = [_billed(line) for line in rated.pass_through]
    base = price_invoice(billed, currency=rated.currency, largest=largest)
    charges = tuple(charge_summary(line) for line in rated.lines)
    exact = _exact.total([c.amount for c in charges] + [line.amount for line in billed])
    subtotal = round_money(exact, rated.currency)
    if subtotal != rated.subtotal or exact != rated.exact_total:
        raise InvoiceRuleViolation(
            f"rated subtotal {rated.subtotal} (exact {rated.exact_total}) is not the exact sum "
            f"of its lines {exact} rounded once ({subtotal})"
        )
    if not is_rated(rated):
        return base  # pure pass-through: exactly today's invoice
    rating = RatingSummary(
        segments=tuple(segment_summary(s) for s in rated.segments),
        metered_events=metered_events,
        pass_through=_pass_through_summaries(rated.pass_through),
        exact_total=exact,
    )
    return PricedInvoice(
        currency=rated.currency,
        lines=base.lines,
        subtotal=subtotal,
        largest_lines=largest_lines(charges, billed, largest),
        source=_merge_sources(source_ranges(billed), metered_source),
        charges=charges,
        rating=rating,
    )
