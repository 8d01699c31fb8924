"""The answer of ``GET /v1/customers/{id}/usage``: usage to date and the upcoming
invoice, rated by :func:`streams.core.domain.rating.rate` (pure).

The invoice job (``streams.core.billing.rating.rate_period``) checks the pre-priced lines with
``price_invoice()`` and calls ``rate_events()``, which aggregates the stored metered events and
calls the same ``rate()``; the view runs the same check and calls it with one pass-through line per
(day, currency) carrying the exact sum of that day's lines (:mod:`streams.apps.usage_view.state`),
the period's aggregated metered usage and the customer's segments, under the same price book. So
after the close the view's ``subtotal`` equals the issued invoice's (docs/design.md, invariant 7),
and a hold the invoice job would raise shows as a hold here.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from streams.apps.usage_view.state import (
    add_decimal,
    new_period,
    subscription_events,
    usage_of_days,
)
from streams.core.domain.errors import InvoiceRuleViolation
from streams.core.domain.http import (
    Close,
    HoldNote,
    InvoiceLine,
    LateUsage,
    MetricQuantity,
    PassThroughUsage,
    UpcomingInvoice,
    UsageResponse,
    UsageToDate,
)
from streams.core.domain.invoice import UsageLine, price_invoice
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import PriceBook, RatedInvoice, Usage, rate, segments_for
from streams.core.domain.rating.aggregate import MetricUsage
from streams.topics import ACCOUNT_EVENTS

#: The invoicing worker's default when a customer has no ``customer.upserted`` yet
#: (it refuses to invoice then): the view previews in the lines' currency.
_NO_CURRENCY = "USD"


def pass_through_lines(
    customer_id: str, period: str, sums: Mapping[str, Mapping[str, str]], partition: int
) -> list[UsageLine]:
    """One :class:`UsageLine` per (day, currency) with the exact sum of that day's lines."""
    lines = []
    for day_text, per_currency in sorted(sums.items()):
        day = date.fromisoformat(day_text)
        for currency, amount in sorted(per_currency.items()):
            lines.append(
                UsageLine(
                    event_id=f"{period}/{day_text}/{currency}",
                    customer_id=customer_id,
                    billing_period=period,
                    amount=Decimal(amount),
                    currency=currency,
                    quantity=None,
                    unit=None,
                    description=f"pass-through usage of {day_text}",
                    sku_id=None,
                    region_id=None,
                    charge_category=None,
                    event_time=datetime(day.year, day.month, day.day, tzinfo=UTC),
                    # the lines' topic (prefix aside): rate() reports source ranges
                    source_topic=ACCOUNT_EVENTS.name,
                    source_partition=partition,
                    source_offset=0,
                )
            )
    return lines


def _amounts(sums: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    totals: dict[str, str] = {}
    for per_currency in sums.values():
        for currency, amount in per_currency.items():
            totals[currency] = add_decimal(totals.get(currency), Decimal(amount))
    return dict(sorted(totals.items()))


def _metered(usage: Usage) -> tuple[list[MetricQuantity], int]:
    """One row per metric, or per group value of a metric that groups; and the period's
    metered events, each counted once (a grouped metric's rows all carry the metric's
    events, so they are counted per metric, not per row)."""
    merged: dict[str, MetricUsage] = usage.collect(usage.event_days())
    quantities: list[MetricQuantity] = []
    events = 0
    for code, metric_usage in sorted(merged.items()):
        events += metric_usage.events
        groups = metric_usage.quantities() or [(None, Decimal(0))]
        for group, quantity in groups:
            quantities.append(
                MetricQuantity(
                    metric=code, group=group, quantity=quantity, events=metric_usage.events
                )
            )
    for code, count in sorted(usage.unknown_on(usage.event_days()).items()):
        events += count
        quantities.append(MetricQuantity(metric=code, quantity=Decimal(0), events=count))
    return quantities, events


def _lines(rated: RatedInvoice) -> list[InvoiceLine]:
    lines = [
        InvoiceLine(
            kind="charge",
            description=line.description,
            amount=line.amount,
            plan_code=line.plan_code,
            plan_version=line.plan_version,
            charge_code=line.charge_code,
            metric=line.metric,
            group=line.group_value,
            quantity=line.quantity,
        )
        for line in rated.lines
    ]
    lines.extend(
        InvoiceLine(
            kind="pass_through",
            description=line.usage.description or line.line_id,
            amount=line.amount,
            plan_code=line.plan_code,
            plan_version=line.plan_version,
        )
        for line in rated.pass_through
    )
    return lines


def preview(
    customer: Mapping[str, Any],
    period_state: Mapping[str, Any] | None,
    period: BillingPeriod,
    *,
    days: Mapping[str, Mapping[str, Any]] | None = None,
    book: PriceBook,
    book_label: str,
    served_by: str,
    partition: int,
) -> UsageResponse:
    """The view's answer for ``customer``'s ``period``.

    ``days``: the period's ``usage_days`` values by ``YYYY-MM-DD``.

    Raises:
        RatingError: the stored state is inconsistent with itself (a bug, not a gap:
            the web layer answers 500).
    """
    customer_id = str(customer["customer_id"])
    state = period_state or new_period(customer_id, str(period), partition)
    notes: list[HoldNote] = []
    currency = customer.get("currency")
    if currency is None:
        notes.append(
            HoldNote(
                code="no_customer",
                message="no customer.upserted yet: the invoicing worker refuses to invoice "
                "a customer it does not know",
            )
        )
        seen = sorted(_amounts(state["pass_through"]))
        currency = seen[0] if seen else _NO_CURRENCY
    if int(customer.get("refused", 0)):
        notes.append(
            HoldNote(
                code="refused_records",
                message=f"{customer['refused']} record(s) of this customer could not be read "
                f"(last: {customer.get('last_refused')}); the invoicing workers dead-letter them "
                "and hold the invoice until an operator releases it",
            )
        )
    if int(customer.get("conflicts", 0)):
        notes.append(
            HoldNote(
                code="conflicting_events",
                message=f"{customer['conflicts']} event(s) reused an event id with other content "
                f"(last: {customer.get('last_conflict')}); the invoicing workers dead-letter them "
                "and hold the invoice",
            )
        )
    usage, stale = usage_of_days(period, days or {}, book)
    if stale:
        notes.append(
            HoldNote(
                code="stale_aggregates",
                message=f"metric(s) {', '.join(stale)} were redefined in the price book after "
                "their events were aggregated; the view cannot re-aggregate them "
                "(their usage is left out of this preview)",
            )
        )
    segments = segments_for(period, subscription_events(customer))
    lines = pass_through_lines(customer_id, str(period), state["pass_through"], partition)
    try:
        # the invoice job's first step (streams.core.billing.rating.rate_period): the
        # pre-priced lines pass the invoice rules, or the job refuses and holds
        price_invoice(lines, currency=str(currency))
    except InvoiceRuleViolation as exc:
        notes.append(
            HoldNote(
                code="invoice_rules",
                message=f"the pre-priced lines break an invoice rule ({exc}); the invoicing "
                "workers dead-letter the close marker and hold the invoice",
            )
        )
    rated = rate(
        period,
        currency=str(currency),
        book=book,
        segments=segments,
        usage=usage,
        pass_through=lines,
    )
    holds = [HoldNote(code=h.code.value, message=h.message) for h in rated.holds] + notes
    metered, metered_events = _metered(usage)
    late = state["late"]
    closed = state.get("closed")
    return UsageResponse(
        customer_id=customer_id,
        period=str(period),
        closed=None
        if closed is None
        else Close(closed_at=closed["closed_at"], reason=closed["reason"]),
        usage=UsageToDate(
            pass_through=PassThroughUsage(
                lines=int(state["pass_through_lines"]), amounts=_amounts(state["pass_through"])
            ),
            metered=tuple(metered),
            metered_events=metered_events,
            late=LateUsage(
                pass_through_lines=int(late["pass_through_lines"]),
                pass_through_amounts=_amounts(late["pass_through"]),
                metered_events=int(late["metered_events"]),
            ),
        ),
        upcoming_invoice=UpcomingInvoice(
            currency=str(currency),
            subtotal=None if holds else rated.rounded_total,
            rounded_total=rated.rounded_total,
            exact_total=rated.exact_total,
            # the invoice's count: its charge lines and every pre-priced line
            line_count=len(rated.lines) + int(state["pass_through_lines"]),
            lines=tuple(_lines(rated)),
            holds=tuple(holds),
            price_book=book_label,
        ),
        last_event_at=state.get("last_event_at"),
        last_event_id=state.get("last_event_id"),
        served_by=served_by,
        partition=partition,
    )
