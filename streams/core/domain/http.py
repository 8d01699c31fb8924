"""The HTTP bodies of the usage view and the ingest edge (pydantic; JSON Schema in ``schemas/http/``).

Money is a decimal *string* (:data:`streams.core.domain.money.Amount`), never a JSON
number. Errors are RFC 9457 problem details (``application/problem+json``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from streams.core.domain.events import TEXT_PATTERN, Currency, CustomerId, Period
from streams.core.domain.money import Amount, Quantity


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PassThroughUsage(_Body):
    """Pre-priced ``usage.recorded`` lines of the period: how many, and their exact
    sum per currency (before any markup)."""

    lines: Annotated[int, Field(ge=0)]
    amounts: dict[Currency, Amount]


class MetricQuantity(_Body):
    """One billable metric's aggregate to date (per group value when it groups)."""

    metric: str
    group: str | None = None
    quantity: Quantity
    events: Annotated[
        int,
        Field(
            ge=0,
            description="The metric's events to date, in all its groups: a metric that "
            "groups repeats the same number on each group's row.",
        ),
    ]


class LateUsage(_Body):
    """Usage that arrived after the period's close marker: not on the invoice (a
    replay takes it into a corrected revision)."""

    pass_through_lines: Annotated[int, Field(ge=0)]
    pass_through_amounts: dict[Currency, Amount]
    metered_events: Annotated[int, Field(ge=0)]


class UsageToDate(_Body):
    pass_through: PassThroughUsage
    metered: tuple[MetricQuantity, ...]
    metered_events: Annotated[int, Field(ge=0)]
    late: LateUsage


class HoldNote(_Body):
    """A gap that would hold the invoice (the rating core's hold codes, plus the
    view's own: ``no_customer``, ``refused_records``, ``conflicting_events``,
    ``stale_aggregates``)."""

    code: str
    message: str


class InvoiceLine(_Body):
    """One line of the upcoming invoice: a plan charge or a pass-through day."""

    kind: Literal["charge", "pass_through"]
    description: str
    amount: Amount
    plan_code: str | None = None
    plan_version: int | None = None
    charge_code: str | None = None
    metric: str | None = None
    group: str | None = None
    quantity: Quantity | None = None


class UpcomingInvoice(_Body):
    """The period rated by :func:`streams.core.domain.rating.rate`, before tax.

    ``subtotal`` is what the invoice would state if the period closed now: the
    exact sum of the lines rounded once, half-even, to the minor unit; ``None``
    while a hold stands (``rounded_total`` still previews the figure).
    ``provisional`` is always true: the invoice is the only record of what was billed.
    """

    provisional: Literal[True] = True
    currency: Currency
    subtotal: Amount | None
    rounded_total: Amount
    exact_total: Amount
    tax: Literal["not included"] = "not included"
    line_count: Annotated[int, Field(ge=0)]
    lines: tuple[InvoiceLine, ...]
    holds: tuple[HoldNote, ...]
    price_book: str


class Close(_Body):
    closed_at: str
    reason: str


class UsageResponse(_Body):
    """``GET /v1/customers/{id}/usage?period=YYYY-MM`` (200)."""

    customer_id: CustomerId
    period: Period
    closed: Close | None
    usage: UsageToDate
    upcoming_invoice: UpcomingInvoice
    #: Processing time of the last event of the period the view applied (UTC), if any.
    last_event_at: str | None
    last_event_id: str | None
    #: The view instance that owns the customer's partition and answered.
    served_by: str
    partition: Annotated[int, Field(ge=0)]


class Problem(_Body):
    """RFC 9457 problem details (``application/problem+json``), every 4xx and 5xx."""

    model_config = ConfigDict(frozen=True, extra="allow")

    type: str = "about:blank"
    title: str
    status: Annotated[int, Field(ge=400, le=599)]
    detail: str | None = None
    instance: str | None = None


class EventResult(_Body):
    """The outcome of one event of a ``POST /v1/events`` request, in request order."""

    index: Annotated[int, Field(ge=0)]
    id: str | None = None
    status: Literal["accepted", "duplicate", "rejected", "unknown"]
    #: For ``rejected``: the HTTP status this event alone would have had (400, 403,
    #: 409, 422, 503) and why; for ``unknown`` (the broker did not confirm it in time,
    #: it may still be delivered): a 504 of type ``…/problems/outcome-unknown``.
    error: Problem | None = None
    partition: Annotated[int, Field(ge=0)] | None = None
    offset: Annotated[int, Field(ge=0)] | None = None


class IngestResponse(_Body):
    """``POST /v1/events``: 200 when every event was accepted or a duplicate, 207 when
    some were rejected (each with its error), 4xx when none was taken."""

    accepted: Annotated[int, Field(ge=0)]
    duplicates: Annotated[int, Field(ge=0)]
    rejected: Annotated[int, Field(ge=0)]
    #: Events whose delivery the broker did not confirm in time (status ``unknown``).
    unknown: Annotated[int, Field(ge=0)] = 0
    results: tuple[EventResult, ...]


class CloudEventIn(_Body):
    """One CloudEvent in structured JSON mode (CloudEvents 1.0.2 JSON format §3) as
    the edge takes it: ``subject`` is the customer id and must equal
    ``data.customer_id``; ``data`` is the event type's model
    (``schemas/events/…``); ``time`` defaults to the time of receipt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    specversion: Literal["1.0"]
    # the constraints of the topic's envelope (streams.core.domain.events.Envelope): what
    # the consumers take, so that what this document allows reaches no dead-letter topic
    id: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT_PATTERN)]
    source: Annotated[str, Field(min_length=1, max_length=512, pattern=TEXT_PATTERN)]
    type: str
    subject: CustomerId | None = None
    time: str | None = None
    datacontenttype: Literal["application/json"] | None = None
    data: dict[str, object]
