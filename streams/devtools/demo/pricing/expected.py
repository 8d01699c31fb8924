"""The independent answer: what each customer of a pricing scenario must be invoiced.

Computed from the price book's YAML text and the events (CloudEvents JSON lines,
as :mod:`streams.devtools.demo.pricing.generator` writes them and ``invoicing import
events`` reads them) with its own small arithmetic, **without** the rating core
(:mod:`streams.core.domain.rating`) or any other module of the project: a bug in the
core cannot hide itself by being used twice. A unit test enforces the rule
(``tests/unit/test_pricing_expected.py``). It reads what it needs and checks
little: the core validates the book; this module only has to get the arithmetic
right on a valid one.

How it stays obviously correct:

* **Numbers are :class:`fractions.Fraction`**, built from the decimal *text*
  (the YAML is read with PyYAML's ``BaseLoader``, which resolves no type: every
  scalar stays the string it was written as). A fraction is exact under ``+``,
  ``-``, ``*`` and ``/``, so no precision or context can round anything silently.
  The two roundings are the documented ones (``docs/rating.md``): a prorated fee
  or minimum to 12 decimal places, and the subtotal to the currency's minor unit,
  both half-even (``round(Fraction, n)`` rounds half to even).
* **Rules written the way ``docs/rating.md`` states them**, one small function
  each, not the way the core computes them: the state of a subscription *at an
  instant* is the last event (by effective time, then file order) at or before
  it; a day belongs to the last plan version held for a positive time that day;
  a graduated charge walks the tiers; a volume charge finds the one tier; a
  package counts started packages; a minimum compares with the segment's other
  lines.

The rules, from ``docs/rating.md``: segments per plan version (whole UTC days),
proration ``amount * days / days in month``, metered usage on the segment of its
UTC day, pass-through lines on the segment of their (clamped) day with that
version's markup, a customer without a subscription billed at cost, the minimum
per segment, the subtotal the exact sum of every line rounded once. Whatever the
core would **hold** (usage without a subscription, an unpriced or unknown metric,
a missing value, an unknown plan or version, a negative tiered quantity,
unpriced pass-through) is listed in :attr:`ExpectedInvoice.gaps`, and such an
invoice has no subtotal.

Shapes: money is exact, as :class:`~decimal.Decimal` in the invoice currency's
units in what this module returns; times are UTC.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Context, Decimal, Inexact
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "Book",
    "Event",
    "ExpectedInvoice",
    "ExpectedLine",
    "expected_invoices",
    "load_book",
    "plan_of_each_day",
    "read_events",
    "round_half_even",
]

#: Decimal places of a prorated amount (docs/rating.md "Proration").
PRORATION_PLACES = 12

#: Minor-unit exponents (ISO 4217) of the currencies a scenario may bill in.
MINOR_UNITS = {"USD": 2, "EUR": 2, "GBP": 2, "CHF": 2, "CAD": 2, "AUD": 2, "JPY": 0}

#: ``up_to`` values that mean "open" (the last tier).
OPEN_BOUNDS = frozenset({"null", "~", "", "inf", "+inf", ".inf", "+.inf", "infinity"})

_DAY = timedelta(days=1)


# --------------------------------------------------------------------------- numbers


def number(text: Any) -> Fraction:
    """The exact value of a decimal written as text (``"0.0015"``, ``"12"``, ``"-3.5"``)."""
    return Fraction(str(text).strip())


def round_half_even(value: Fraction, places: int) -> Fraction:
    """``value`` rounded to ``places`` decimal places, half to even."""
    return Fraction(round(value, places))


def as_decimal(value: Fraction) -> Decimal:
    """The exact :class:`Decimal` of a fraction with a terminating decimal expansion.

    Raises:
        decimal.Inexact: it has none (a bug: every amount here is a decimal).
    """
    context = Context(prec=400, traps=[Inexact])
    result = context.divide(Decimal(value.numerator), Decimal(value.denominator))
    if result == 0:
        return Decimal(0)
    result = result.normalize(context)  # no trailing zeros; but 90 became 9E+1:
    exponent = result.as_tuple().exponent
    return result.quantize(Decimal(1)) if isinstance(exponent, int) and exponent > 0 else result


# --------------------------------------------------------------------------- the book


@dataclass(frozen=True)
class Metric:
    """A billable metric as the book writes it (``property`` may be absent: count)."""

    code: str
    aggregation: str
    prop: str | None
    filter: Mapping[str, frozenset[str]]
    group_by: str | None


@dataclass(frozen=True)
class Version:
    """A plan version: its raw charges (dicts of text), in the book's order."""

    plan: str
    number: int
    effective_from: date
    currency: str
    charges: tuple[Mapping[str, Any], ...]

    def charge_of(self, metric: str) -> Mapping[str, Any] | None:
        for charge in self.charges:
            if charge.get("metric") == metric:
                return charge
        return None

    def charge_with_model(self, model: str) -> Mapping[str, Any] | None:
        for charge in self.charges:
            if charge["model"] == model:
                return charge
        return None


@dataclass(frozen=True)
class Book:
    metrics: Mapping[str, Metric]
    versions: Mapping[tuple[str, int], Version]


def load_book(text: str) -> Book:
    """The price book from its YAML text, every scalar read as the text it is.

    Raises:
        KeyError, ValueError: a field this module needs is missing or malformed
            (validate the book with the core first: ``invoicing plans validate``).
    """
    # BaseLoader resolves no tag: every scalar stays a str (also dates, nulls, numbers).
    loader = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # the C one when libyaml is there
    doc = yaml.load(text, Loader=loader)  # builds only str, list and dict
    metrics = {}
    for raw in doc["metrics"]:
        metrics[raw["code"]] = Metric(
            code=raw["code"],
            aggregation=raw["aggregation"],
            prop=raw.get("property"),
            filter={name: frozenset(values) for name, values in raw.get("filter", {}).items()},
            group_by=raw.get("group_by"),
        )
    versions = {}
    for plan in doc["plans"]:
        for raw in plan["versions"]:
            version = Version(
                plan=plan["code"],
                number=int(raw["version"]),
                effective_from=date.fromisoformat(raw["effective_from"]),
                currency=raw["currency"],
                charges=tuple(raw["charges"]),
            )
            versions[(version.plan, version.number)] = version
    return Book(metrics, versions)


# --------------------------------------------------------------------------- the events


@dataclass(frozen=True)
class Event:
    """One line of the events file: its CloudEvents id and type, customer, data."""

    event_id: str
    type: str
    customer_id: str
    data: Mapping[str, Any]
    #: Position in the file (the order of the customer's partition).
    position: int


def read_events(path: Path) -> list[Event]:
    """Every event of a CloudEvents JSON-lines file, in file order, with duplicates
    (a repeated ``id``: the first occurrence counts, as the pipeline stores it) and
    blank lines dropped.

    Raises:
        OSError: the file cannot be read. ValueError, KeyError: a line is not a
            CloudEvent with ``id``, ``type``, ``subject`` and ``data``.
    """
    with path.open(encoding="utf-8") as handle:
        return parse_events(handle)


def parse_events(lines: Iterable[str]) -> list[Event]:
    """:func:`read_events` on the lines of a file."""
    events: list[Event] = []
    seen: set[str] = set()
    for position, line in enumerate(lines):
        if not line.strip():
            continue
        raw = json.loads(line)
        if raw["id"] in seen:
            continue
        seen.add(raw["id"])
        events.append(Event(raw["id"], raw["type"], raw["subject"], raw["data"], position))
    return events


def instant(text: str) -> datetime:
    """A UTC instant from an ISO 8601 text with an offset (``Z`` included)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset")
    return moment.astimezone(UTC)


# --------------------------------------------------------------------------- segments


def month_days(period: str) -> list[date]:
    """Every day of the calendar month ``YYYY-MM``."""
    year, month = (int(part) for part in period.split("-"))
    day = date(year, month, 1)
    days = []
    while day.month == month:
        days.append(day)
        day += _DAY
    return days


#: A subscription event: (effective instant, file position, (plan, version) or None for an end).
Change = tuple[datetime, int, tuple[str, int] | None]


def subscription_changes(events: Iterable[Event]) -> list[Change]:
    """The subscription events among ``events``, as (effective instant, position, state)."""
    changes: list[Change] = []
    for event in events:
        if event.type in ("subscription.started", "subscription.changed"):
            state: tuple[str, int] | None = (
                event.data["plan_code"],
                int(event.data["plan_version"]),
            )
        elif event.type == "subscription.ended":
            state = None
        else:
            continue
        changes.append((instant(event.data["effective_at"]), event.position, state))
    return changes


def state_at(moment: datetime, changes: Sequence[Change]) -> tuple[str, int] | None:
    """The plan version in effect at ``moment``: the state set by the last change at or
    before it (by instant, then file position: at one instant the later one wins)."""
    current: tuple[str, int] | None = None
    for at, _, state in sorted(changes, key=lambda change: (change[0], change[1])):
        if at <= moment:
            current = state
    return current


def plan_of_each_day(period: str, changes: Sequence[Change]) -> dict[date, tuple[str, int]]:
    """Per day of ``period``, the plan version that bills it: the last one in effect for
    a positive time that day (docs/rating.md "Segments", rule 2). Days without one are
    absent."""
    result: dict[date, tuple[str, int]] = {}
    for day in month_days(period):
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        end = start + _DAY
        cuts = sorted({start, end} | {at for at, _, _ in changes if start < at < end})
        winner = None
        for since, until in itertools.pairwise(cuts):
            held = state_at(since, changes)
            if until > since and held is not None:
                winner = held
        if winner is not None:
            result[day] = winner
    return result


# --------------------------------------------------------------------------- the answer


@dataclass(frozen=True)
class ExpectedLine:
    """One line the invoice must carry.

    ``plan``/``version``/``days`` (the segment's day count) are ``None`` for a
    pass-through line at cost; ``quantity`` is ``None`` for fixed fees, true-ups and
    pass-through lines; ``event_id`` is the usage event of a pass-through line.
    """

    charge: str
    model: str
    amount: Decimal
    plan: str | None = None
    version: int | None = None
    days: int | None = None
    metric: str | None = None
    group: str | None = None
    quantity: Decimal | None = None
    event_id: str | None = None


@dataclass(frozen=True)
class ExpectedInvoice:
    """What one customer's invoice of one period must say.

    ``segments``: ``(plan, version, day count)`` in order of first day.
    ``rounded_total``: the exact total rounded once (half-even, minor unit);
    ``subtotal`` is that, or ``None`` when the core must hold the invoice (``gaps``
    says why).
    """

    customer_id: str
    period: str
    currency: str
    segments: tuple[tuple[str, int, int], ...]
    lines: tuple[ExpectedLine, ...]
    exact_total: Decimal
    rounded_total: Decimal
    gaps: tuple[str, ...] = ()

    @property
    def subtotal(self) -> Decimal | None:
        return None if self.gaps else self.rounded_total


def expected_invoices(
    book_text: str, events: Sequence[Event], period: str
) -> dict[str, ExpectedInvoice]:
    """Customer id → the invoice of ``period``, for every customer with a subscription
    day, metered usage or a pre-priced line in it.

    ``events`` are distinct (:func:`read_events`), in file order. The customer's
    currency is that of its latest ``customer.upserted`` (a customer without one is a
    gap: the pipeline cannot invoice it).

    Raises:
        KeyError, ValueError: the book or an event lacks a field read here.
    """
    book = load_book(book_text)
    per_customer: dict[str, list[Event]] = {}
    for event in events:
        per_customer.setdefault(event.customer_id, []).append(event)
    result = {}
    for customer, own in sorted(per_customer.items()):
        invoice = _Customer(book, period, customer, own).invoice()
        if invoice is not None:
            result[customer] = invoice
    return result


@dataclass(frozen=True)
class _Line:
    """An :class:`ExpectedLine` while computing: the amount an exact fraction."""

    charge: str
    model: str
    amount: Fraction
    plan: str | None = None
    version: int | None = None
    days: int | None = None
    metric: str | None = None
    group: str | None = None
    quantity: Fraction | None = None
    event_id: str | None = None

    def expected(self) -> ExpectedLine:
        return ExpectedLine(
            charge=self.charge,
            model=self.model,
            amount=as_decimal(self.amount),
            plan=self.plan,
            version=self.version,
            days=self.days,
            metric=self.metric,
            group=self.group,
            quantity=None if self.quantity is None else as_decimal(self.quantity),
            event_id=self.event_id,
        )


def _props(event: Event) -> Mapping[str, str]:
    properties: Mapping[str, str] = event.data.get("properties", {})
    return properties


def _values(event: Event) -> Mapping[str, str]:
    values: Mapping[str, str] = event.data.get("values", {})
    return values


@dataclass
class _Customer:
    book: Book
    period: str
    customer_id: str
    events: Sequence[Event]
    gaps: list[str] = field(default_factory=list)

    def invoice(self) -> ExpectedInvoice | None:
        days = month_days(self.period)
        day_plan = plan_of_each_day(self.period, subscription_changes(self.events))
        metered = [
            event
            for event in self.events
            if event.type == "usage.metered" and instant(event.data["event_time"]).date() in days
        ]
        priced = [
            event
            for event in self.events
            if event.type == "usage.recorded" and event.data["billing_period"] == self.period
        ]
        if not day_plan and not metered and not priced:
            return None
        currency = self._currency()
        uncovered = [e for e in metered if instant(e.data["event_time"]).date() not in day_plan]
        if uncovered:
            self.gaps.append(f"{len(uncovered)} metered event(s) on days without a subscription")
        for code in sorted({e.data["metric"] for e in metered} - set(self.book.metrics)):
            self.gaps.append(f"metric {code!r} is not in the price book")
        segments: dict[tuple[str, int], list[date]] = {}
        for day in days:
            if day in day_plan:
                segments.setdefault(day_plan[day], []).append(day)
        lines: list[_Line] = []
        if not segments:  # no subscription: each pre-priced line at cost
            for event in priced:
                if self._same_currency(event, currency):
                    lines.append(
                        _Line(
                            "pass_through",
                            "pass_through",
                            number(event.data["amount"]),
                            event_id=event.event_id,
                        )
                    )
        else:
            by_segment: dict[tuple[str, int], list[Event]] = {key: [] for key in segments}
            for event in priced:
                day = min(max(instant(event.data["event_time"]).date(), days[0]), days[-1])
                if day in day_plan:
                    by_segment[day_plan[day]].append(event)
                else:
                    self.gaps.append(f"pre-priced line {event.event_id} on a day without a plan")
            for key, own_days in segments.items():
                segment = _Segment(key[0], key[1], own_days, len(days))
                lines.extend(self._segment(segment, metered, by_segment[key], currency))
        exact = sum((line.amount for line in lines), Fraction(0))
        places = MINOR_UNITS[currency]
        rounded = as_decimal(round_half_even(exact, places)).quantize(Decimal(1).scaleb(-places))
        return ExpectedInvoice(
            customer_id=self.customer_id,
            period=self.period,
            currency=currency,
            segments=tuple((plan, version, len(d)) for (plan, version), d in segments.items()),
            lines=tuple(line.expected() for line in lines),
            exact_total=as_decimal(exact),
            rounded_total=rounded,
            gaps=tuple(dict.fromkeys(self.gaps)),
        )

    def _currency(self) -> str:
        found = [e for e in self.events if e.type == "customer.upserted"]
        if not found:
            self.gaps.append("no customer.upserted: the customer is unknown")
            return "USD"
        return str(found[-1].data["currency"])

    def _same_currency(self, event: Event, currency: str) -> bool:
        if event.data["currency"] == currency:
            return True
        self.gaps.append(f"pre-priced line {event.event_id} is in {event.data['currency']}")
        return False

    def _segment(
        self,
        segment: _Segment,
        metered: Sequence[Event],
        priced: Sequence[Event],
        currency: str,
    ) -> list[_Line]:
        """The lines of one segment: its version's charges in the book's order, its
        pass-through lines, then the minimum's true-up."""
        name = f"{segment.plan} v{segment.version}"
        version = self.book.versions.get((segment.plan, segment.version))
        if version is None:
            self.gaps.append(f"{name} is not in the price book")
            return []
        if segment.days[0] < version.effective_from:
            self.gaps.append(f"{name} is used before its effective date {version.effective_from}")
        if version.currency != currency:
            self.gaps.append(f"{name} is priced in {version.currency}, the customer in {currency}")
            return []
        own = set(segment.days)
        usage = [e for e in metered if instant(e.data["event_time"]).date() in own]
        lines: list[_Line] = []
        for charge in version.charges:
            if charge["model"] == "fixed":
                amount = prorated(number(charge["amount"]), segment.count, segment.month)
                lines.append(segment.line(charge["code"], "fixed", amount))
            elif "metric" in charge:
                lines.extend(self._metered(segment, charge, usage))
        for code in sorted({e.data["metric"] for e in usage}):
            if code in self.book.metrics and version.charge_of(code) is None:
                self.gaps.append(f"metric {code!r} is not priced by {name}")
        pass_through = version.charge_with_model("pass_through")
        for event in priced:
            if pass_through is None:
                self.gaps.append(f"{name} has no pass_through charge for {event.event_id}")
            elif self._same_currency(event, currency):
                factor = 1 + number(pass_through.get("markup_percent", "0")) / 100
                amount = number(event.data["amount"]) * factor
                lines.append(
                    segment.line(
                        pass_through["code"], "pass_through", amount, event_id=event.event_id
                    )
                )
        minimum = version.charge_with_model("minimum")
        if minimum is not None:
            floor = prorated(number(minimum["amount"]), segment.count, segment.month)
            charged = sum((line.amount for line in lines), Fraction(0))
            if charged < floor:
                lines.append(segment.line(minimum["code"], "minimum", floor - charged))
        return lines

    def _metered(
        self, segment: _Segment, charge: Mapping[str, Any], usage: Sequence[Event]
    ) -> list[_Line]:
        """One line per group value of the charge's metric (one at quantity 0 when no
        event is kept)."""
        metric = self.book.metrics[charge["metric"]]
        groups: dict[str | None, list[Event]] = {}
        for event in usage:
            if event.data["metric"] != metric.code:
                continue
            if any(_props(event).get(k) not in allowed for k, allowed in metric.filter.items()):
                continue
            group = None if metric.group_by is None else _props(event).get(metric.group_by)
            groups.setdefault(group, []).append(event)
        if not groups:
            groups = {None: []}
        lines = []
        for group in sorted(groups, key=lambda g: (g is not None, g or "")):
            quantity = self._quantity(metric, groups[group])
            if quantity is None:
                continue
            amount = price(charge, quantity)
            if amount is None:
                self.gaps.append(
                    f"metric {metric.code!r} totals {as_decimal(quantity)}, "
                    f"negative under {charge['model']}"
                )
                continue
            lines.append(
                segment.line(
                    charge["code"],
                    charge["model"],
                    amount,
                    metric=metric.code,
                    group=group,
                    quantity=quantity,
                )
            )
        return lines

    def _quantity(self, metric: Metric, events: Sequence[Event]) -> Fraction | None:
        """The aggregate of ``events`` (filtered, one group); ``None`` (and a gap) when
        an event lacks the value the aggregation reads."""
        if metric.aggregation == "count":
            return Fraction(len(events))
        prop = metric.prop or ""
        if metric.aggregation == "unique_count":
            texts = set()
            for event in events:
                if prop not in _props(event):
                    self.gaps.append(f"event {event.event_id} has no text {prop!r}")
                    return None
                texts.add(_props(event)[prop])
            return Fraction(len(texts))
        readings: list[tuple[datetime, str, Fraction]] = []
        for event in events:
            if prop not in _values(event):
                self.gaps.append(f"event {event.event_id} has no decimal {prop!r}")
                return None
            moment = instant(event.data["event_time"])
            readings.append((moment, event.event_id, number(_values(event)[prop])))
        if not readings:
            return Fraction(0)
        if metric.aggregation == "sum":
            return sum((value for _, _, value in readings), Fraction(0))
        if metric.aggregation == "max":
            return max(value for _, _, value in readings)
        if metric.aggregation == "latest":  # the latest event time; a tie: the greater id
            return max(readings, key=lambda reading: (reading[0], reading[1]))[2]
        raise ValueError(f"unknown aggregation {metric.aggregation!r}")


@dataclass(frozen=True)
class _Segment:
    """The days of the month billed by one plan version."""

    plan: str
    version: int
    days: list[date]
    #: Days in the month (the proration divisor).
    month: int

    @property
    def count(self) -> int:
        return len(self.days)

    def line(self, charge: str, model: str, amount: Fraction, **detail: Any) -> _Line:
        return _Line(
            charge, model, amount, plan=self.plan, version=self.version, days=self.count, **detail
        )


# --------------------------------------------------------------------------- charge models


def prorated(amount: Fraction, days: int, days_in_month: int) -> Fraction:
    """``amount * days / days_in_month``, to 12 places half-even; a whole month exactly."""
    if days == days_in_month:
        return amount
    return round_half_even(amount * days / days_in_month, PRORATION_PLACES)


def tiers_of(charge: Mapping[str, Any]) -> list[tuple[Fraction | None, Fraction, Fraction]]:
    """``(up_to or None for open, unit price, flat amount)`` per tier."""
    result = []
    for tier in charge["tiers"]:
        bound = str(tier["up_to"]).strip().lower()
        up_to = None if bound in OPEN_BOUNDS else number(bound)
        result.append(
            (up_to, number(tier.get("unit_price", "0")), number(tier.get("flat_amount", "0")))
        )
    return result


def price(charge: Mapping[str, Any], quantity: Fraction) -> Fraction | None:
    """The amount of a metered charge for ``quantity``; ``None`` for a negative quantity
    under a model that cannot price one (tiers, packages)."""
    model = charge["model"]
    if model == "per_unit":
        return quantity * number(charge["unit_price"])
    if quantity < 0:
        return None
    if model == "graduated":
        return graduated_amount(tiers_of(charge), quantity)
    if model == "volume":
        return volume_amount(tiers_of(charge), quantity)
    if model == "package":
        return package_amount(
            quantity,
            size=number(charge["package_size"]),
            price=number(charge["price"]),
            free=number(charge.get("free_units", "0")),
        )
    raise ValueError(f"unknown charge model {model!r}")


def graduated_amount(
    tiers: Sequence[tuple[Fraction | None, Fraction, Fraction]], quantity: Fraction
) -> Fraction:
    """Each tier's units (above the previous bound, up to and including its own) at its
    price, plus its flat amount when at least one unit falls in it."""
    total = Fraction(0)
    below = Fraction(0)
    for up_to, unit_price, flat in tiers:
        top = quantity if up_to is None else min(quantity, up_to)
        units = top - below
        if units > 0:
            total += units * unit_price + flat
        if up_to is None or quantity <= up_to:
            break
        below = up_to
    return total


def volume_amount(
    tiers: Sequence[tuple[Fraction | None, Fraction, Fraction]], quantity: Fraction
) -> Fraction:
    """Every unit at the price of the tier the quantity falls in, plus its flat amount;
    nothing for 0."""
    if quantity == 0:
        return Fraction(0)
    for up_to, unit_price, flat in tiers:
        if up_to is None or quantity <= up_to:
            return quantity * unit_price + flat
    raise ValueError("the last tier is not open")


def package_amount(
    quantity: Fraction, *, size: Fraction, price: Fraction, free: Fraction
) -> Fraction:
    """``price`` per started package of ``size`` units of the quantity above ``free``
    (none when it is not above)."""
    billable = quantity - free
    if billable <= 0:
        return Fraction(0)
    return math.ceil(billable / size) * price
