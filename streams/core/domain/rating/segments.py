"""Segments: which plan version applies on which day of a billing period.

A customer's subscription events (``subscription.started``, ``.changed``,
``.ended``, each with an ``effective_at`` instant) are keyed by the customer, so
they arrive in order with its usage. From them and a billing period (a calendar
month, UTC) :func:`segments_for` gives the **segments** of the period: per plan
version, the days it applies. Each segment is rated under its own version
(:func:`streams.core.domain.rating.rate`).

Rules (docs/rating.md "Segments"):

1. **The timeline.** Events are ordered by ``effective_at``; events with the
   same instant keep their input (partition) order, the later one winning. A
   ``started`` or ``changed`` subscribes the customer to its plan version from
   that instant, whatever came before (one subscription per customer: a start
   while subscribed acts as a change, a change while not subscribed as a start);
   an ``ended`` unsubscribes it. Events dated before the period set the state
   at its start; events dated after its end are ignored. The events passed in
   are all the customer's subscription events known when rating (for an
   invoice: those before its close marker on the partition).
2. **Whole UTC days.** A day belongs to the **last plan version in effect for
   any positive time that day**. So the day of a change belongs to the new
   version (Lago prorates an upgrade on January 15th as 14 days of the old plan,
   January 1-14, and the rest of the new one); a start at 23:00 bills its day; an
   end at 13:00 bills its day under the ending version, an end at 00:00 does
   not; a version in effect for no time (two events at one instant) gets no day.
3. **One segment per plan version.** A change back and forth (A, then B, then
   A again) gives two segments: A with both of its day ranges, B with its own.
   A version's allowance (free units, tiers) and its minimum apply once per
   period, over all its days, not once per stretch: switching back and forth
   cannot multiply a free tier.
4. **Proration** of fixed fees and minimums: ``amount * days of the segment /
   days in the month`` (docs/rating.md "Proration"; Lago by day, both ends included), see
   :func:`streams.core.domain.rating.pricing.prorate`.
5. **Usage by event time.** A metered event belongs to the segment of the UTC
   day of its ``event_time``; on a day without a segment (before the first
   subscription, after an end) it is a gap: the invoice is held
   (``no_subscription``), never priced at zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from streams.core.domain.events import (
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
)
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating.errors import RatingError

_DAY = timedelta(days=1)


@dataclass(frozen=True)
class Segment:
    """The days of a billing period under one plan version.

    * ``days`` — the UTC days, sorted, not necessarily contiguous (rule 3);
    * ``days_in_period`` — the days of the month (28-31), the proration divisor.
    """

    plan_code: str
    plan_version: int
    days: tuple[date, ...]
    days_in_period: int

    @property
    def day_count(self) -> int:
        return len(self.days)

    @property
    def ranges(self) -> tuple[tuple[date, date], ...]:
        """The days as inclusive ``(first, last)`` ranges, in order."""
        ranges: list[tuple[date, date]] = []
        for day in self.days:
            if ranges and ranges[-1][1] + _DAY == day:
                ranges[-1] = (ranges[-1][0], day)
            else:
                ranges.append((day, day))
        return tuple(ranges)

    @property
    def full_period(self) -> bool:
        return self.day_count == self.days_in_period

    def describe(self) -> str:
        """``2024-09-01..2024-09-14, 2024-09-20..2024-09-30``."""
        return ", ".join(
            first.isoformat() if first == last else f"{first.isoformat()}..{last.isoformat()}"
            for first, last in self.ranges
        )


def period_days(period: BillingPeriod) -> list[date]:
    """Every UTC day of ``period``."""
    first = period.start.date()
    count = (period.end - period.start).days
    return [first + timedelta(days=offset) for offset in range(count)]


def _state(event: SubscriptionEvent) -> tuple[str, int] | None:
    if isinstance(event, SubscriptionStarted | SubscriptionChanged):
        return (event.plan_code, event.plan_version)
    if isinstance(event, SubscriptionEnded):
        return None
    raise RatingError(f"not a subscription event: {type(event).__name__}")


def day_plans(
    period: BillingPeriod, events: Sequence[SubscriptionEvent]
) -> dict[date, tuple[str, int]]:
    """Per day of ``period`` with a plan, the ``(plan code, version)`` that the
    day belongs to (module rules 1-2). Days without a plan are absent."""
    timeline = sorted(
        (
            (event.effective_at.astimezone(UTC), order, _state(event))
            for order, event in enumerate(events)
        ),
        key=lambda item: (item[0], item[1]),
    )
    result: dict[date, tuple[str, int]] = {}
    state: tuple[str, int] | None = None
    index = 0
    for day in period_days(period):
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + _DAY
        # The state at the day's first instant: every event up to and including it.
        while index < len(timeline) and timeline[index][0] <= start:
            state = timeline[index][2]
            index += 1
        # (since, state) for each state of the day, in order; the last one held
        # for a positive time wins.
        since, held = start, state
        winner: tuple[str, int] | None = None
        while index < len(timeline) and timeline[index][0] < end:
            at, _, next_state = timeline[index]
            if at > since and held is not None:
                winner = held
            since, held = at, next_state
            index += 1
        if end > since and held is not None:
            winner = held
        state = held
        if winner is not None:
            result[day] = winner
    return result


def segments_for(period: BillingPeriod, events: Sequence[SubscriptionEvent]) -> tuple[Segment, ...]:
    """The segments of ``period`` from a customer's subscription ``events``
    (in partition order; any ``effective_at``), ordered by their first day.
    No subscription in the period: ``()``."""
    days_in_period = len(period_days(period))
    by_version: dict[tuple[str, int], list[date]] = {}
    for day, version in sorted(day_plans(period, events).items()):
        by_version.setdefault(version, []).append(day)
    segments = [
        Segment(code, number, tuple(days), days_in_period)
        for (code, number), days in by_version.items()
    ]
    return tuple(sorted(segments, key=lambda segment: segment.days[0]))


def uncovered_days(period: BillingPeriod, segments: Iterable[Segment]) -> list[date]:
    """The days of ``period`` that no segment covers."""
    covered = {day for segment in segments for day in segment.days}
    return [day for day in period_days(period) if day not in covered]
