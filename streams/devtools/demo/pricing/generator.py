"""A seeded generator of the pricing scenario's events (``examples/pricing/``).

"Relay", a fictional API platform, bills N customers for one calendar month under
``examples/pricing/price-book.yaml``. The same configuration (customers, seed,
period) gives the same events, byte for byte, on any machine.

Customers get a **profile** in turn (so every profile is present from 12
customers on), and the seed draws their times, volumes and users:

==============  =============================================================
profile         subscriptions (``subscription.*``, ``effective_at``)
==============  =============================================================
``starter``     starter v1 since before the period
``growth``      growth v1 since before the period (legacy version), pass-through
``growth-v2``   growth v2 since before the period
``new-starter`` starts starter v1 mid-period (a random instant)
``upgrade``     starter v1, changes to growth v2 mid-period
``migration``   growth v1, moved to growth v2 at midnight mid-period, pass-through
``churn``       growth v2, ends mid-period, little usage (a minimum true-up)
``new-growth``  starts growth v2 mid-period, little usage (a minimum true-up)
``downgrade``   growth v2, changes to starter v1 mid-period
``last-day``    starts starter v1 on the last day of the period, in the evening
``round-trip``  starter v1 → growth v2 → back to starter v1 within the period
``history``     starter v1 long ago, growth v1 before the period, a change to
                growth v2 scheduled after the period (ignored), pass-through
==============  =============================================================

Usage, on every day the customer has a plan and only while subscribed (after a
start, before an end), at random instants:

* ``api_calls`` — batches per endpoint (``properties.endpoint``,
  ``properties.billable = "true"``, ``values.calls``), plus one health-check batch a
  day with ``billable = "false"`` (excluded by the metric's filter);
* ``jobs`` — a few batch jobs a day, ``properties.status`` ``succeeded`` or
  ``failed`` (failed jobs are filtered out);
* ``storage_gb`` (growth: ``max``) or ``storage_gb_end`` (starter: ``latest``) — one
  gauge reading a day (``values.gb``), with the odd peak;
* ``seats`` — logins (``properties.user_id``) drawn from the customer's users, so
  the same user logs in many times (``unique_count``);
* ``egress_gb`` — on growth days only, per region (``properties.region``).

The metering client sends the code of the metric that the plan billing the day
prices (storage and egress differ between plans): the day of a change belongs to
the new plan (docs/rating.md "Segments"), so on that day the new plan's codes are
sent all day. Pass-through customers also get pre-priced ``usage.recorded``
lines (cloud re-billing) on their growth days. About one metered event in a
hundred (``duplicates_per_mille``) is sent again at the end with the same id and
data, as a producer retry would.

Output: CloudEvents 1.0 in the JSON event format, one per line (``invoicing import
events FILE`` produces them to ``billing.account-events.v1`` in binary mode):
every ``customer.upserted`` first, then the events in time order, then the resent
duplicates. Money and values are decimal strings; times UTC (``Z``).
"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from streams.devtools.demo.pricing.expected import (
    Change,
    month_days,
    plan_of_each_day,
    state_at,
)

__all__ = [
    "PROFILES",
    "SOURCE",
    "GeneratedCustomer",
    "Scenario",
    "ScenarioConfig",
    "generate",
]

#: CloudEvents ``source`` of the generated events.
SOURCE = "/examples/pricing/generator"

#: Namespace of the generated event ids (uuid5 of seed, period, customer, sequence).
_NAMESPACE = uuid.UUID("0b9d6c1e-6a0f-4f57-9a3b-5a4f7c2d8e13")

_DAY = timedelta(days=1)

STARTER = ("starter", 1)
GROWTH_V1 = ("growth", 1)
GROWTH_V2 = ("growth", 2)
#: The first day growth v2 may be used (its ``effective_from`` in the price book).
GROWTH_V2_FROM = date(2024, 7, 1)

#: Profiles that also get pre-priced (pass-through) lines.
PASS_THROUGH_PROFILES = frozenset({"growth", "migration", "history"})
#: Growth profiles with little usage, below the plan's (prorated) minimum commitment.
LIGHT_PROFILES = frozenset({"churn", "new-growth"})

PROFILES = (
    "starter",
    "growth",
    "growth-v2",
    "new-starter",
    "upgrade",
    "migration",
    "churn",
    "new-growth",
    "downgrade",
    "last-day",
    "round-trip",
    "history",
)

_COMPANIES = (
    "Acme Robotics",
    "Globex",
    "Initech",
    "Umbrella Labs",
    "Hooli",
    "Vandelay Imports",
    "Wonka Analytics",
    "Stark Data",
    "Tyrell Systems",
    "Cyberdyne",
    "Soylent Foods",
    "Oscorp",
    "Aperture Science",
    "Black Mesa",
    "Monarch Travel",
    "Pied Piper",
    "Dunder Mifflin",
    "Gringotts",
    "Nakatomi",
    "Wayne Logistics",
    "Massive Dynamic",
    "Bluth Homes",
    "Prestige Worldwide",
    "Sterling Cooper",
    "Los Pollos",
    "Virtucon",
    "Gekko & Co",
    "Krusty Foods",
    "Planet Express",
    "Ollivanders",
)
_ENDPOINTS = ("/v1/search", "/v1/embed", "/v1/chat", "/v1/files", "/v1/users", "/v1/events")
_REGIONS = ("us-east-1", "eu-west-1", "ap-southeast-1")
_QUEUES = ("default", "reports", "exports")
_CLOUD_SKUS = (
    ("AmazonEC2", "EC2 instances (re-billed)", "Hrs"),
    ("AmazonS3", "S3 storage (re-billed)", "GB-Mo"),
    ("AmazonRDS", "RDS databases (re-billed)", "Hrs"),
    ("AWSDataTransfer", "Data transfer (re-billed)", "GB"),
)


@dataclass(frozen=True)
class ScenarioConfig:
    """What to generate.

    Attributes:
        customers: how many customers (>= 1; every profile from 12 on).
        seed: the random seed (same seed, same events).
        period: the billing period ``YYYY-MM`` (from 2024-08: growth v2 starts in July).
        duplicates_per_mille: metered events sent twice, per thousand (0-1000).
    """

    customers: int = 30
    seed: int = 1
    period: str = "2024-11"
    duplicates_per_mille: int = 10

    def __post_init__(self) -> None:
        if self.customers < 1:
            raise ValueError("customers must be at least 1")
        if not 0 <= self.duplicates_per_mille <= 1000:
            raise ValueError("duplicates_per_mille must be within 0..1000")
        first = date.fromisoformat(f"{self.period}-01")
        if first <= GROWTH_V2_FROM:
            raise ValueError(f"period must be after {GROWTH_V2_FROM:%Y-%m} (growth v2)")


@dataclass(frozen=True)
class GeneratedCustomer:
    """A generated customer: id, name, profile, and its subscription story in words."""

    customer_id: str
    name: str
    profile: str
    story: str
    pass_through: bool


@dataclass(frozen=True)
class Scenario:
    """The generated events (CloudEvents JSON objects, in file order, resent
    duplicates included) and who they are about."""

    config: ScenarioConfig
    customers: tuple[GeneratedCustomer, ...]
    events: tuple[dict[str, Any], ...]
    duplicates: int

    def lines(self) -> Iterator[str]:
        """The JSON lines (compact, keys in a fixed order), one per event."""
        for event in self.events:
            yield json.dumps(event, separators=(",", ":"), ensure_ascii=False)

    def write(self, path: Path) -> Path:
        """Write the JSON-lines file (parents created); returns ``path``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8", newline="\n") as handle:
            for line in self.lines():
                handle.write(line + "\n")
        return path

    def count(self, event_type: str) -> int:
        """Events of ``event_type`` in the file (resent duplicates included)."""
        return sum(1 for event in self.events if event["type"] == event_type)

    def in_period(self, event_type: str) -> int:
        """Subscription events of ``event_type`` effective within the period."""
        return sum(
            1
            for event in self.events
            if event["type"] == event_type
            and event["data"]["effective_at"].startswith(self.config.period)
        )


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _decimal(units: int, places: int) -> str:
    """``units * 10**-places`` as canonical decimal text (``12.5``, not ``12.500``)."""
    text = format(Decimal(units).scaleb(-places), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def generate(config: ScenarioConfig) -> Scenario:
    """The scenario of ``config`` (see the module docstring)."""
    rng = random.Random(config.seed)
    days = month_days(config.period)
    start = datetime(days[0].year, days[0].month, 1, tzinfo=UTC)
    end = start + _DAY * len(days)
    customers: list[GeneratedCustomer] = []
    upserts: list[dict[str, Any]] = []
    timed: list[tuple[datetime, int, dict[str, Any]]] = []
    resendable: list[dict[str, Any]] = []
    for index in range(config.customers):
        profile = PROFILES[index % len(PROFILES)]
        company = _COMPANIES[index % len(_COMPANIES)]
        name = company if index < len(_COMPANIES) else f"{company} {index // len(_COMPANIES) + 1}"
        slug = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
        slug = "-".join(part for part in slug.split("-") if part)
        customer_id = (
            f"relay-s{config.seed}-{config.period.replace('-', '')}-{index + 1:03d}-{slug}"
        )
        builder = _CustomerEvents(config, rng, customer_id, start, end)
        builder.subscriptions(profile)
        builder.usage(profile)
        customers.append(
            GeneratedCustomer(
                customer_id, name, profile, builder.story(), profile in PASS_THROUGH_PROFILES
            )
        )
        upserts.append(
            builder.envelope(
                "customer.upserted",
                start - 30 * _DAY,
                {
                    "customer_id": customer_id,
                    "name": name,
                    "email": f"billing@{slug}.example",
                    "currency": "USD",
                },
            )
        )
        timed.extend(builder.timed)
        resendable.extend(builder.resendable)
    timed.sort(key=lambda item: (item[0], item[1]))
    wanted = round(len(resendable) * config.duplicates_per_mille / 1000)
    duplicates = rng.sample(resendable, wanted) if wanted else []
    events = (*upserts, *(event for _, _, event in timed), *duplicates)
    return Scenario(config, tuple(customers), events, len(duplicates))


@dataclass
class _CustomerEvents:
    """One customer's events while they are made."""

    config: ScenarioConfig
    rng: random.Random
    customer_id: str
    start: datetime
    end: datetime
    changes: list[Change] = field(default_factory=list)
    timed: list[tuple[datetime, int, dict[str, Any]]] = field(default_factory=list)
    resendable: list[dict[str, Any]] = field(default_factory=list)
    _sequence: int = 0

    # -- envelopes

    def envelope(self, event_type: str, moment: datetime, data: dict[str, Any]) -> dict[str, Any]:
        self._sequence += 1
        event_id = uuid.uuid5(
            _NAMESPACE,
            f"{self.config.seed}/{self.config.period}/{self.customer_id}/{self._sequence}",
        )
        return {
            "specversion": "1.0",
            "id": str(event_id),
            "source": SOURCE,
            "type": event_type,
            "time": _iso(moment),
            "subject": self.customer_id,
            "datacontenttype": "application/json",
            "data": {"schema_version": 1, **data},
        }

    def _emit(self, event_type: str, moment: datetime, data: dict[str, Any]) -> dict[str, Any]:
        event = self.envelope(event_type, moment, {"customer_id": self.customer_id, **data})
        self.timed.append((moment, self._sequence, event))
        return event

    # -- subscriptions

    def _instant_on(self, day: date, first_hour: int = 0, last_hour: int = 23) -> datetime:
        seconds = self.rng.randrange(first_hour * 3600, (last_hour + 1) * 3600)
        return datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(seconds=seconds)

    def _mid(self, first: int, last: int) -> datetime:
        """A random instant on day ``first..last`` (1-based) of the period."""
        offset = self.rng.randint(first, last) - 1
        return self._instant_on((self.start + offset * _DAY).date())

    def _before(
        self, not_before: date = date(2024, 1, 1), days_back: int = 240, days_min: int = 1
    ) -> datetime:
        """A random instant before the period: on a day at most ``days_back`` and at
        least ``days_min`` days before it, not before ``not_before``."""
        earliest = max(not_before, (self.start - days_back * _DAY).date())
        span = (self.start.date() - earliest).days - days_min
        return self._instant_on(earliest + self.rng.randint(0, max(0, span)) * _DAY)

    def _subscribe(self, event_type: str, moment: datetime, plan: tuple[str, int]) -> None:
        self._emit(
            event_type,
            moment,
            {"effective_at": _iso(moment), "plan_code": plan[0], "plan_version": plan[1]},
        )
        self.changes.append((moment, len(self.changes), plan))

    def _end(self, moment: datetime) -> None:
        self._emit(
            "subscription.ended",
            moment,
            {"effective_at": _iso(moment), "reason": "cancelled by the customer"},
        )
        self.changes.append((moment, len(self.changes), None))

    def subscriptions(self, profile: str) -> None:
        last = (self.end - self.start).days
        started, changed = "subscription.started", "subscription.changed"
        steps: dict[str, Callable[[], None]] = {
            "starter": lambda: self._subscribe(started, self._before(), STARTER),
            "growth": lambda: self._subscribe(started, self._before(), GROWTH_V1),
            "growth-v2": lambda: self._subscribe(started, self._before(GROWTH_V2_FROM), GROWTH_V2),
            "new-starter": lambda: self._subscribe(started, self._mid(3, last - 3), STARTER),
            "new-growth": lambda: self._subscribe(started, self._mid(3, last - 3), GROWTH_V2),
            "last-day": lambda: self._subscribe(
                started, self._instant_on((self.end - _DAY).date(), 18, 23), STARTER
            ),
        }
        if profile in steps:
            steps[profile]()
        elif profile == "upgrade":
            self._subscribe(started, self._before(), STARTER)
            self._subscribe(changed, self._mid(5, last - 5), GROWTH_V2)
        elif profile == "migration":  # a scheduled move: at midnight
            self._subscribe(started, self._before(days_back=400), GROWTH_V1)
            midnight = self.start + (self.rng.randint(8, last - 8) - 1) * _DAY
            self._subscribe(changed, midnight, GROWTH_V2)
        elif profile == "churn":
            self._subscribe(started, self._before(GROWTH_V2_FROM), GROWTH_V2)
            self._end(self._mid(6, last - 6))
        elif profile == "downgrade":
            self._subscribe(started, self._before(GROWTH_V2_FROM), GROWTH_V2)
            self._subscribe(changed, self._mid(5, last - 5), STARTER)
        elif profile == "round-trip":
            self._subscribe(started, self._before(), STARTER)
            self._subscribe(changed, self._mid(4, 10), GROWTH_V2)
            self._subscribe(changed, self._mid(16, last - 3), STARTER)
        elif profile == "history":
            self._subscribe(started, self._before(days_back=300, days_min=90), STARTER)
            self._subscribe(changed, self._before(days_back=60), GROWTH_V1)
            self._subscribe(changed, self._instant_on((self.end + 4 * _DAY).date()), GROWTH_V2)
        else:
            raise ValueError(f"unknown profile {profile!r}")

    def story(self) -> str:
        """The subscription history in words, e.g. ``starter v1; growth v2 from 11-17 14:03``."""
        parts = []
        for moment, _, state in sorted(self.changes):
            what = "ended" if state is None else f"{state[0]} v{state[1]}"
            if moment < self.start:
                parts = [what]  # the state at the period's start is what counts
            elif moment < self.end:
                parts.append(f"{what} from {moment:%m-%d %H:%M}")
            else:
                parts.append(f"({what} from {moment:%Y-%m-%d}, after the period)")
        return "; ".join(parts)

    # -- usage

    def _windows(self, day: date) -> list[tuple[datetime, datetime]]:
        """The parts of ``day`` while subscribed (any plan)."""
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        hi = lo + _DAY
        cuts = sorted({lo, hi} | {at for at, _, _ in self.changes if lo < at < hi})
        return [(a, b) for a, b in itertools.pairwise(cuts) if state_at(a, self.changes)]

    def _when(self, windows: list[tuple[datetime, datetime]]) -> datetime:
        lengths = [int((b - a).total_seconds()) for a, b in windows]
        offset = self.rng.randrange(sum(lengths))
        for (a, _), length in zip(windows, lengths, strict=True):
            if offset < length:
                return a + timedelta(seconds=offset)
            offset -= length
        raise AssertionError("unreachable: offset within the windows")

    def usage(self, profile: str) -> None:
        with_pass_through = profile in PASS_THROUGH_PROFILES
        rng = self.rng
        big = any(state is not None and state[0] == "growth" for _, _, state in self.changes)
        if profile in LIGHT_PROFILES:  # little usage: the minimum commitment tops it up
            big = False
        daily_calls = rng.randint(20_000, 90_000) if big else rng.randint(150, 4_000)
        endpoints = rng.sample(_ENDPOINTS, rng.randint(2, 4))
        users = rng.randint(6, 40) if big else rng.randint(2, 8)
        storage_milli = rng.randint(40_000, 1_400_000) if big else rng.randint(1_000, 60_000)
        regions = rng.sample(_REGIONS, rng.randint(1, 3))
        jobs_per_day = rng.randint(3, 14) if big else rng.randint(0, 3)
        day_plan = plan_of_each_day(self.config.period, self.changes)
        growth_days: list[date] = []
        for day, (plan, _) in sorted(day_plan.items()):
            windows = self._windows(day)
            if not windows:
                continue
            for endpoint in endpoints:
                for _ in range(rng.randint(1, 2)):
                    share = daily_calls * rng.randint(40, 160) // (150 * len(endpoints))
                    calls = max(1, share)
                    self._metered(
                        windows,
                        "api_calls",
                        {"endpoint": endpoint, "billable": "true"},
                        {"calls": str(calls)},
                    )
            self._metered(
                windows,
                "api_calls",
                {"endpoint": "/v1/health", "billable": "false"},
                {"calls": str(rng.randint(100, 300))},
            )
            for _ in range(rng.randint(0, jobs_per_day)):
                status = "failed" if rng.random() < 0.1 else "succeeded"
                self._metered(windows, "jobs", {"status": status, "queue": rng.choice(_QUEUES)}, {})
            storage_milli = max(
                500, storage_milli + rng.randint(-storage_milli // 50, storage_milli // 30)
            )
            reading = storage_milli * 3 // 2 if rng.random() < 0.05 else storage_milli  # a peak
            gauge = "storage_gb" if plan == "growth" else "storage_gb_end"
            self._metered(windows, gauge, {}, {"gb": _decimal(reading, 3)})
            for _ in range(rng.randint(1, max(1, users // 3))):
                self._metered(windows, "seats", {"user_id": f"u-{rng.randint(1, users):03d}"}, {})
            if plan == "growth":
                growth_days.append(day)
                for region in regions:
                    self._metered(
                        windows,
                        "egress_gb",
                        {"region": region},
                        {"gb": _decimal(rng.randint(50, 40_000 if big else 2_000), 2)},
                    )
        if with_pass_through and growth_days:
            for _ in range(rng.randint(3, 6)):
                self._pre_priced(rng.choice(growth_days), credit=False)
            if rng.random() < 0.5:
                self._pre_priced(rng.choice(growth_days), credit=True)

    def _metered(
        self,
        windows: list[tuple[datetime, datetime]],
        metric: str,
        properties: dict[str, str],
        values: dict[str, str],
    ) -> None:
        moment = self._when(windows)
        data = {"metric": metric, "event_time": _iso(moment), "properties": properties,
                "values": values}  # fmt: skip
        self.resendable.append(self._emit("usage.metered", moment, data))

    def _pre_priced(self, day: date, *, credit: bool) -> None:
        moment = self._when(self._windows(day))
        sku, description, unit = self.rng.choice(_CLOUD_SKUS)
        amount = self.rng.randint(5_000, 400_000_000)  # in millionths of a dollar: 0.005..400
        data = {
            "billing_period": self.config.period,
            "amount": ("-" if credit else "") + _decimal(amount, 6),
            "currency": "USD",
            "quantity": _decimal(self.rng.randint(1, 9_000), 1),
            "unit": unit,
            "sku_id": sku,
            "description": "Credit: " + description if credit else description,
            "charge_category": "Credit" if credit else "Usage",
            "event_time": _iso(moment),
            "provider": "AWS",
        }
        self.resendable.append(self._emit("usage.recorded", moment, data))
