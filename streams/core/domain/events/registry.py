"""The registry of event types (type → data model, per topic), the CloudEvents envelope,
and the deterministic ids of close markers and invoices.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from streams.core.domain.events.account import (
    BillingPeriodClosed,
    CustomerUpserted,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.events.fields import (
    TEXT_PATTERN,
    CustomerId,
    EventData,
    UtcDateTime,
    deterministic_id,
)
from streams.core.domain.events.invoice import (
    CreditNoteIssued,
    InvoiceIssued,
    InvoiceVoided,
)
from streams.core.domain.events.price_book import (
    BillableMetricPublished,
    PlanVersionPublished,
)

AccountEventData = (
    CustomerUpserted
    | UsageRecorded
    | BillingPeriodClosed
    | UsageMetered
    | SubscriptionStarted
    | SubscriptionChanged
    | SubscriptionEnded
)
InvoiceEventData = InvoiceIssued | CreditNoteIssued | InvoiceVoided
PriceBookEventData = BillableMetricPublished | PlanVersionPublished

#: Event type → data model, for every type the pipeline knows.
EVENT_TYPES: dict[str, type[EventData]] = {
    model.event_type: model
    for model in (
        CustomerUpserted,
        UsageRecorded,
        BillingPeriodClosed,
        InvoiceIssued,
        CreditNoteIssued,
        InvoiceVoided,
        UsageMetered,
        SubscriptionStarted,
        SubscriptionChanged,
        SubscriptionEnded,
        BillableMetricPublished,
        PlanVersionPublished,
    )
}


def event_models(types: Iterable[str]) -> tuple[type[EventData], ...]:
    """The data models of the CloudEvents ``types``, in their order.

    Which types a topic carries is declared once, by name, in the topic registry
    (:attr:`streams.topics.TopicSpec.event_types`); this maps those names to models,
    e.g. ``event_models(INVOICES.event_types)`` for the ``allowed`` of a decoder.

    Raises:
        KeyError: a name that is no event type of :data:`EVENT_TYPES`.
    """
    models = []
    for name in types:
        if name not in EVENT_TYPES:
            raise KeyError(
                f"no event type named {name!r} in streams.core.domain.events.EVENT_TYPES"
            )
        models.append(EVENT_TYPES[name])
    return tuple(models)


class Envelope(BaseModel):
    """A CloudEvents 1.0 event: context attributes plus ``data``.

    ``subject`` is the customer id and equals the Kafka record key.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    specversion: Literal["1.0"] = "1.0"
    id: Annotated[str, Field(min_length=1, max_length=256, pattern=TEXT_PATTERN)]
    source: Annotated[str, Field(min_length=1, max_length=512, pattern=TEXT_PATTERN)]
    type: str
    time: UtcDateTime
    subject: CustomerId
    datacontenttype: Literal["application/json"] = "application/json"
    data: Any

    @classmethod
    def wrap(
        cls, data: EventData, *, id: str, source: str, time: datetime | None = None
    ) -> Envelope:
        """An envelope for ``data`` with ``subject`` = its record key (the customer id,
        :meth:`EventData.record_key`)."""
        subject = data.record_key()
        return cls(
            id=id,
            source=source,
            type=data.event_type,
            time=time or datetime.now(UTC),
            subject=subject,
            data=data,
        )


def close_marker_id(
    customer_id: str, billing_period: str, reason: str = "period_closed", nonce: str = ""
) -> str:
    """Deterministic id of a close marker: a rerun of close-period sends the same id."""
    return deterministic_id("billing_period.closed", customer_id, billing_period, reason, nonce)


def invoice_id_for(customer_id: str, billing_period: str, revision: int) -> str:
    """Deterministic invoice id: also the tax document's idempotency key with the revision."""
    return deterministic_id("invoice", customer_id, billing_period, str(revision))
