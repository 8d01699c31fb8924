"""Rating: one customer's billing period → a rated invoice (pure, exact).

:func:`rate` is the one function that the invoice job, the replay (also under a
candidate price book: shadow re-rating) and the usage view call, so a preview,
an invoice and a replay of the same input cannot disagree. :func:`rate_events`
is the same from raw events (segments and aggregation done for you).

What it returns (:class:`~streams.core.domain.rating.rated.RatedInvoice`, with the
line and hold types of :mod:`streams.core.domain.rating.rated`):

* ``lines`` — one :class:`ChargeLine` per charge of each segment's plan version
  (and group value): plan code and version, charge code and model, metric,
  group value, quantity, unit price or the tier breakdown or the packages, the
  proration, and the amount, **exact** (unrounded);
* ``pass_through`` — one :class:`PassThroughLine` per pre-priced
  ``usage.recorded`` line, its markup applied, exact;
* ``holds`` — the gaps, each a :class:`Hold` with a code and a reason: the
  invoice must not be issued while there is one (``subtotal`` is then ``None``);
* ``subtotal`` — the exact sum of every line amount, rounded **once**, half-even,
  to the currency's minor unit (:func:`streams.core.domain.money.round_money`), the
  rule of :mod:`streams.core.domain.invoice`.

Gaps are holds, never silent zeros (docs/rating.md "Gaps are holds"):

=============================  =====================================================
hold code                      when
=============================  =====================================================
``no_subscription``            metered usage on a day without a subscription
                               (before the first, after an end, or none at all)
``unknown_plan``               a segment's plan or plan version is not in the book
``version_not_effective``      a segment starts before its version's effective date
``currency_mismatch``          the plan version's (or a pass-through line's)
                               currency is not the invoice currency
``unknown_metric``             events of a metric the book does not define
``unpriced_metric``            events of a metric the segment's version has no
                               charge for
``invalid_usage``              events that lack the value their metric aggregates
``invalid_quantity``           a negative quantity for tiers or packages
``pass_through_not_priced``    pre-priced lines in a segment whose version has no
                               ``pass_through`` charge, or on a day without one
=============================  =====================================================

**Pure pass-through customers** (no subscription in the period, no metered
usage: the FOCUS re-billing of today) are rated as today: each pre-priced line
at cost (no markup), the subtotal their exact sum rounded once, equal to
:func:`streams.core.domain.invoice.price_invoice`'s. Once a customer has a segment in
the period, every pre-priced line must be priced by a plan: the line belongs to
the segment of its ``event_time``'s day (clamped into the period: a FOCUS charge
that started the month before belongs to the first day) and takes that
version's markup.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal

from streams.core.domain.events import SubscriptionEvent, deterministic_id
from streams.core.domain.invoice import UsageLine
from streams.core.domain.money import round_money
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import _exact
from streams.core.domain.rating.aggregate import MeteredEvent, MetricUsage, Usage
from streams.core.domain.rating.book import (
    BillableMetric,
    FixedFee,
    Graduated,
    MinimumCommitment,
    Package,
    PassThrough,
    PerUnit,
    PlanVersion,
    PriceBook,
    Volume,
)
from streams.core.domain.rating.errors import RatingError
from streams.core.domain.rating.pricing import (
    Priced,
    graduated,
    package,
    per_unit,
    prorate,
    volume,
)
from streams.core.domain.rating.rated import (
    ChargeLine,
    Hold,
    HoldCode,
    PackageDetail,
    PassThroughLine,
    Proration,
    RatedInvoice,
    TrueUp,
)
from streams.core.domain.rating.segments import Segment, period_days, segments_for

# --------------------------------------------------------------------------- entry points


def rate(
    period: BillingPeriod | str,
    *,
    currency: str,
    book: PriceBook,
    segments: Sequence[Segment] = (),
    usage: Usage | None = None,
    pass_through: Sequence[UsageLine] = (),
) -> RatedInvoice:
    """Rate one customer's billing period.

    Args:
        period: the billing period (``YYYY-MM`` or a :class:`BillingPeriod`).
        currency: the customer's (invoice) currency, ISO 4217.
        book: the price book to rate under (published, or a candidate).
        segments: from :func:`streams.core.domain.rating.segments_for`; ``()`` when
            the customer has no subscription in the period.
        usage: the period's metered usage aggregated under ``book``'s metrics
            (:meth:`Usage.of`, or the usage view's stored :class:`Usage`);
            ``None``: no metered usage.
        pass_through: the period's distinct pre-priced ``usage.recorded`` lines.

    Returns:
        The rated invoice; check ``holds`` (or ``subtotal is None``) before issuing.

    Raises:
        RatingError: the input is inconsistent (not a gap in the data): usage of
            another period or aggregated under other metric definitions than
            ``book``'s, segments outside the period or overlapping, pass-through
            lines of another period or customer or with duplicate event ids, a
            sum that cannot be held exactly.
        UnknownCurrency: ``currency`` is not one we bill in.
    """
    billing_period = BillingPeriod.parse(period) if isinstance(period, str) else period
    round_money(Decimal(0), currency)  # refuse an unknown currency even with nothing to rate
    metrics = book.metrics_by_code
    if usage is None:
        usage = Usage(billing_period, metrics)
    _check_usage(usage, billing_period, metrics)
    day_segment = _check_segments(segments, billing_period)
    _check_pass_through(pass_through, billing_period)

    rater = _Rater(billing_period, currency, book, usage)
    rater.uncovered_usage(day_segment)
    rater.unknown_metrics()
    if segments:
        assigned = rater.assign_pass_through(pass_through, day_segment)
        for segment in segments:
            rater.segment(segment, assigned.get(segment_key(segment), []))
    else:
        rater.at_cost(pass_through)
    return rater.result(tuple(segments))


def rate_events(
    period: BillingPeriod | str,
    *,
    currency: str,
    book: PriceBook,
    subscriptions: Sequence[SubscriptionEvent] = (),
    metered: Iterable[MeteredEvent] = (),
    pass_through: Sequence[UsageLine] = (),
) -> RatedInvoice:
    """:func:`rate` from raw input: the customer's subscription events (partition
    order, any dates), the period's distinct metered events (any order) and
    pre-priced lines. Same errors as :func:`rate`."""
    billing_period = BillingPeriod.parse(period) if isinstance(period, str) else period
    return rate(
        billing_period,
        currency=currency,
        book=book,
        segments=segments_for(billing_period, subscriptions),
        usage=Usage.of(billing_period, book, metered),
        pass_through=pass_through,
    )


def segment_key(segment: Segment) -> tuple[str, int]:
    return (segment.plan_code, segment.plan_version)


# --------------------------------------------------------------------------- checks


def _check_usage(usage: Usage, period: BillingPeriod, metrics: dict[str, BillableMetric]) -> None:
    if usage.period != period:
        raise RatingError(f"usage of {usage.period} cannot be rated in {period}")
    if usage.metrics != metrics:
        changed = sorted(
            code
            for code in set(usage.metrics) | set(metrics)
            if usage.metrics.get(code) != metrics.get(code)
        )
        raise RatingError(
            f"usage was aggregated under other definitions of metric(s) {changed} than the "
            "price book's: aggregate the events again under this book"
        )


def _check_segments(segments: Sequence[Segment], period: BillingPeriod) -> dict[date, Segment]:
    days = set(period_days(period))
    by_day: dict[date, Segment] = {}
    versions: set[tuple[str, int]] = set()
    for segment in segments:
        if segment.days_in_period != len(days) or not segment.days:
            raise RatingError(f"segment {segment_key(segment)} is not a segment of {period}")
        if segment_key(segment) in versions:
            raise RatingError(f"two segments of plan version {segment_key(segment)}")
        versions.add(segment_key(segment))
        for day in segment.days:
            if day not in days:
                raise RatingError(f"segment day {day.isoformat()} is not in {period}")
            if day in by_day:
                raise RatingError(f"day {day.isoformat()} is in two segments")
            by_day[day] = segment
    return by_day


def _check_pass_through(lines: Sequence[UsageLine], period: BillingPeriod) -> None:
    seen: set[str] = set()
    customers = {line.customer_id for line in lines}
    if len(customers) > 1:
        raise RatingError(f"pass-through lines of more than one customer: {sorted(customers)}")
    for line in lines:
        if line.event_id in seen:
            raise RatingError(f"duplicate usage event id {line.event_id!r}")
        seen.add(line.event_id)
        if line.billing_period != str(period):
            raise RatingError(
                f"usage line {line.event_id!r} is of {line.billing_period}, not {period}"
            )


# --------------------------------------------------------------------------- the work


class _Rater:
    def __init__(self, period: BillingPeriod, currency: str, book: PriceBook, usage: Usage) -> None:
        self.period = period
        self.currency = currency
        self.book = book
        self.usage = usage
        self.lines: list[ChargeLine] = []
        self.pass_through: list[PassThroughLine] = []
        self.holds: list[Hold] = []

    def hold(self, hold: Hold) -> None:
        if hold not in self.holds:
            self.holds.append(hold)

    # -- period-wide gaps

    def uncovered_usage(self, day_segment: dict[date, Segment]) -> None:
        days = [day for day in self.usage.event_days() if day not in day_segment]
        if not days:
            return
        merged = self.usage.collect(days)
        unknown = self.usage.unknown_on(days)
        count = sum(u.events for u in merged.values()) + sum(unknown.values())
        codes = sorted({*merged, *unknown})
        self.hold(
            Hold(
                HoldCode.NO_SUBSCRIPTION,
                f"{count} metered event(s) on {len(days)} day(s) without a subscription "
                f"({_span(days)}), metric(s) {', '.join(codes)}",
            )
        )

    def unknown_metrics(self) -> None:
        counts = self.usage.unknown_on(self.usage.event_days())
        for code, count in sorted(counts.items()):
            self.hold(
                Hold(
                    HoldCode.UNKNOWN_METRIC,
                    f"{count} event(s) of metric {code!r}, which the price book does not define",
                    metric=code,
                )
            )

    # -- pass-through

    def at_cost(self, lines: Sequence[UsageLine]) -> None:
        """No subscription in the period: every pre-priced line at cost (today's rule)."""
        for line in self._in_currency(lines):
            self.pass_through.append(PassThroughLine(line, line.amount))

    def assign_pass_through(
        self, lines: Sequence[UsageLine], day_segment: dict[date, Segment]
    ) -> dict[tuple[str, int], list[UsageLine]]:
        assigned: dict[tuple[str, int], list[UsageLine]] = {}
        orphans: list[UsageLine] = []
        for line in lines:
            segment = day_segment.get(self._day_of(line.event_time))
            if segment is None:
                orphans.append(line)
            else:
                assigned.setdefault(segment_key(segment), []).append(line)
        if orphans:
            days = sorted({self._day_of(line.event_time) for line in orphans})
            self.hold(
                Hold(
                    HoldCode.PASS_THROUGH_NOT_PRICED,
                    f"{len(orphans)} pre-priced usage line(s) on day(s) without a subscription "
                    f"({_span(days)}): no plan prices them",
                )
            )
        return assigned

    def _day_of(self, instant: datetime) -> date:
        utc = instant.astimezone(UTC)
        if utc < self.period.start:
            return self.period.start.date()
        if utc >= self.period.end:
            return period_days(self.period)[-1]
        return utc.date()

    def _in_currency(self, lines: Sequence[UsageLine]) -> list[UsageLine]:
        """The lines in the invoice currency; one hold per other currency found."""
        foreign: dict[str, list[str]] = {}
        kept: list[UsageLine] = []
        for line in lines:
            if line.currency == self.currency:
                kept.append(line)
            else:
                foreign.setdefault(line.currency, []).append(line.event_id)
        for currency, ids in sorted(foreign.items()):
            self.hold(
                Hold(
                    HoldCode.CURRENCY_MISMATCH,
                    f"{len(ids)} pre-priced usage line(s) in {currency}, the invoice is in "
                    f"{self.currency} (e.g. {min(ids)!r})",
                )
            )
        return kept

    # -- one segment

    def segment(self, segment: Segment, pass_through: Sequence[UsageLine]) -> None:
        code, number = segment_key(segment)
        version = self.book.plan_version(code, number)
        if version is None:
            known = self.book.plan(code)
            what = f"plan {code!r}" if known is None else f"version {number} of plan {code!r}"
            self.hold(
                Hold(
                    HoldCode.UNKNOWN_PLAN,
                    f"the subscription on {segment.describe()} names {what}, which the price "
                    "book does not have",
                    plan_code=code,
                    plan_version=number,
                )
            )
            return
        if segment.days[0] < version.effective_from:
            self.hold(
                Hold(
                    HoldCode.VERSION_NOT_EFFECTIVE,
                    f"plan {code!r} version {number} is effective from "
                    f"{version.effective_from.isoformat()}, the subscription uses it from "
                    f"{segment.days[0].isoformat()}",
                    plan_code=code,
                    plan_version=number,
                )
            )
        if version.currency != self.currency:
            self.hold(
                Hold(
                    HoldCode.CURRENCY_MISMATCH,
                    f"plan {code!r} version {number} is priced in {version.currency}, the "
                    f"invoice is in {self.currency}",
                    plan_code=code,
                    plan_version=number,
                )
            )
            return
        usage = self.usage.collect(segment.days)
        lines: list[ChargeLine] = []
        for charge in version.charges:
            if isinstance(charge, FixedFee):
                lines.append(self._fixed(segment, charge))
            elif isinstance(charge, PerUnit | Graduated | Volume | Package):
                lines.extend(self._metered(segment, charge, usage.get(charge.metric)))
        self._gaps(segment, version, usage)
        billed = list(self._marked_up(segment, version, pass_through))
        minimum = version.minimum
        if minimum is not None:
            true_up = self._minimum(segment, minimum, lines, billed)
            if true_up is not None:
                lines.append(true_up)
        self.lines.extend(lines)
        self.pass_through.extend(billed)

    def _line_id(self, segment: Segment, charge_code: str, group: str | None) -> str:
        marker = "\x00" if group is None else f"={group}"
        return deterministic_id(
            "rated-line",
            str(self.period),
            segment.plan_code,
            str(segment.plan_version),
            charge_code,
            marker,
        )

    def _fixed(self, segment: Segment, charge: FixedFee) -> ChargeLine:
        amount = prorate(charge.amount, segment.day_count, segment.days_in_period)
        return ChargeLine(
            line_id=self._line_id(segment, charge.code, None),
            plan_code=segment.plan_code,
            plan_version=segment.plan_version,
            charge_code=charge.code,
            charge_model=charge.model,
            description=charge.name or charge.code,
            days=segment.ranges,
            amount=amount,
            proration=None
            if segment.full_period
            else Proration(segment.day_count, segment.days_in_period, charge.amount),
        )

    def _metered(
        self,
        segment: Segment,
        charge: PerUnit | Graduated | Volume | Package,
        usage: MetricUsage | None,
    ) -> list[ChargeLine]:
        metric = self.book.metric(charge.metric)
        if metric is None:  # the book validates references: unreachable
            raise RatingError(f"charge {charge.code!r} prices unknown metric {charge.metric!r}")
        # No event kept: one line at quantity 0 (shown, not dropped), without a group.
        empty = usage is None or not usage.groups
        quantities = [(None, Decimal(0))] if usage is None or empty else usage.quantities()
        lines: list[ChargeLine] = []
        for group, quantity in quantities:
            label = "" if empty else _group_text(metric, group)
            if quantity < 0 and not isinstance(charge, PerUnit):
                self.hold(
                    Hold(
                        HoldCode.INVALID_QUANTITY,
                        f"metric {metric.code!r}{label} totals "
                        f"{format(quantity, 'f')}: {charge.model} pricing needs a quantity >= 0",
                        plan_code=segment.plan_code,
                        plan_version=segment.plan_version,
                        metric=metric.code,
                    )
                )
                continue
            priced, unit_price, detail = self._price(charge, quantity)
            lines.append(
                ChargeLine(
                    line_id=self._line_id(segment, charge.code, group),
                    plan_code=segment.plan_code,
                    plan_version=segment.plan_version,
                    charge_code=charge.code,
                    charge_model=charge.model,
                    description=(charge.name or metric.label) + label,
                    days=segment.ranges,
                    amount=priced.amount,
                    metric=metric.code,
                    group_value=group,
                    unit=metric.unit,
                    quantity=quantity,
                    unit_price=unit_price,
                    tiers=priced.tiers,
                    package=detail,
                )
            )
        return lines

    @staticmethod
    def _price(
        charge: PerUnit | Graduated | Volume | Package, quantity: Decimal
    ) -> tuple[Priced, Decimal | None, PackageDetail | None]:
        if isinstance(charge, PerUnit):
            return per_unit(quantity, charge.unit_price), charge.unit_price, None
        if isinstance(charge, Graduated):
            return graduated(quantity, charge.tiers), None, None
        if isinstance(charge, Volume):
            return volume(quantity, charge.tiers), None, None
        priced = package(
            quantity,
            package_size=charge.package_size,
            price=charge.price,
            free_units=charge.free_units,
        )
        detail = PackageDetail(
            charge.package_size, charge.price, charge.free_units, priced.packages or 0
        )
        return priced, None, detail

    def _gaps(self, segment: Segment, version: PlanVersion, usage: dict[str, MetricUsage]) -> None:
        for code, metric_usage in sorted(usage.items()):
            if version.charge_for(code) is None and metric_usage.events:
                self.hold(
                    Hold(
                        HoldCode.UNPRICED_METRIC,
                        f"{metric_usage.events} event(s) of metric {code!r} on "
                        f"{segment.describe()}, which plan {segment.plan_code!r} version "
                        f"{segment.plan_version} does not price",
                        plan_code=segment.plan_code,
                        plan_version=segment.plan_version,
                        metric=code,
                    )
                )
            if metric_usage.invalid:
                samples = ", ".join(repr(e) for e in metric_usage.invalid_samples)
                self.hold(
                    Hold(
                        HoldCode.INVALID_USAGE,
                        f"{metric_usage.invalid} event(s) of metric {code!r} cannot be "
                        f"aggregated: {metric_usage.invalid_reason} (e.g. {samples})",
                        plan_code=segment.plan_code,
                        plan_version=segment.plan_version,
                        metric=code,
                    )
                )

    def _marked_up(
        self, segment: Segment, version: PlanVersion, lines: Sequence[UsageLine]
    ) -> Iterable[PassThroughLine]:
        if not lines:
            return
        charge: PassThrough | None = version.pass_through
        if charge is None:
            self.hold(
                Hold(
                    HoldCode.PASS_THROUGH_NOT_PRICED,
                    f"{len(lines)} pre-priced usage line(s) on {segment.describe()}, but plan "
                    f"{segment.plan_code!r} version {segment.plan_version} has no pass_through "
                    "charge",
                    plan_code=segment.plan_code,
                    plan_version=segment.plan_version,
                )
            )
            return
        with _exact.exact():
            factor = 1 + charge.markup_percent / 100
        for line in self._in_currency(lines):
            yield PassThroughLine(
                line,
                _exact.mul(line.amount, factor),
                charge.markup_percent,
                segment.plan_code,
                segment.plan_version,
            )

    def _minimum(
        self,
        segment: Segment,
        charge: MinimumCommitment,
        lines: Sequence[ChargeLine],
        billed: Sequence[PassThroughLine],
    ) -> ChargeLine | None:
        minimum = prorate(charge.amount, segment.day_count, segment.days_in_period)
        charged = _exact.total([line.amount for line in lines] + [line.amount for line in billed])
        if charged >= minimum:
            return None
        return ChargeLine(
            line_id=self._line_id(segment, charge.code, None),
            plan_code=segment.plan_code,
            plan_version=segment.plan_version,
            charge_code=charge.code,
            charge_model=charge.model,
            description=charge.name or "Minimum commitment true-up",
            days=segment.ranges,
            amount=_exact.sub(minimum, charged),
            proration=None
            if segment.full_period
            else Proration(segment.day_count, segment.days_in_period, charge.amount),
            true_up=TrueUp(minimum, charged),
        )

    def result(self, segments: tuple[Segment, ...]) -> RatedInvoice:
        exact_total = _exact.total(
            [line.amount for line in self.lines] + [line.amount for line in self.pass_through]
        )
        return RatedInvoice(
            period=str(self.period),
            currency=self.currency,
            segments=segments,
            lines=tuple(self.lines),
            pass_through=tuple(self.pass_through),
            holds=tuple(self.holds),
            exact_total=exact_total,
            rounded_total=round_money(exact_total, self.currency),
        )


def _group_text(metric: BillableMetric, group: str | None) -> str:
    if metric.group_by is None:
        return ""
    if group is None:
        return f" (no {metric.group_by})"
    return f" ({metric.group_by}={group})"


def _span(days: Sequence[date]) -> str:
    ordered = sorted(days)
    if ordered[0] == ordered[-1]:
        return ordered[0].isoformat()
    return f"{ordered[0].isoformat()}..{ordered[-1].isoformat()}"
