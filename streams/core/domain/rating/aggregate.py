"""Aggregation: metered events → quantities, incrementally and in any order.

Three levels, each JSON-serialisable (``to_json`` / ``from_json``, plain JSON:
decimals as strings) so a faust table can store them, and each mergeable:

* :class:`~streams.core.domain.rating.aggregate_states.AggregateState` (in
  :mod:`~streams.core.domain.rating.aggregate_states`) — one billable metric's events of one group value:
  ``add`` one event's value, ``merge`` another state, read ``quantity``.
  Order-independent: any order of the same events (and any split into merged
  parts) gives the same state.
* :class:`MetricUsage` — one metric's events of one day: the filter applied,
  a state per group value, events excluded by the filter and invalid events
  (a missing or mistyped value) counted, never dropped silently.
* :class:`Usage` — one customer's metered events of one billing period, per
  **UTC day** and metric (days, because segments of a period are whole days:
  :mod:`streams.core.domain.rating.segments`), plus the events of metrics the book
  does not define. :meth:`Usage.collect` merges the days of a segment.

Per aggregation:

================  ===============================================  ====================
aggregation       state                                            a repeated event id
================  ===============================================  ====================
``count``         the number of events                             counted again
``sum``           the exact sum of the value                       added again
``max``           the largest value                                no-op
``unique_count``  the set of distinct text values                  no-op
``latest``        value of the latest (event time, event id)       no-op
================  ===============================================  ====================

Deduplication by event id is the caller's (the invoice job stores each event
once, the faust view keeps the id in its changelog-backed dedup table): holding
every id in a ``count`` state would cost as much memory as the events.

Memory: ``unique_count`` holds its distinct values (per day and group: a seat
seen every day of a month is held up to 31 times until the days are merged);
every other state is a few numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from streams.core.domain.errors import DomainError
from streams.core.domain.events import UsageMetered
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating.aggregate_states import AggregateState, new_state
from streams.core.domain.rating.book import BillableMetric, PriceBook
from streams.core.domain.rating.errors import RatingError

#: How many invalid event ids a :class:`MetricUsage` keeps as examples (the smallest).
SAMPLES = 5


@dataclass(frozen=True)
class MeteredEvent:
    """A ``usage.metered`` event as rating takes it: its id (CloudEvents ``ce_id``)
    and data. ``event_time`` is timezone-aware (UTC).

    Raises:
        RatingError: ``event_time`` is naive.
    """

    event_id: str
    metric: str
    event_time: datetime
    properties: Mapping[str, str] = field(default_factory=dict)
    values: Mapping[str, Decimal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.event_time.tzinfo is None or self.event_time.utcoffset() is None:
            raise RatingError(f"event {self.event_id!r} has a naive event_time")

    @classmethod
    def of(cls, event_id: str, data: UsageMetered) -> MeteredEvent:
        """From a decoded event's id and data."""
        return cls(event_id, data.metric, data.event_time, data.properties, data.values)

    @property
    def day(self) -> date:
        """The UTC day of ``event_time``."""
        return self.event_time.astimezone(UTC).date()


# --------------------------------------------------------------------------- one metric


class MetricUsage:
    """One billable metric's events (of one day, or merged days): a state per group
    value (``None``: no ``group_by``, or an event without the property), plus

    * ``events`` — every event of the metric added (kept, excluded or invalid);
    * ``excluded`` — events the metric's ``filter`` left out (priced nowhere, by
      the book's rule);
    * ``invalid`` — events without the value the aggregation reads, or with it in
      the wrong map (a decimal sent as text); ``invalid_samples`` keeps the
      :data:`SAMPLES` smallest of their ids and ``invalid_reason`` the reason of
      the smallest, so the same events give the same report in any order.
    """

    def __init__(self, metric: BillableMetric) -> None:
        self.metric = metric
        self.groups: dict[str | None, AggregateState] = {}
        self.events = 0
        self.excluded = 0
        self.invalid = 0
        self.invalid_samples: list[str] = []
        self.invalid_reason: str | None = None

    def add(self, event: MeteredEvent) -> None:
        """Take one event of this metric.

        Raises:
            RatingError: the event is of another metric.
        """
        metric = self.metric
        if event.metric != metric.code:
            raise RatingError(
                f"event {event.event_id!r} is of metric {event.metric!r}, not {metric.code!r}"
            )
        self.events += 1
        for name, allowed in metric.filter.items():
            if event.properties.get(name) not in allowed:
                self.excluded += 1
                return
        value: Decimal | str | None = None
        if metric.property is not None:
            name = metric.property
            if metric.reads_decimal():
                if name in event.values:
                    value = event.values[name]
                elif name in event.properties:
                    self._invalid(
                        event.event_id,
                        f"{name!r} must be a decimal in values, found text in properties",
                    )
                    return
                else:
                    self._invalid(event.event_id, f"no decimal value {name!r}")
                    return
            elif name in event.properties:
                value = event.properties[name]
            elif name in event.values:
                self._invalid(
                    event.event_id,
                    f"{name!r} must be a text in properties, found a decimal in values",
                )
                return
            else:
                self._invalid(event.event_id, f"no text property {name!r}")
                return
        group = None if metric.group_by is None else event.properties.get(metric.group_by)
        state = self.groups.get(group)
        if state is None:
            state = self.groups[group] = new_state(metric.aggregation)
        state.add(event.event_id, event.event_time, value)

    def _invalid(self, event_id: str, reason: str) -> None:
        self.invalid += 1
        self._note_invalid([event_id], reason)

    def _note_invalid(self, event_ids: Iterable[str], reason: str | None) -> None:
        ids = sorted({*self.invalid_samples, *event_ids})
        smallest_new = min(event_ids, default=None)
        if reason is not None and (
            self.invalid_reason is None
            or not self.invalid_samples
            or (smallest_new is not None and smallest_new < self.invalid_samples[0])
        ):
            self.invalid_reason = reason
        self.invalid_samples = ids[:SAMPLES]

    def merge(self, other: MetricUsage) -> None:
        """Fold in another usage of the same metric definition.

        Raises:
            RatingError: ``other`` was aggregated under another definition.
        """
        if other.metric != self.metric:
            raise RatingError(
                f"cannot merge usage of two definitions of metric {self.metric.code!r}"
            )
        self.events += other.events
        self.excluded += other.excluded
        if other.invalid:
            self.invalid += other.invalid
            self._note_invalid(other.invalid_samples, other.invalid_reason)
        for group, state in other.groups.items():
            mine = self.groups.get(group)
            if mine is None:
                mine = self.groups[group] = new_state(self.metric.aggregation)
            mine.merge(state)

    def quantities(self) -> list[tuple[str | None, Decimal]]:
        """``(group value, quantity)`` per group, ``None`` first then by value."""
        return [
            (group, self.groups[group].quantity)
            for group in sorted(self.groups, key=lambda g: (g is not None, g or ""))
        ]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON without the metric definition (:class:`Usage` keeps that once)."""
        return {
            "events": self.events,
            "excluded": self.excluded,
            "invalid": self.invalid,
            "invalid_samples": list(self.invalid_samples),
            "invalid_reason": self.invalid_reason,
            "groups": [
                [group, self.groups[group].to_json()]
                for group in sorted(self.groups, key=lambda g: (g is not None, g or ""))
            ],
        }

    @classmethod
    def from_json(cls, metric: BillableMetric, data: Mapping[str, Any]) -> MetricUsage:
        """The usage written by :meth:`to_json`, under ``metric``.

        Raises:
            RatingError: malformed data, or a state of another aggregation.
        """
        usage = cls(metric)
        try:
            usage.events = int(data["events"])
            usage.excluded = int(data["excluded"])
            usage.invalid = int(data["invalid"])
            usage.invalid_samples = [str(e) for e in data["invalid_samples"]]
            reason = data["invalid_reason"]
            usage.invalid_reason = None if reason is None else str(reason)
            for group, state in data["groups"]:
                loaded = AggregateState.from_json(state)
                if loaded.aggregation is not metric.aggregation:
                    raise RatingError(
                        f"metric {metric.code!r} aggregates by {metric.aggregation.value}, "
                        f"the stored state by {loaded.aggregation.value}"
                    )
                usage.groups[None if group is None else str(group)] = loaded
        except (KeyError, TypeError, ValueError) as exc:
            raise RatingError(f"not a usage of metric {metric.code!r}: {exc}") from None
        return usage

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MetricUsage)
            and other.metric == self.metric
            and other.to_json() == self.to_json()
        )

    __hash__ = None  # type: ignore[assignment]  # mutable


# --------------------------------------------------------------------------- one period


class Usage:
    """One customer's metered usage of one billing period, per UTC day and metric,
    aggregated under the price book's metric definitions.

    ``add`` takes events in any order; ``merge`` folds in another ``Usage`` of the
    same period and definitions (a faust view can keep one per partition of work
    and merge). Events of a metric the book does not define are counted per day
    (``unknown``): rating turns them into a hold.

    Raises (``add``):
        RatingError: an event outside the period.
    """

    def __init__(self, period: BillingPeriod, metrics: Mapping[str, BillableMetric]) -> None:
        self.period = period
        self.metrics = dict(metrics)
        self.days: dict[date, dict[str, MetricUsage]] = {}
        self.unknown: dict[date, dict[str, int]] = {}

    @classmethod
    def for_book(cls, period: BillingPeriod, book: PriceBook) -> Usage:
        """Empty usage of ``period`` under ``book``'s metrics."""
        return cls(period, book.metrics_by_code)

    @classmethod
    def of(cls, period: BillingPeriod, book: PriceBook, events: Iterable[MeteredEvent]) -> Usage:
        """The usage of ``events`` (all of ``period``) under ``book``'s metrics."""
        usage = cls.for_book(period, book)
        for event in events:
            usage.add(event)
        return usage

    def add(self, event: MeteredEvent) -> None:
        if not self.period.contains(event.event_time):
            raise RatingError(
                f"event {event.event_id!r} at {event.event_time.isoformat()} is not in {self.period}"
            )
        day = event.day
        metric = self.metrics.get(event.metric)
        if metric is None:
            counts = self.unknown.setdefault(day, {})
            counts[event.metric] = counts.get(event.metric, 0) + 1
            return
        per_metric = self.days.setdefault(day, {})
        usage = per_metric.get(event.metric)
        if usage is None:
            usage = per_metric[event.metric] = MetricUsage(metric)
        usage.add(event)

    def merge(self, other: Usage) -> None:
        """Fold in ``other`` (same period and metric definitions).

        Raises:
            RatingError: another period, or another definition of a metric.
        """
        if other.period != self.period:
            raise RatingError(f"cannot merge usage of {other.period} into {self.period}")
        for code, metric in other.metrics.items():
            if code in self.metrics and self.metrics[code] != metric:
                raise RatingError(f"cannot merge usage of two definitions of metric {code!r}")
            self.metrics.setdefault(code, metric)
        for day, per_metric in other.days.items():
            mine = self.days.setdefault(day, {})
            for code, usage in per_metric.items():
                if code not in mine:
                    mine[code] = MetricUsage(usage.metric)
                mine[code].merge(usage)
        for day, counts in other.unknown.items():
            mine_counts = self.unknown.setdefault(day, {})
            for code, count in counts.items():
                mine_counts[code] = mine_counts.get(code, 0) + count

    def collect(self, days: Iterable[date]) -> dict[str, MetricUsage]:
        """Per metric code, the usage of ``days`` merged (metrics without events
        on those days are absent)."""
        merged: dict[str, MetricUsage] = {}
        for day in sorted(set(days)):
            for code, usage in self.days.get(day, {}).items():
                if code not in merged:
                    merged[code] = MetricUsage(usage.metric)
                merged[code].merge(usage)
        return merged

    def unknown_on(self, days: Iterable[date]) -> dict[str, int]:
        """Per unknown metric code, the events of ``days``."""
        counts: dict[str, int] = {}
        for day in set(days):
            for code, count in self.unknown.get(day, {}).items():
                counts[code] = counts.get(code, 0) + count
        return counts

    def event_days(self) -> list[date]:
        """Days with at least one event (of a known or unknown metric), sorted."""
        return sorted(set(self.days) | set(self.unknown))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON: the period, the metric definitions used (so a stored usage
        can be checked against the book it is rated under), and per day the
        usage of each metric and the unknown metrics' counts."""
        return {
            "period": str(self.period),
            "metrics": {
                code: metric.model_dump(mode="json")
                for code, metric in sorted(self.metrics.items())
            },
            "days": {
                day.isoformat(): {code: usage.to_json() for code, usage in sorted(per.items())}
                for day, per in sorted(self.days.items())
            },
            "unknown": {
                day.isoformat(): dict(sorted(counts.items()))
                for day, counts in sorted(self.unknown.items())
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        """The usage written by :meth:`to_json`.

        Raises:
            RatingError: malformed data.
        """
        try:
            period = BillingPeriod.parse(str(data["period"]))
            metrics = {
                str(code): BillableMetric.model_validate(metric)
                for code, metric in data["metrics"].items()
            }
            usage = cls(period, metrics)
            for day_text, per_metric in data["days"].items():
                day = date.fromisoformat(day_text)
                usage.days[day] = {
                    code: MetricUsage.from_json(metrics[code], body)
                    for code, body in per_metric.items()
                }
            for day_text, counts in data["unknown"].items():
                usage.unknown[date.fromisoformat(day_text)] = {
                    str(code): int(count) for code, count in counts.items()
                }
        except RatingError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, DomainError) as exc:
            # ValidationError is a ValueError, InvalidPeriod a DomainError
            raise RatingError(f"not a stored usage: {exc}") from None
        return usage

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Usage) and other.to_json() == self.to_json()

    __hash__ = None  # type: ignore[assignment]  # mutable
