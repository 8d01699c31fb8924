"""The usage view's state and how one account event changes it (pure: no faust, no I/O).

The faust app (:mod:`streams.apps.usage_view.app`) keeps four changelog-backed tables;
this module owns what their values mean, as plain JSON (decimals as strings), so
the same rules run in unit tests without Kafka:

=================  ==========================  ===============================================
table              key                         value
=================  ==========================  ===============================================
``customers``      customer id (raw, as the    JSON (:func:`new_customer`): name, currency,
                   topic's key)                subscription events, refused/conflicting
                                               records, the periods held
``periods``        ``"<customer>|<YYYY-MM>"``  JSON (:func:`new_period`): pass-through sums per
                                               (UTC day, currency), the rating core's
                                               the days with metered usage, the close,
                                               late usage
``usage_days``     ``"<customer>|<YYYY-MM>|    one UTC day's metered aggregates: per metric
                   <YYYY-MM-DD>"``             code its definition, the rating core's
                                               ``MetricUsage`` JSON, and unknown metrics'
                                               counts (a day at a time: an event rewrites
                                               its day, not the whole period)
``event_ids``      ``"\\x00<partition>|<period>|  ``{event id: "<digest> <period> <partition>
                   <first offset>"``: a chunk  <offset>"}``: deduplication by event id,
                   per batch (event_index.py)  looked up in memory (the largest table)
=================  ==========================  ===============================================

Effectively once without Kafka transactions: faust commits source offsets after the
changelog writes, so after a crash a record can be handled again. Every state
value remembers the offset of the last record applied to it (all records of one
customer are on one partition, in order), and ``event_ids`` remembers the offset
where an id was first seen, so a redelivered record is recognised whichever of
the changelog writes reached the broker before the crash (a ``usage_days`` value
keeps its own ``last_offset``: its write and the period's are separate records).

Why pass-through usage is kept as sums per (day, currency), not lines: rating
multiplies each pre-priced line by ``1 + markup/100`` and sums exactly (no
rounding until the subtotal), so rating one line per (day, currency) carrying
the exact sum of that day's lines gives the same exact total as rating every
line (:func:`streams.core.domain.rating.rate`, ``pass_through``), in memory bounded
by days x currencies instead of lines. The day is the line's ``event_time`` day
clamped into its billing period, the rule ``rate()`` assigns segments by.
"""

from __future__ import annotations

import decimal
import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Any

from streams.core.domain.events import (
    BillingPeriodClosed,
    CustomerUpserted,
    Envelope,
    EventData,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import BillableMetric, MeteredEvent, PriceBook, Usage
from streams.core.domain.rating.aggregate import MetricUsage

#: Separator of the ``periods`` table key: customer ids never contain it
#: (:data:`streams.core.domain.events.CustomerId`).
KEY_SEPARATOR = "|"

#: Significant digits of exact sums (as :mod:`streams.core.domain.invoice`).
_SUM_PRECISION = 80

#: Event types deduplicated by event id: those whose effect a resend would repeat.
#: ``customer.upserted`` is an upsert and ``billing_period.closed`` a marker: both
#: are idempotent by nature (as in the invoicing worker).
DEDUPLICATED = (
    UsageRecorded,
    UsageMetered,
    SubscriptionStarted,
    SubscriptionChanged,
    SubscriptionEnded,
)

_SUBSCRIPTION_TYPES: dict[str, type[EventData]] = {
    model.event_type: model
    for model in (SubscriptionStarted, SubscriptionChanged, SubscriptionEnded)
}


@contextmanager
def _exact() -> Iterator[None]:
    with decimal.localcontext() as ctx:
        ctx.prec = _SUM_PRECISION
        ctx.traps[decimal.Inexact] = True
        ctx.traps[decimal.Rounded] = False
        yield


def add_decimal(total: str | None, amount: Decimal) -> str:
    """``total + amount`` exactly, as a plain decimal string (``None`` is 0; never
    exponent notation: ``5.862E-7`` is written ``0.0000005862``, as the HTTP bodies'
    decimal strings require)."""
    with _exact():
        return format(Decimal(total or "0") + amount, "f")


def period_key(customer_id: str, period: str) -> str:
    """The ``periods`` table key of (customer, period)."""
    return f"{customer_id}{KEY_SEPARATOR}{period}"


def split_period_key(key: str) -> tuple[str, str]:
    customer, _, period = key.rpartition(KEY_SEPARATOR)
    return customer, period


def clamped_day(instant: datetime, period: BillingPeriod) -> date:
    """The day ``rate()`` assigns a pre-priced line to: ``instant``'s UTC day, clamped
    into ``period`` (a charge that started the month before belongs to its first day)."""
    utc = instant.astimezone(UTC)
    if utc < period.start:
        return period.start.date()
    if utc >= period.end:
        return (period.end - timedelta(days=1)).date()
    return utc.date()


def digest(envelope: Envelope) -> str:
    """A short digest of an event's type and data (what "same content" means for a
    resend of the same id): 16 hex characters of SHA-256 over the type and the data's
    canonical JSON. The source and time attributes are not content: a client that
    resends an event sets a new ``time``."""
    data = envelope.data
    payload = data.model_dump_json() if isinstance(data, EventData) else repr(data)
    return hashlib.sha256(f"{envelope.type}\n{payload}".encode()).hexdigest()[:16]


def event_period(data: EventData) -> str | None:
    """The billing period a usage event belongs to (``None`` for other events):
    ``usage.recorded`` names it, ``usage.metered`` is in the UTC month of its time."""
    if isinstance(data, UsageRecorded):
        return data.billing_period
    if isinstance(data, UsageMetered):
        return str(BillingPeriod.of(data.event_time))
    if isinstance(data, BillingPeriodClosed):
        return data.billing_period
    return None


def seen_value(digest_text: str, period: str | None, partition: int, offset: int) -> str:
    """The ``event_ids`` value: ``"<digest> <period or -> <partition> <offset>"``."""
    return f"{digest_text} {period or '-'} {partition} {offset}"


def parse_seen(value: str) -> tuple[str, str | None, int, int]:
    """``(digest, period, partition, offset)`` of an ``event_ids`` value."""
    digest_text, period, partition, offset = value.split(" ")
    return digest_text, None if period == "-" else period, int(partition), int(offset)


# --------------------------------------------------------------------------- states


def new_customer(customer_id: str, partition: int) -> dict[str, Any]:
    """An empty ``customers`` value."""
    return {
        "customer_id": customer_id,
        "name": None,
        "currency": None,
        "subscriptions": [],
        "refused": 0,
        "last_refused": None,
        "conflicts": 0,
        "last_conflict": None,
        "periods": [],
        "partition": partition,
        "last_offset": -1,
    }


def new_period(customer_id: str, period: str, partition: int) -> dict[str, Any]:
    """An empty ``periods`` value."""
    return {
        "customer_id": customer_id,
        "period": period,
        "partition": partition,
        "last_offset": -1,
        "pass_through": {},
        "pass_through_lines": 0,
        "usage_days": [],
        "metered_events": 0,
        "closed": None,
        "late": {"pass_through": {}, "pass_through_lines": 0, "metered_events": 0},
        "first_event_at": None,
        "last_event_at": None,
        "last_event_id": None,
    }


class Outcome(StrEnum):
    """What handling one record did (the ``outcome`` label of the view's metrics)."""

    APPLIED = "applied"
    LATE = "late"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    REDELIVERED = "redelivered"
    REFUSED = "refused"
    IGNORED = "ignored"


@dataclass
class Change:
    """The table writes of one record: ``None`` for a table means "unchanged"."""

    outcome: Outcome
    customer: dict[str, Any] | None = None
    period_key: str | None = None
    period: dict[str, Any] | None = None
    day_key: str | None = None
    day: dict[str, Any] | None = None
    event_id: str | None = None
    event_id_value: str | None = None
    detail: str | None = None


def refused(
    customer: dict[str, Any] | None, customer_id: str | None, partition: int, reason: str
) -> Change:
    """A record that does not decode or validate. It is counted on the customer its
    key names (when the key is a usable id), because the invoicing workers dead-letter
    the same record and hold that customer's invoice: the preview says so."""
    if customer_id is None:
        return Change(Outcome.REFUSED, detail=reason)
    state = dict(customer) if customer is not None else new_customer(customer_id, partition)
    state["refused"] = int(state["refused"]) + 1
    state["last_refused"] = reason[:500]
    return Change(Outcome.REFUSED, customer=state, detail=reason)


def apply(
    envelope: Envelope,
    *,
    partition: int,
    offset: int,
    customer: Mapping[str, Any] | None,
    period: Mapping[str, Any] | None,
    seen: str | None,
    book: PriceBook,
    now: datetime,
    day: Mapping[str, Any] | None = None,
) -> Change:
    """How the decoded record at ``partition``/``offset`` changes the view.

    Args:
        customer: the ``customers`` value of the record's customer, if any.
        period: the ``periods`` value of (customer, :func:`event_period`), if any.
        seen: the ``event_ids`` value of the record's id, if any.
        day: the ``usage_days`` value of :func:`usage_day_key` (metered events), if any.
        book: the price book in force (metric definitions for new metered usage).
        now: processing time (UTC), kept as the period's ``last_event_at``.

    Returns:
        The writes to make; the caller writes every non-``None`` part.
    """
    data = envelope.data
    customer_id = envelope.subject
    cust = dict(customer) if customer is not None else new_customer(customer_id, partition)
    # A state value is cumulative: one whose last_offset >= offset already holds the
    # effect of this record (a redelivery after a crash), so it is not applied twice.
    customer_has_it = customer is not None and int(cust["last_offset"]) >= offset
    ids_value: str | None = None
    if isinstance(data, DEDUPLICATED):
        content = digest(envelope)
        if seen is not None:
            seen_digest, _, seen_partition, first_offset = parse_seen(seen)
            if not (seen_partition == partition and first_offset == offset):
                if seen_digest == content:
                    return Change(Outcome.DUPLICATE, event_id=envelope.id)
                if customer_has_it:
                    return Change(Outcome.REDELIVERED, event_id=envelope.id)
                cust["conflicts"] = int(cust["conflicts"]) + 1
                cust["last_conflict"] = (
                    f"event {envelope.id!r} at offset {offset} has other content than the "
                    f"event of that id at offset {first_offset}"
                )
                cust["last_offset"] = offset
                return Change(Outcome.CONFLICT, customer=cust, detail=cust["last_conflict"])
            # the same record again (its id was written, the state maybe not): apply it
        ids_value = seen_value(content, event_period(data), partition, offset)

    if isinstance(
        data, CustomerUpserted | SubscriptionStarted | SubscriptionChanged | SubscriptionEnded
    ):
        if customer_has_it:
            return Change(Outcome.REDELIVERED, event_id=envelope.id, event_id_value=ids_value)
        cust["last_offset"] = offset
    if isinstance(data, CustomerUpserted):
        cust["name"] = data.name
        cust["currency"] = data.currency
        return Change(Outcome.APPLIED, customer=cust)
    if isinstance(data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded):
        cust["subscriptions"] = [
            *cust["subscriptions"],
            {"type": data.event_type, "data": data.model_dump(mode="json")},
        ]
        return Change(
            Outcome.APPLIED, customer=cust, event_id=envelope.id, event_id_value=ids_value
        )

    period_name = event_period(data)
    if period_name is None:  # pragma: no cover - every account event type is handled above
        return Change(Outcome.IGNORED)
    key = period_key(customer_id, period_name)
    state = dict(period) if period is not None else new_period(customer_id, period_name, partition)
    # The customer's value is written only when it changes (a new customer or period):
    # one changelog record per event for the period, not two.
    changed_customer: dict[str, Any] | None = None
    if customer is None or period_name not in cust["periods"]:
        cust["periods"] = sorted({*cust["periods"], period_name})
        changed_customer = cust
    if period is not None and int(state["last_offset"]) >= offset:
        # the period's write reached the changelog before a crash: not applied again,
        # but a metered event's day is its own record, which may not have (its
        # last_offset says; an event after the close adds to no day)
        day_value = None
        closed = state["closed"]
        if isinstance(data, UsageMetered) and (closed is None or offset < int(closed["offset"])):
            _, day_value = _add_metered(envelope.id, data, day, book, offset)
        return Change(
            Outcome.REDELIVERED,
            customer=changed_customer,
            day_key=usage_day_key(customer_id, data) if day_value is not None else None,
            day=day_value,
            event_id=envelope.id if ids_value is not None else None,
            event_id_value=ids_value,
        )
    state["last_offset"] = offset
    outcome = Outcome.APPLIED

    if isinstance(data, BillingPeriodClosed):
        # A released hold's re-close, and a draft's finalisation, bill the usage that
        # came after the first marker too (docs/invoices.md "Drafts and finalisation").
        if data.reason in ("hold_released", "draft_finalize"):
            _fold_late(state)
        if state["closed"] is None or data.reason in ("hold_released", "draft_finalize"):
            state["closed"] = {
                "closed_at": data.closed_at.isoformat().replace("+00:00", "Z"),
                "offset": offset,
                "reason": data.reason,
            }
        return Change(outcome, customer=changed_customer, period_key=key, period=state)

    late = state["closed"] is not None
    stamp = now.astimezone(UTC).isoformat().replace("+00:00", "Z")
    state["first_event_at"] = state["first_event_at"] or stamp
    state["last_event_at"] = stamp
    state["last_event_id"] = envelope.id
    if isinstance(data, UsageRecorded):
        line_day = clamped_day(data.event_time, BillingPeriod.parse(period_name)).isoformat()
        # (the late part copied: the period passed in is never mutated)
        target = dict(state["late"]) if late else state
        # a new dict for the day changed only (the others are shared, never mutated)
        sums = dict(target["pass_through"])
        per_day = dict(sums.get(line_day, {}))
        per_day[data.currency] = add_decimal(per_day.get(data.currency), data.amount)
        sums[line_day] = per_day
        target["pass_through"] = sums
        target["pass_through_lines"] = int(target["pass_through_lines"]) + 1
        if late:
            state["late"] = target
            outcome = Outcome.LATE
    elif isinstance(data, UsageMetered):
        if late:
            state["late"] = {
                **state["late"],
                "metered_events": int(state["late"]["metered_events"]) + 1,
            }
            outcome = Outcome.LATE
        else:
            day_key, day_value = _add_metered(envelope.id, data, day, book, offset)
            state["metered_events"] = int(state["metered_events"]) + 1
            day_text = data.event_time.astimezone(UTC).date().isoformat()
            if day_text not in state["usage_days"]:
                state["usage_days"] = sorted([*state["usage_days"], day_text])
            return Change(
                outcome,
                customer=changed_customer,
                period_key=key,
                period=state,
                day_key=day_key,
                day=day_value,
                event_id=envelope.id if ids_value is not None else None,
                event_id_value=ids_value,
            )
    return Change(
        outcome,
        customer=changed_customer,
        period_key=key,
        period=state,
        event_id=envelope.id if ids_value is not None else None,
        event_id_value=ids_value,
    )


def usage_day_key(customer_id: str, data: EventData) -> str | None:
    """The ``usage_days`` key a ``usage.metered`` event adds to (``None`` for others)."""
    if not isinstance(data, UsageMetered):
        return None
    day = data.event_time.astimezone(UTC).date()
    return f"{customer_id}{KEY_SEPARATOR}{day.strftime('%Y-%m')}{KEY_SEPARATOR}{day.isoformat()}"


def new_day() -> dict[str, Any]:
    """An empty ``usage_days`` value (``last_offset``: the last record applied to it)."""
    return {"metrics": {}, "usage": {}, "unknown": {}, "last_offset": -1}


def _add_metered(
    event_id: str,
    data: UsageMetered,
    day: Mapping[str, Any] | None,
    book: PriceBook,
    offset: int,
) -> tuple[str, dict[str, Any] | None]:
    """The day's aggregates with the event at ``offset`` added (``None``: the day's
    write of that record reached the changelog before a crash, the day holds it
    already). A metric is aggregated under the definition it had when the day's first
    event of it arrived (kept with it, so the preview can tell a redefined metric); a
    metric the book does not define is counted."""
    key = usage_day_key(data.customer_id, data)
    assert key is not None  # a usage.metered event
    if day is not None and int(day.get("last_offset", -1)) >= offset:
        return key, None
    value: dict[str, Any] = {
        "metrics": dict(day["metrics"]) if day else {},
        "usage": dict(day["usage"]) if day else {},
        "unknown": dict(day["unknown"]) if day else {},
        "last_offset": offset,
    }
    code = data.metric
    stored = value["metrics"].get(code)
    metric = BillableMetric.model_validate(stored) if stored is not None else book.metric(code)
    if metric is None:
        value["unknown"][code] = int(value["unknown"].get(code, 0)) + 1
        return key, value
    body = value["usage"].get(code)
    usage = MetricUsage.from_json(metric, body) if body is not None else MetricUsage(metric)
    usage.add(MeteredEvent.of(event_id, data))
    # the stored definition is kept as it is (not dumped again)
    value["metrics"][code] = stored if stored is not None else metric.model_dump(mode="json")
    value["usage"][code] = usage.to_json()
    return key, value


def usage_of_days(
    period: BillingPeriod, days: Mapping[str, Mapping[str, Any]], book: PriceBook
) -> tuple[Usage, list[str]]:
    """The period's :class:`~streams.core.domain.rating.Usage` under ``book``'s metric
    definitions, from its ``usage_days`` values (by ``YYYY-MM-DD``), and the codes of
    metrics aggregated under another definition than the book's (not rebuildable from
    aggregates: reported as ``stale_aggregates`` and left out). A metric the book no
    longer defines counts as unknown (rating holds it, as the invoice job would)."""
    usage = Usage.for_book(period, book)
    stale: set[str] = set()
    for day_text, value in days.items():
        day = date.fromisoformat(day_text)
        for code, body in value.get("usage", {}).items():
            definition = usage.metrics.get(code)
            stored = BillableMetric.model_validate(value["metrics"][code])
            if definition is None:
                counts = usage.unknown.setdefault(day, {})
                counts[code] = counts.get(code, 0) + int(body["events"])
            elif definition != stored:
                stale.add(code)
            else:
                usage.days.setdefault(day, {})[code] = MetricUsage.from_json(definition, body)
        for code, count in value.get("unknown", {}).items():
            counts = usage.unknown.setdefault(day, {})
            counts[code] = counts.get(code, 0) + int(count)
    return usage, sorted(stale)


def _fold_late(state: dict[str, Any]) -> None:
    """A hold was released: the invoice is built from every line before the new
    marker, the late pass-through lines included (the invoicing worker's rule)."""
    late = state["late"]
    sums = {d: dict(per) for d, per in state["pass_through"].items()}
    for day, per in late["pass_through"].items():
        mine = sums.setdefault(day, {})
        for currency, amount in per.items():
            mine[currency] = add_decimal(mine.get(currency), Decimal(amount))
    state["pass_through"] = sums
    state["pass_through_lines"] = int(state["pass_through_lines"]) + int(late["pass_through_lines"])
    state["late"] = {
        "pass_through": {},
        "pass_through_lines": 0,
        "metered_events": int(late["metered_events"]),
    }


def subscription_events(customer: Mapping[str, Any]) -> list[SubscriptionEvent]:
    """The customer's subscription events, in partition order, as models."""
    events: list[SubscriptionEvent] = []
    for item in customer.get("subscriptions", ()):
        model = _SUBSCRIPTION_TYPES[item["type"]]
        events.append(model.model_validate(item["data"]))  # type: ignore[arg-type]
    return events


def subscription_horizon(now: datetime, retain_open: timedelta) -> datetime:
    """The first instant of the oldest billing period the view still answers: 00:00 UTC
    of the first day of the month that holds ``now - retain_open`` (every period whose
    month ended more than ``retain_open`` ago is dropped, closed or not, so every kept
    period starts at or after it)."""
    oldest = (now - retain_open).astimezone(UTC)
    return datetime(oldest.year, oldest.month, 1, tzinfo=UTC)


def compact_subscriptions(
    subscriptions: list[dict[str, Any]], horizon: datetime
) -> list[dict[str, Any]] | None:
    """``subscriptions`` (a customer's stored subscription events, in partition order)
    without the events that no period from ``horizon`` on can see, or None when none can
    be dropped.

    Rule (the timeline of :mod:`streams.core.domain.rating.segments`: events ordered by
    ``effective_at``, ties in partition order, the later winning): every event effective at
    or before ``horizon`` only sets the state at ``horizon`` — the state at a day's first
    instant takes every event up to and including it — so only the last of them (by
    ``effective_at``, then partition order) is kept, in front of the later events, whose
    order is unchanged. So ``day_plans`` gives the same plan for every day from
    ``horizon`` on (``tests/unit/usage_view/test_subscription_bound.py`` checks it on
    generated histories). Bound: one event before ``horizon`` plus the events after it.
    """
    at_or_before: list[tuple[datetime, int]] = []
    for order, item in enumerate(subscriptions):
        effective = datetime.fromisoformat(str(item["data"]["effective_at"]).replace("Z", "+00:00"))
        if effective <= horizon:
            at_or_before.append((effective, order))
    if len(at_or_before) <= 1:
        return None
    last = max(at_or_before)[1]
    earlier = {order for _, order in at_or_before}
    return [subscriptions[last]] + [
        item for order, item in enumerate(subscriptions) if order not in earlier
    ]


def expired(
    period: Mapping[str, Any], *, now: datetime, retain_closed: timedelta, retain_open: timedelta
) -> bool:
    """Whether a ``periods`` value may be dropped: closed more than ``retain_closed``
    ago, or never closed and its month ended more than ``retain_open`` ago."""
    billing = BillingPeriod.parse(str(period["period"]))
    closed = period.get("closed")
    if closed is not None:
        at = datetime.fromisoformat(str(closed["closed_at"]).replace("Z", "+00:00"))
        return now - at > retain_closed
    return now - billing.end > retain_open
