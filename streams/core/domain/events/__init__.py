"""The contracts of the pipeline's topics: CloudEvents envelopes and their data.

One place per contract (docs/conventions.md "One place per contract"): every event's data is a
frozen pydantic model with ``extra="forbid"`` and a ``schema_version``; money is :data:`Amount` (an
exact ``Decimal``, a decimal *string* on the wire) with an ISO 4217 currency code; times are UTC.
JSON Schema files in ``schemas/`` are generated from these models (``invoicing schemas export``) and
a test fails when they are stale.

Wire form: the CloudEvents Kafka protocol binding, **binary content mode**
(CloudEvents 1.0.2, kafka-protocol-binding §3.2): the record value is the event's
``data`` as JSON, the attributes travel as headers ``ce_specversion``, ``ce_id``,
``ce_source``, ``ce_type``, ``ce_time``, ``ce_subject`` and ``content-type``, and
the record key is the customer id. See :mod:`streams.core.domain.codec`.

Event types (past tense, docs/design.md "Topics"):

===============================  ==================================  ==========================
type                             data model                          topic
===============================  ==================================  ==========================
``customer.upserted``            :class:`CustomerUpserted`           billing.account-events.v1
``usage.recorded``               :class:`UsageRecorded`              billing.account-events.v1
``billing_period.closed``        :class:`BillingPeriodClosed`        billing.account-events.v1
``usage.metered``                :class:`UsageMetered`               billing.account-events.v1
``subscription.started``         :class:`SubscriptionStarted`        billing.account-events.v1
``subscription.changed``         :class:`SubscriptionChanged`        billing.account-events.v1
``subscription.ended``           :class:`SubscriptionEnded`          billing.account-events.v1
``invoice.issued``               :class:`InvoiceIssued`              billing.invoices.v1
``credit_note.issued``           :class:`CreditNoteIssued`           billing.invoices.v1
``invoice.voided``               :class:`InvoiceVoided`              billing.invoices.v1
``billable_metric.published``    :class:`BillableMetricPublished`    billing.price-book.v1
``plan_version.published``       :class:`PlanVersionPublished`       billing.price-book.v1
===============================  ==================================  ==========================
"""

from __future__ import annotations

from streams.core.domain.events.account import (
    CODE_PATTERN,
    MAX_DECIMAL_TEXT,
    MAX_GRACE_HOURS,
    MAX_PROPERTIES,
    MAX_PROPERTY_TEXT,
    PROPERTY_NAME_PATTERN,
    BillingPeriodClosed,
    Code,
    CustomerUpserted,
    GraceHours,
    PropertyDecimal,
    PropertyName,
    PropertyText,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionEvent,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.events.fields import (
    CURRENCY_PATTERN,
    CUSTOMER_ID_PATTERN,
    EARLIEST_INSTANT,
    EMAIL_PATTERN,
    ID_NAMESPACE,
    MAX_INT32,
    MAX_INT64,
    TEXT_PATTERN,
    Currency,
    CustomerId,
    DocumentNumber,
    DocumentRef,
    Email,
    EventData,
    Int32,
    Name,
    Period,
    Recipient,
    Revision,
    Text64,
    Text128,
    Text256,
    Text512,
    Text1024,
    Text2000,
    UtcDateTime,
    datetime_json,
    deterministic_id,
)
from streams.core.domain.events.invoice import (
    ChargeSummary,
    CreditedLine,
    CreditNoteIssued,
    DayRange,
    InvoiceIssued,
    InvoiceVoided,
    LineSummary,
    PackageSummary,
    PassThroughSummary,
    ProrationSummary,
    RatingSummary,
    SegmentSummary,
    SourceRange,
    TaxAmount,
    TierSummary,
    TrueUpSummary,
)
from streams.core.domain.events.price_book import (
    SHA256_PATTERN,
    BillableMetricPublished,
    PlanVersionPublished,
)
from streams.core.domain.events.registry import (
    EVENT_TYPES,
    AccountEventData,
    Envelope,
    InvoiceEventData,
    PriceBookEventData,
    close_marker_id,
    event_models,
    invoice_id_for,
)

__all__ = [
    "CODE_PATTERN",
    "CURRENCY_PATTERN",
    "CUSTOMER_ID_PATTERN",
    "EARLIEST_INSTANT",
    "EMAIL_PATTERN",
    "EVENT_TYPES",
    "ID_NAMESPACE",
    "MAX_DECIMAL_TEXT",
    "MAX_GRACE_HOURS",
    "MAX_INT32",
    "MAX_INT64",
    "MAX_PROPERTIES",
    "MAX_PROPERTY_TEXT",
    "PROPERTY_NAME_PATTERN",
    "SHA256_PATTERN",
    "TEXT_PATTERN",
    "AccountEventData",
    "BillableMetricPublished",
    "BillingPeriodClosed",
    "ChargeSummary",
    "Code",
    "CreditNoteIssued",
    "CreditedLine",
    "Currency",
    "CustomerId",
    "CustomerUpserted",
    "DayRange",
    "DocumentNumber",
    "DocumentRef",
    "Email",
    "Envelope",
    "EventData",
    "GraceHours",
    "Int32",
    "InvoiceEventData",
    "InvoiceIssued",
    "InvoiceVoided",
    "LineSummary",
    "Name",
    "PackageSummary",
    "PassThroughSummary",
    "Period",
    "PlanVersionPublished",
    "PriceBookEventData",
    "PropertyDecimal",
    "PropertyName",
    "PropertyText",
    "ProrationSummary",
    "RatingSummary",
    "Recipient",
    "Revision",
    "SegmentSummary",
    "SourceRange",
    "SubscriptionChanged",
    "SubscriptionEnded",
    "SubscriptionEvent",
    "SubscriptionStarted",
    "TaxAmount",
    "Text64",
    "Text128",
    "Text256",
    "Text512",
    "Text1024",
    "Text2000",
    "TierSummary",
    "TrueUpSummary",
    "UsageMetered",
    "UsageRecorded",
    "UtcDateTime",
    "close_marker_id",
    "datetime_json",
    "deterministic_id",
    "event_models",
    "invoice_id_for",
]
