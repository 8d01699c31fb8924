"""Rebuild a billing period from re-read account events (no I/O).

Fed the records of ``billing.account-events.v1`` in the replay's window (see
:mod:`streams.apps.replay.reader`), :class:`PeriodRebuild` keeps what the invoicing
worker would have stored, by the worker's rules:

* ``usage.recorded``: deduplicated **by event id across every period** (the
  worker's ``usage_lines`` has one row per event id, whatever its period). The
  first record of an id wins: on one partition the lowest offset (the order the
  worker reads it in); across partitions, which cannot happen for events keyed
  by their customer, the lowest partition number, so the result does not depend
  on the order the partitions were consumed in. A later record of the id with
  the **same payload** (SHA-256 of its canonical JSON,
  :func:`streams.core.billing.rows.payload_hash`, the worker's test) is a
  duplicate and is dropped silently; one with a **different payload** is a
  :class:`Conflict` (reported; the first stays, as in the worker, which also
  dead-letters it and holds the customer's invoice).
* ``customer.upserted``: the record with the highest (partition, offset) per
  customer wins (the worker never lets an older record overwrite a newer one).
* ``usage.metered``: deduplicated by event id across every period, by the same
  rules (the worker's ``metered_usage`` has one row per id); the events whose
  event time is in the period are rated (:meth:`PeriodRebuild.metered_by_customer`).
* ``subscription.*``: every one in the window, deduplicated by event id (same
  rules); the replay adds the customer's stored history from before the window
  (:meth:`PeriodRebuild.subscriptions`).
* ``billing_period.closed`` of the period: the customer's period was closed
  (any reason); the first marker's coordinates are kept.
* A record that does not decode is counted with its reason (the worker
  dead-lettered it and holds its customer).

Shapes: amounts are exact ``Decimal`` in the currency's units, as in the event;
``usage(customer)`` is a list of :class:`~streams.core.domain.invoice.UsageLine`
sorted by (partition, offset), so a tax document built from it is the same
document every time the same window is re-read.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

from streams.core.billing.rows import payload_hash
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
from streams.core.domain.fastcodec import FastUsage, usage_data
from streams.core.domain.invoice import UsageLine
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import MeteredEvent


@dataclass(frozen=True, order=True)
class Coordinates:
    """Where a record was read: topic, partition, offset (ordered by partition, then offset)."""

    topic: str = field(compare=False)
    partition: int
    offset: int


@dataclass(frozen=True)
class Conflict:
    """Two records with one usage event id and different payloads; ``kept`` wins.

    ``customer_id``/``billing_period`` are those of the record that was dropped.
    """

    event_id: str
    customer_id: str
    billing_period: str
    kept: Coordinates
    dropped: Coordinates
    kept_sha256: str
    dropped_sha256: str


@dataclass(frozen=True)
class InvalidRecord:
    """A record that does not decode; ``customer_id`` is its key when the key is UTF-8."""

    at: Coordinates
    customer_id: str | None
    reason: str


@dataclass
class _Kept:
    at: Coordinates
    #: the canonical payload hash, or for a record read by the fast decoder ``raw:`` and
    #: the SHA-256 of its value bytes (equal bytes, equal fact; :meth:`canonical` else)
    sha256: str
    customer_id: str
    billing_period: str
    #: Only for records of the rebuilt period (others need no payload).
    data: UsageRecorded | None
    #: The fast decoder's reading (every period: the canonical hash is made from it).
    fast: FastUsage | None = None

    def canonical(self) -> str:
        """The canonical payload hash (:func:`~streams.core.billing.rows.payload_hash`)."""
        if self.fast is not None:
            return payload_hash(usage_data(self.fast))
        return self.sha256

    def usage(self) -> UsageRecorded | None:
        """The record's data when it is of the rebuilt period."""
        if self.data is None and self.fast is not None:
            self.data = usage_data(self.fast)
        return self.data


@dataclass
class _KeptEvent:
    at: Coordinates
    sha256: str
    customer_id: str
    #: the billing period of a metered event; None for a subscription event
    period: str | None
    data: EventData


class PeriodRebuild:
    """The usage, customers and close markers of one period, rebuilt from re-read records.

    Raises (``__init__``):
        InvalidPeriod: ``period`` is not ``YYYY-MM``.
    """

    def __init__(self, period: str) -> None:
        self.period = str(BillingPeriod.parse(period))
        self._usage: dict[str, _Kept] = {}
        #: metered and subscription events: event id → (where, sha256, customer, period, data)
        self._metered: dict[str, _KeptEvent] = {}
        self._subscriptions: dict[str, _KeptEvent] = {}
        self._customers: dict[str, tuple[Coordinates, CustomerUpserted]] = {}
        self._closed: dict[str, Coordinates] = {}
        self._last_closed: dict[str, Coordinates] = {}
        self.conflicts: list[Conflict] = []
        self.invalid: list[InvalidRecord] = []
        #: Records of a usage id already kept, with the same payload.
        self.duplicates = 0
        #: Every record added (valid or not).
        self.records = 0

    # ------------------------------------------------------------------ input

    def add(self, envelope: Envelope, at: Coordinates) -> None:
        """Take one decoded account event read at ``at``."""
        self.records += 1
        data = envelope.data
        if isinstance(data, UsageRecorded):
            self._add_usage(envelope.id, data, at)
        elif isinstance(data, UsageMetered):
            period = str(BillingPeriod.of(data.event_time))
            self._add_event(self._metered, envelope.id, data, period, at)
        elif isinstance(data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded):
            self._add_event(self._subscriptions, envelope.id, data, None, at)
        elif isinstance(data, CustomerUpserted):
            current = self._customers.get(data.customer_id)
            if current is None or current[0] < at:
                self._customers[data.customer_id] = (at, data)
        elif isinstance(data, BillingPeriodClosed) and data.billing_period == self.period:
            first = self._closed.get(data.customer_id)
            if first is None or at < first:
                self._closed[data.customer_id] = at
            last = self._last_closed.get(data.customer_id)
            if last is None or last < at:
                self._last_closed[data.customer_id] = at

    def add_fast_usage(self, fast: FastUsage, value: bytes, at: Coordinates) -> None:
        """Take one ``usage.recorded`` read by the fast decoder
        (:func:`streams.core.domain.fastcodec.decode_usage`) at ``at``; ``value`` is the
        record's value (its digest stands for the payload until two records of one id
        differ in their bytes)."""
        self.records += 1
        period = str(fast.values[1])
        digest = "raw:" + hashlib.sha256(value).hexdigest()
        new = _Kept(at, digest, str(fast.values[0]), period, None, fast)
        self._keep_usage(fast.event_id, new, mine=period == self.period)

    def add_invalid(self, at: Coordinates, key: bytes | None, reason: str) -> None:
        """Count a record that did not decode (``key`` is the raw record key)."""
        self.records += 1
        customer: str | None = None
        if key is not None:
            try:
                customer = key.decode("utf-8")
            except UnicodeDecodeError:
                customer = None
        self.invalid.append(InvalidRecord(at, customer, reason))

    def _add_usage(self, event_id: str, data: UsageRecorded, at: Coordinates) -> None:
        digest = payload_hash(data)
        mine = data.billing_period == self.period
        new = _Kept(at, digest, data.customer_id, data.billing_period, data if mine else None)
        self._keep_usage(event_id, new, mine=mine)

    def _keep_usage(self, event_id: str, new: _Kept, *, mine: bool) -> None:
        if not mine:  # only the period's records keep their payload model
            new.data = None
        kept = self._usage.get(event_id)
        if kept is None:
            self._usage[event_id] = new
            return
        first, later = (new, kept) if new.at < kept.at else (kept, new)
        self._usage[event_id] = first
        if first.sha256 == later.sha256:
            self.duplicates += 1
            return
        first.sha256, later.sha256 = first.canonical(), later.canonical()
        if first.sha256 == later.sha256:
            self.duplicates += 1
            return
        if self.period in (first.billing_period, later.billing_period):
            self.conflicts.append(
                Conflict(
                    event_id=event_id,
                    customer_id=later.customer_id,
                    billing_period=later.billing_period,
                    kept=first.at,
                    dropped=later.at,
                    kept_sha256=first.sha256,
                    dropped_sha256=later.sha256,
                )
            )

    def _add_event(
        self,
        kept_by_id: dict[str, _KeptEvent],
        event_id: str,
        data: UsageMetered | SubscriptionEvent,
        period: str | None,
        at: Coordinates,
    ) -> None:
        """The usage rule for metered and subscription events: first record of an id wins,
        a later same payload is a duplicate, another payload a conflict (reported when it
        concerns the period: a metered event of it, or any subscription event)."""
        new = _KeptEvent(at, payload_hash(data), data.customer_id, period, data)
        kept = kept_by_id.get(event_id)
        if kept is None:
            kept_by_id[event_id] = new
            return
        first, later = (new, kept) if at < kept.at else (kept, new)
        kept_by_id[event_id] = first
        if first.sha256 == later.sha256:
            self.duplicates += 1
            return
        if period is None or self.period in (first.period, later.period):
            self.conflicts.append(
                Conflict(
                    event_id=event_id,
                    customer_id=later.customer_id,
                    billing_period=later.period or self.period,
                    kept=first.at,
                    dropped=later.at,
                    kept_sha256=first.sha256,
                    dropped_sha256=later.sha256,
                )
            )

    # ------------------------------------------------------------------ results

    def metered_by_customer(self) -> dict[str, list[tuple[MeteredEvent, Coordinates]]]:
        """Customer → its distinct metered events of the period and where each was read,
        sorted by (partition, offset)."""
        result: dict[str, list[tuple[MeteredEvent, Coordinates]]] = defaultdict(list)
        for event_id, kept in self._metered.items():
            if kept.period != self.period or not isinstance(kept.data, UsageMetered):
                continue
            result[kept.customer_id].append((MeteredEvent.of(event_id, kept.data), kept.at))
        return {
            customer: sorted(pairs, key=lambda pair: pair[1])
            for customer, pairs in sorted(result.items())
        }

    def metered_record(self, event_id: str) -> tuple[UsageMetered, Coordinates] | None:
        """The kept ``usage.metered`` data of ``event_id`` and where it was read."""
        kept = self._metered.get(event_id)
        if kept is None or not isinstance(kept.data, UsageMetered):
            return None
        return kept.data, kept.at

    @property
    def metered_events(self) -> int:
        """Distinct metered events of the period."""
        return sum(1 for kept in self._metered.values() if kept.period == self.period)

    def subscriptions(self, customer_id: str) -> list[tuple[str, SubscriptionEvent, Coordinates]]:
        """The customer's distinct subscription events in the window: (event id, data,
        where), sorted by (partition, offset)."""
        found = [
            (event_id, kept.data, kept.at)
            for event_id, kept in self._subscriptions.items()
            if kept.customer_id == customer_id
            and isinstance(kept.data, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded)
        ]
        return sorted(found, key=lambda item: item[2])

    @property
    def subscribed_customers(self) -> frozenset[str]:
        """Customers with a subscription event in the window."""
        return frozenset(kept.customer_id for kept in self._subscriptions.values())

    def _period_data(self, kept: _Kept) -> UsageRecorded | None:
        return kept.usage() if kept.billing_period == self.period else None

    def usage_by_customer(self) -> dict[str, list[UsageLine]]:
        """Customer → its distinct usage lines of the period, sorted by (partition, offset)."""
        result: dict[str, list[tuple[Coordinates, UsageLine]]] = defaultdict(list)
        for event_id, kept in self._usage.items():
            if kept.billing_period != self.period:
                continue
            if kept.data is None and kept.fast is not None:  # no model per line on this path
                line = fast_usage_line(kept.fast, kept.at)
            else:
                data = kept.usage()
                if data is None:
                    continue
                line = usage_line(event_id, data, kept.at)
            result[kept.customer_id].append((kept.at, line))
        return {
            customer: [line for _, line in sorted(pairs, key=lambda pair: pair[0])]
            for customer, pairs in sorted(result.items())
        }

    def usage_record(self, event_id: str) -> tuple[UsageRecorded, Coordinates] | None:
        """The kept ``usage.recorded`` data of the period's ``event_id`` and where it was read."""
        kept = self._usage.get(event_id)
        data = self._period_data(kept) if kept is not None else None
        if kept is None or data is None:
            return None
        return data, kept.at

    @property
    def usage_events(self) -> int:
        """Distinct usage events of the period."""
        return sum(1 for kept in self._usage.values() if kept.billing_period == self.period)

    def customer(self, customer_id: str) -> CustomerUpserted | None:
        """The customer's latest ``customer.upserted`` in the window, if any."""
        found = self._customers.get(customer_id)
        return found[1] if found else None

    def closed_at(self, customer_id: str) -> Coordinates | None:
        """Where the customer's first close marker of the period was read, if any."""
        return self._closed.get(customer_id)

    def last_closed_at(self, customer_id: str) -> Coordinates | None:
        """Where the customer's last close marker of the period was read (a release of a
        hold re-sends one), if any."""
        return self._last_closed.get(customer_id)

    @property
    def closed_customers(self) -> frozenset[str]:
        return frozenset(self._closed)


def fast_usage_line(fast: FastUsage, at: Coordinates) -> UsageLine:
    """:func:`usage_line` of ``usage_data(fast)``, built from the fast decoder's values
    without the model (equal lines: ``tests/unit/test_replay_rebuild.py``)."""
    values = fast.values
    quantity = values[4]
    # The first four values are required fields: the fast path vouches only for records
    # that have them (text, never None); str() states it for the type checker.
    return UsageLine(
        event_id=fast.event_id,
        customer_id=str(values[0]),
        billing_period=str(values[1]),
        amount=Decimal(str(values[2])),
        currency=str(values[3]),
        quantity=None if quantity is None else Decimal(quantity),
        unit=values[5],
        description=values[9],
        sku_id=values[8],
        region_id=values[10],
        charge_category=values[11],
        event_time=fast.event_time,
        source_topic=at.topic,
        source_partition=at.partition,
        source_offset=at.offset,
    )


def usage_line(event_id: str, data: UsageRecorded, at: Coordinates) -> UsageLine:
    """The invoice line of a ``usage.recorded`` read at ``at`` (the fields the worker stores)."""
    return UsageLine(
        event_id=event_id,
        customer_id=data.customer_id,
        billing_period=data.billing_period,
        amount=data.amount,
        currency=data.currency,
        quantity=data.quantity,
        unit=data.unit,
        description=data.description,
        sku_id=data.sku_id,
        region_id=data.region_id,
        charge_category=data.charge_category,
        event_time=data.event_time,
        source_topic=at.topic,
        source_partition=at.partition,
        source_offset=at.offset,
    )
