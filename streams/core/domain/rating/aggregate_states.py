"""The aggregate states: one billable metric's events of one group value → a quantity.

One :class:`AggregateState` per aggregation of the price book
(:class:`~streams.core.domain.rating.book_values.Aggregation`); each can ``add`` one
event's value, ``merge`` another state and give its ``quantity``, in any order of the
same events, and round-trips through plain JSON (decimals as strings). The
containers that hold them per group, day and period:
:mod:`streams.core.domain.rating.aggregate`.

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
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, ClassVar, Self

from streams.core.domain.money import canonical_decimal, parse_decimal
from streams.core.domain.rating import _exact
from streams.core.domain.rating.book import Aggregation
from streams.core.domain.rating.errors import RatingError


def _dec(text: Any) -> Decimal:
    return parse_decimal(text, what="aggregate value")


def _text(value: Decimal) -> str:
    return format(value, "f")


class AggregateState(ABC):
    """Incremental aggregate of one metric's events for one group value.

    ``add(event_id, event_time, value)`` takes one event (``value``: the decimal
    for sum/max/latest, the text for unique_count, ``None`` for count);
    ``merge(other)`` folds in a state of the same aggregation; ``quantity`` is
    the aggregate (``0`` without events). Mutable; not thread-safe.
    """

    aggregation: ClassVar[Aggregation]

    @abstractmethod
    def add(self, event_id: str, event_time: datetime, value: Decimal | str | None) -> None: ...

    @abstractmethod
    def merge(self, other: AggregateState) -> None: ...

    @property
    @abstractmethod
    def quantity(self) -> Decimal: ...

    @abstractmethod
    def _body(self) -> dict[str, Any]: ...

    def to_json(self) -> dict[str, Any]:
        """A plain-JSON form (decimals as strings): ``{"aggregation": ..., ...}``."""
        return {"aggregation": self.aggregation.value, **self._body()}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> AggregateState:
        """The state written by :meth:`to_json`.

        Raises:
            RatingError: not a state of a known aggregation.
        """
        try:
            kind = Aggregation(data["aggregation"])
            return _STATES[kind]._load(data)
        except (KeyError, ValueError, TypeError) as exc:
            raise RatingError(f"not an aggregate state: {exc}") from None

    @classmethod
    @abstractmethod
    def _load(cls, data: Mapping[str, Any]) -> AggregateState: ...

    def _same(self, other: AggregateState) -> Self:
        if type(other) is not type(self):
            raise RatingError(
                f"cannot merge a {other.aggregation.value} state into a {self.aggregation.value} one"
            )
        return other

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AggregateState) and self.to_json() == other.to_json()

    __hash__ = None  # type: ignore[assignment]  # mutable


class CountState(AggregateState):
    aggregation = Aggregation.COUNT

    def __init__(self, count: int = 0) -> None:
        self.count = count

    def add(self, event_id: str, event_time: datetime, value: Decimal | str | None) -> None:
        self.count += 1

    def merge(self, other: AggregateState) -> None:
        other = self._same(other)
        self.count += other.count

    @property
    def quantity(self) -> Decimal:
        return Decimal(self.count)

    def _body(self) -> dict[str, Any]:
        return {"count": self.count}

    @classmethod
    def _load(cls, data: Mapping[str, Any]) -> AggregateState:
        return cls(int(data["count"]))


class SumState(AggregateState):
    aggregation = Aggregation.SUM

    def __init__(self, total: Decimal = Decimal(0)) -> None:
        self.total = total

    def add(self, event_id: str, event_time: datetime, value: Decimal | str | None) -> None:
        if not isinstance(value, Decimal):
            raise RatingError("sum needs a decimal value")
        self.total = _exact.total((self.total, value))

    def merge(self, other: AggregateState) -> None:
        other = self._same(other)
        self.total = _exact.total((self.total, other.total))

    @property
    def quantity(self) -> Decimal:
        return canonical_decimal(self.total)

    def _body(self) -> dict[str, Any]:
        return {"total": _text(canonical_decimal(self.total))}

    @classmethod
    def _load(cls, data: Mapping[str, Any]) -> AggregateState:
        return cls(_dec(data["total"]))


class MaxState(AggregateState):
    aggregation = Aggregation.MAX

    def __init__(self, maximum: Decimal | None = None) -> None:
        self.maximum = maximum

    def add(self, event_id: str, event_time: datetime, value: Decimal | str | None) -> None:
        if not isinstance(value, Decimal):
            raise RatingError("max needs a decimal value")
        if self.maximum is None or value > self.maximum:
            self.maximum = value

    def merge(self, other: AggregateState) -> None:
        other = self._same(other)
        if other.maximum is not None and (self.maximum is None or other.maximum > self.maximum):
            self.maximum = other.maximum

    @property
    def quantity(self) -> Decimal:
        return Decimal(0) if self.maximum is None else canonical_decimal(self.maximum)

    def _body(self) -> dict[str, Any]:
        return {"max": None if self.maximum is None else _text(canonical_decimal(self.maximum))}

    @classmethod
    def _load(cls, data: Mapping[str, Any]) -> AggregateState:
        return cls(None if data["max"] is None else _dec(data["max"]))


class UniqueCountState(AggregateState):
    """Holds every distinct value (memory grows with them)."""

    aggregation = Aggregation.UNIQUE_COUNT

    def __init__(self, values: Iterable[str] = ()) -> None:
        self.values = set(values)

    def add(self, event_id: str, event_time: datetime, value: Decimal | str | None) -> None:
        if not isinstance(value, str):
            raise RatingError("unique_count needs a text value")
        self.values.add(value)

    def merge(self, other: AggregateState) -> None:
        other = self._same(other)
        self.values |= other.values

    @property
    def quantity(self) -> Decimal:
        return Decimal(len(self.values))

    def _body(self) -> dict[str, Any]:
        return {"values": sorted(self.values)}

    @classmethod
    def _load(cls, data: Mapping[str, Any]) -> AggregateState:
        values = data["values"]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise TypeError("values must be a list of strings")
        return cls(values)


class LatestState(AggregateState):
    """The value of the latest event by (event time, event id): a tie on time goes
    to the greater event id, so any order gives the same answer."""

    aggregation = Aggregation.LATEST

    def __init__(self, latest: tuple[datetime, str, Decimal] | None = None) -> None:
        self.latest = latest

    def add(self, event_id: str, event_time: datetime, value: Decimal | str | None) -> None:
        if not isinstance(value, Decimal):
            raise RatingError("latest needs a decimal value")
        candidate = (event_time.astimezone(UTC), event_id, value)
        if self.latest is None or candidate[:2] > self.latest[:2]:
            self.latest = candidate
        elif candidate[:2] == self.latest[:2] and value != self.latest[2]:
            # One event id, two values: keep the greater, order-independent (the
            # conflict itself is the caller's to report, as for usage.recorded).
            self.latest = max(candidate, self.latest, key=lambda item: item[2])

    def merge(self, other: AggregateState) -> None:
        other = self._same(other)
        if other.latest is not None:
            self.add(other.latest[1], other.latest[0], other.latest[2])

    @property
    def quantity(self) -> Decimal:
        return Decimal(0) if self.latest is None else canonical_decimal(self.latest[2])

    def _body(self) -> dict[str, Any]:
        if self.latest is None:
            return {"latest": None}
        when, event_id, value = self.latest
        return {
            "latest": {
                "event_time": when.isoformat().replace("+00:00", "Z"),
                "event_id": event_id,
                "value": _text(canonical_decimal(value)),
            }
        }

    @classmethod
    def _load(cls, data: Mapping[str, Any]) -> AggregateState:
        latest = data["latest"]
        if latest is None:
            return cls()
        when = datetime.fromisoformat(str(latest["event_time"]).replace("Z", "+00:00"))
        if when.tzinfo is None:
            raise ValueError("latest.event_time must carry a time zone")
        return cls((when.astimezone(UTC), str(latest["event_id"]), _dec(latest["value"])))


_STATES: dict[Aggregation, type[AggregateState]] = {
    state.aggregation: state
    for state in (CountState, SumState, MaxState, UniqueCountState, LatestState)
}


def new_state(aggregation: Aggregation) -> AggregateState:
    """An empty state of ``aggregation`` (quantity 0)."""
    return _STATES[aggregation]()
