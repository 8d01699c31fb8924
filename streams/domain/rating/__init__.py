"""Rating: price plans turn metered usage into money (pure domain code, issue 12).

Decimal, no I/O. The one function the invoice job, the replay (also under a
candidate price book) and the usage view call is :func:`rate` (or
:func:`rate_events` from raw events). Design note: ``docs/rating.md``.

Modules:

* :mod:`~streams.domain.rating.book` — the price book (metrics, plans, versions,
  charge models) and its YAML loader with every error reported by path;
* :mod:`~streams.domain.rating.pricing` — what each charge model computes;
* :mod:`~streams.domain.rating.aggregate` — incremental, mergeable,
  JSON-serialisable aggregates of metered events;
* :mod:`~streams.domain.rating.segments` — subscription events → the segments
  of a period under one plan version each;
* :mod:`~streams.domain.rating.rate` — the rated invoice: lines, pass-through
  lines, holds, the subtotal rounded once;
* :mod:`~streams.domain.rating.priced` — a rated invoice as the billing kernel
  issues it (:func:`priced_invoice`: usage lines billed, charges, rating summary);
* :mod:`~streams.domain.rating.published` — the published price book: immutable
  entries (metrics, plan versions), their canonical content, the book they make;
* :mod:`~streams.domain.rating.errors` — :class:`RatingError`,
  :class:`PriceBookError`.
"""

from __future__ import annotations

from streams.domain.rating.aggregate import (
    AggregateState,
    MeteredEvent,
    MetricUsage,
    Usage,
    new_state,
)
from streams.domain.rating.book import (
    PRICE_DECIMALS,
    Aggregation,
    BillableMetric,
    Charge,
    FixedFee,
    Graduated,
    MinimumCommitment,
    Package,
    PassThrough,
    PerUnit,
    Plan,
    PlanVersion,
    PriceBook,
    Tier,
    Volume,
    load_price_book,
    price_book_from_data,
    price_book_json_schema,
)
from streams.domain.rating.errors import PriceBookError, PriceBookIssue, RatingError
from streams.domain.rating.priced import is_rated, priced_invoice
from streams.domain.rating.pricing import PRORATION_DECIMALS, Priced, TierPart, prorate
from streams.domain.rating.rate import (
    ChargeLine,
    Hold,
    HoldCode,
    PackageDetail,
    PassThroughLine,
    Proration,
    RatedInvoice,
    TrueUp,
    rate,
    rate_events,
)
from streams.domain.rating.segments import Segment, day_plans, period_days, segments_for

__all__ = [
    "PRICE_DECIMALS",
    "PRORATION_DECIMALS",
    "AggregateState",
    "Aggregation",
    "BillableMetric",
    "Charge",
    "ChargeLine",
    "FixedFee",
    "Graduated",
    "Hold",
    "HoldCode",
    "MeteredEvent",
    "MetricUsage",
    "MinimumCommitment",
    "Package",
    "PackageDetail",
    "PassThrough",
    "PassThroughLine",
    "PerUnit",
    "Plan",
    "PlanVersion",
    "PriceBook",
    "PriceBookError",
    "PriceBookIssue",
    "Priced",
    "Proration",
    "RatedInvoice",
    "RatingError",
    "Segment",
    "Tier",
    "TierPart",
    "TrueUp",
    "Usage",
    "Volume",
    "day_plans",
    "is_rated",
    "load_price_book",
    "new_state",
    "period_days",
    "price_book_from_data",
    "price_book_json_schema",
    "priced_invoice",
    "prorate",
    "rate",
    "rate_events",
    "segments_for",
]
