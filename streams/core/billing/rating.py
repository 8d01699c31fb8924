"""Gather one customer's billing period and rate it: the kernel's side of rating.

The invoice job (:mod:`streams.apps.invoicing.jobs`) and the replay
(:mod:`streams.apps.replay.apply`) both price an invoice the same way: the inputs of
:func:`streams.core.domain.rating.rate_events` — the price book, the customer's
subscription events, the period's distinct metered events and pre-priced lines,
the customer's currency — then, unless the rating holds the invoice,
:func:`streams.core.domain.rating.priced_invoice` (the lines taxed and issued). This
module reads those inputs for the invoice job (:func:`gather`), rates them
(:func:`rate_period`) and words a held invoice's reason (:func:`hold_reason`).

Where the inputs come from (docs/design.md, invariant 3: the events that precede the
close marker on the customer's partition):

==========================  ===========================================================
input                       read from
==========================  ===========================================================
price book                  ``billable_metrics`` + ``plan_versions`` (published; cached
                            by :class:`PriceBooks` while nothing new is published)
subscription events         ``subscription_events`` before the marker, any date
metered events              ``metered_usage`` of the period before the marker
pre-priced lines            ``usage_lines`` of the period before the marker
currency                    ``customers``
==========================  ===========================================================
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streams.core.billing.ports import MeteringStore, PriceBookStore
from streams.core.billing.rows import CloseMarker
from streams.core.billing.stores import POSTGRES
from streams.core.domain.events import SourceRange, SubscriptionEvent
from streams.core.domain.invoice import PricedInvoice, UsageLine, price_invoice
from streams.core.domain.rating import (
    MeteredEvent,
    PriceBook,
    RatedInvoice,
    priced_invoice,
    rate_events,
)

log = logging.getLogger("streams.core.billing.rating")

__all__ = [
    "PeriodInputs",
    "PriceBooks",
    "Rated",
    "gather",
    "hold_codes",
    "hold_reason",
    "rate_period",
]


class PriceBooks:
    """The published price book, read from PostgreSQL and kept while nothing new is
    published (entries are insert-only, so their counts identify the book:
    :func:`streams.core.billing.store.pricing.book_fingerprint`). Thread-safe: the
    worker's invoice jobs share one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cached: tuple[tuple[int, int], PriceBook] | None = None

    def current(self, conn: Any, pricing: PriceBookStore[Any] = POSTGRES.pricing) -> PriceBook:
        """The book in force, read in ``conn``'s transaction when it changed
        (``pricing``: the store to read it from, default PostgreSQL).

        Raises:
            PriceBookError: the stored entries do not make a valid book.
            psycopg.Error: the database failed.
        """
        fingerprint = pricing.book_fingerprint(conn)
        with self._lock:
            if self._cached is not None and self._cached[0] == fingerprint:
                return self._cached[1]
        book = pricing.published_book(conn)
        with self._lock:
            self._cached = (fingerprint, book)
        return book


@dataclass(frozen=True)
class PeriodInputs:
    """Everything rating needs for one customer's period (see the module docstring).

    ``metered_source`` gives, per (topic, partition), the offsets of the metered
    events (for the invoice's traceability, invariant 6).
    """

    period: str
    currency: str
    book: PriceBook
    subscriptions: tuple[SubscriptionEvent, ...]
    metered: tuple[MeteredEvent, ...]
    pass_through: tuple[UsageLine, ...]
    metered_source: tuple[SourceRange, ...] = ()


def gather(
    conn: Any,
    marker: CloseMarker,
    *,
    currency: str,
    book: PriceBook,
    pass_through: Sequence[UsageLine],
    metering: MeteringStore[Any] = POSTGRES.metering,
) -> PeriodInputs:
    """The inputs of the marker's (customer, period) that precede it on its partition.

    ``pass_through`` are the pre-priced lines the caller read already
    (:func:`streams.core.billing.store.usage.usage_before`); ``metering`` is the store of
    metered and subscription events (default PostgreSQL; the twin's in unit tests).

    Raises:
        psycopg.Error: the database failed.
    """
    topic, partition, offset = marker.source.topic, marker.source.partition, marker.source.offset
    subscriptions = metering.subscriptions_before(
        conn, marker.customer_id, topic, partition, offset
    )
    metered = metering.metered_before(
        conn, marker.customer_id, marker.billing_period, topic, partition, offset
    )
    source: tuple[SourceRange, ...] = ()
    if metered.first_offset is not None and metered.last_offset is not None:
        source = (
            SourceRange(
                topic=topic,
                partition=partition,
                first_offset=metered.first_offset,
                last_offset=metered.last_offset,
            ),
        )
    return PeriodInputs(
        period=marker.billing_period,
        currency=currency,
        book=book,
        subscriptions=tuple(subscriptions),
        metered=tuple(metered.events),
        pass_through=tuple(pass_through),
        metered_source=source,
    )


@dataclass(frozen=True)
class Rated:
    """A rated period: the rating, and the priced invoice to tax and issue (None when
    the rating holds it); ``seconds`` is the time the rating step took."""

    rated: RatedInvoice
    priced: PricedInvoice | None
    metered_events: int
    seconds: float

    @property
    def held(self) -> bool:
        return self.rated.held


def rate_period(inputs: PeriodInputs) -> Rated:
    """Rate ``inputs`` with the one rating function and price the result.

    The pre-priced lines first go through the rules they always had
    (:func:`~streams.core.domain.invoice.price_invoice`: every line in the customer's
    currency, no duplicate event id): a line that breaks one is bad *data*, refused
    as before rating existed (the invoice job dead-letters the marker and holds the
    customer; the replay reports the customer failed), not a gap in the book.

    Raises:
        RatingError: inconsistent input (a bug, not a gap: gaps are holds).
        InvoiceRuleViolation: the pre-priced lines break an invoice rule.
        UnknownCurrency: the customer's currency is not one we bill in.
    """
    started = time.perf_counter()
    price_invoice(inputs.pass_through, currency=inputs.currency)
    rated = rate_events(
        inputs.period,
        currency=inputs.currency,
        book=inputs.book,
        subscriptions=inputs.subscriptions,
        metered=inputs.metered,
        pass_through=inputs.pass_through,
    )
    priced = (
        None
        if rated.held
        else priced_invoice(
            rated, metered_events=len(inputs.metered), metered_source=inputs.metered_source
        )
    )
    seconds = time.perf_counter() - started
    if inputs.metered:
        log.info(
            "rated %d metered event(s) and %d pre-priced line(s) of %s in %.3fs (%.0f events/s)",
            len(inputs.metered),
            len(inputs.pass_through),
            inputs.period,
            seconds,
            len(inputs.metered) / seconds if seconds > 0 else 0.0,
        )
    return Rated(rated, priced, len(inputs.metered), seconds)


def hold_reason(rated: RatedInvoice, *, limit: int = 2000) -> str:
    """The reason an ``invoice_holds`` row records for a held rating: ``rating: `` and
    each hold as ``<code>: <message>``, joined by ``; `` (cut to ``limit``)."""
    text = "rating: " + "; ".join(str(hold) for hold in rated.holds)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def hold_codes(rated: RatedInvoice) -> list[str]:
    """The distinct hold codes, in the order found."""
    return list(dict.fromkeys(hold.code.value for hold in rated.holds))
