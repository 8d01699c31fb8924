"""Billing periods: calendar months in UTC, written ``YYYY-MM``.

A usage line belongs to the period of its event time's UTC month; the instant
``2024-09-30T23:59:59.999Z`` is in ``2024-09`` and ``2024-10-01T00:00:00Z`` in
``2024-10``. Naive datetimes are refused rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from streams.core.domain.errors import InvalidPeriod

_PERIOD = re.compile(r"^(\d{4})-(0[1-9]|1[0-2])$")

#: Pattern of a billing period as written in events and JSON Schema: a month from
#: 1970-01 to 9999-12 (the years :class:`BillingPeriod` accepts).
PERIOD_PATTERN = r"^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])$"


@dataclass(frozen=True, order=True)
class BillingPeriod:
    """A calendar month, UTC. ``str()`` gives ``YYYY-MM``."""

    year: int
    month: int

    def __post_init__(self) -> None:
        if not (1 <= self.month <= 12) or not (1970 <= self.year <= 9999):
            raise InvalidPeriod(f"invalid billing period {self.year:04d}-{self.month:02d}")

    @classmethod
    def parse(cls, text: str) -> BillingPeriod:
        """``"2024-09"`` → ``BillingPeriod(2024, 9)``.

        Raises:
            InvalidPeriod: not ``YYYY-MM`` with a month 01-12.
        """
        match = _PERIOD.match(text.strip()) if isinstance(text, str) else None
        if match is None:
            raise InvalidPeriod(f"billing period must be YYYY-MM, got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    @classmethod
    def of(cls, instant: datetime) -> BillingPeriod:
        """The period containing ``instant`` (timezone-aware; converted to UTC).

        Raises:
            InvalidPeriod: ``instant`` is naive.
        """
        if instant.tzinfo is None or instant.utcoffset() is None:
            raise InvalidPeriod(f"naive datetime {instant.isoformat()} has no time zone; give UTC")
        utc = instant.astimezone(UTC)
        return cls(utc.year, utc.month)

    @property
    def start(self) -> datetime:
        """First instant of the period, UTC (inclusive)."""
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        """First instant of the next period, UTC (exclusive)."""
        return self.next().start

    def next(self) -> BillingPeriod:
        """The following month."""
        if self.month == 12:
            return BillingPeriod(self.year + 1, 1)
        return BillingPeriod(self.year, self.month + 1)

    def contains(self, instant: datetime) -> bool:
        """Whether ``instant`` (timezone-aware) falls in ``[start, end)``."""
        return BillingPeriod.of(instant) == self

    def __str__(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"
