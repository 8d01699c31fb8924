"""Rating: price plans turn metered usage into money (pure domain code; docs/rating.md).

Decimal, no I/O. The one function the invoice job, the replay (also under a
candidate price book) and the usage view call is :func:`rate` (or
:func:`rate_events` from raw events). Design note: ``docs/rating.md``.

Modules:

* :mod:`~streams.core.domain.rating.book` — the price book's models (metrics, plans,
  versions, charge models), with its value types in
  :mod:`~streams.core.domain.rating.book_values` and its rules across items in
  :mod:`~streams.core.domain.rating.book_rules`;
* :mod:`~streams.core.domain.rating.book_yaml` — the YAML loader, every error reported
  by path and line;
* :mod:`~streams.core.domain.rating.pricing` — what each charge model computes;
* :mod:`~streams.core.domain.rating.aggregate` — incremental, mergeable,
  JSON-serialisable aggregates of metered events (per metric, day and period), over
  the per-aggregation states of :mod:`~streams.core.domain.rating.aggregate_states`;
* :mod:`~streams.core.domain.rating.segments` — subscription events → the segments
  of a period under one plan version each;
* :mod:`~streams.core.domain.rating.rate` — :func:`rate`: one period rated, holds for
  gaps, the subtotal rounded once;
* :mod:`~streams.core.domain.rating.rated` — what it returns: the rated invoice, its
  charge and pass-through lines, its holds;
* :mod:`~streams.core.domain.rating.priced` — a rated invoice as the billing kernel
  issues it (:func:`priced_invoice`: usage lines billed, charges, rating summary);
* :mod:`~streams.core.domain.rating.published` — the published price book: immutable
  entries (metrics, plan versions), their canonical content, the book they make;
* :mod:`~streams.core.domain.rating.errors` — :class:`RatingError`,
  :class:`PriceBookError`.
"""

from __future__ import annotations

from streams.core.domain.rating.aggregate import MeteredEvent, MetricUsage, Usage
from streams.core.domain.rating.aggregate_states import AggregateState, new_state
from streams.core.domain.rating.book import (
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
    price_book_json_schema,
)
from streams.core.domain.rating.book_yaml import load_price_book, price_book_from_data
from streams.core.domain.rating.errors import PriceBookError, PriceBookIssue, RatingError
from streams.core.domain.rating.priced import is_rated, priced_invoice
from streams.core.domain.rating.pricing import PRORATION_DECIMALS, Priced, TierPart, prorate
from streams.core.domain.rating.rate import rate, rate_events
from streams.core.domain.rating.rated import (
    ChargeLine,
    Hold,
    HoldCode,
    PackageDetail,
    PassThroughLine,
    Proration,
    RatedInvoice,
    TrueUp,
)
from streams.core.domain.rating.segments import Segment, day_plans, period_days, segments_for

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
