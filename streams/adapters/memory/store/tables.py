"""The twin's tables: one frozen row dataclass per PostgreSQL table, its columns as in
the migrations (``streams/adapters/postgres/migrations/versions/``), and the key it is stored under.

=======================  ==========================================  ==================
table                    key                                         row
=======================  ==========================================  ==================
``customers``            ``customer_id``                             :class:`CustomerRow`
``usage_lines``          ``event_id``                                :class:`UsageRow`
``period_closes``        ``event_id``                                :class:`CloseRow`
``document_counters``    ``series``                                  ``int`` (last value)
``invoices``             ``invoice_id``                              :class:`InvoiceRow`
``invoice_lines``        ``(invoice_id, line_no)``                   :class:`InvoiceLineRow`
``credit_notes``         ``credit_note_id``                          :class:`CreditNoteRow`
``outbox``               ``id``                                      :class:`OutboxRow`
``invoice_holds``        ``hold_id``                                 :class:`HoldRow`
``partition_fences``     ``(group_id, topic, partition)``            :class:`PartitionFenceRow`
``lease_fences``         ``lease_name``                              :class:`LeaseFenceRow`
``close_requests``       ``(customer_id, billing_period)``           :class:`CloseRequestRow`
``email_deliveries``     ``event_id``                                :class:`~streams.apps.email.store.DeliveryRow`
``metered_usage``        ``event_id``                                :class:`~streams.core.billing.rows.MeteredRecord`
``subscription_events``  ``event_id``                                :class:`~streams.core.billing.rows.SubscriptionRecord`
``billable_metrics``     ``metric_code``                             :class:`~streams.core.domain.events.BillableMetricPublished`
``plan_versions``        ``(plan_code, plan_version)``               :class:`~streams.core.domain.events.PlanVersionPublished`
=======================  ==========================================  ==================

Other unique keys are checked by the store functions that write the table. Rows are
replaced (``dataclasses.replace``), never mutated: a transaction's working copy is a
shallow copy of the table.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg

from streams.adapters.memory.database import Statement
from streams.core.domain.periods import PERIOD_PATTERN

CUSTOMERS = "customers"
USAGE_LINES = "usage_lines"
PERIOD_CLOSES = "period_closes"
DOCUMENT_COUNTERS = "document_counters"
INVOICES = "invoices"
INVOICE_LINES = "invoice_lines"
CREDIT_NOTES = "credit_notes"
OUTBOX = "outbox"
INVOICE_HOLDS = "invoice_holds"
PARTITION_FENCES = "partition_fences"
LEASE_FENCES = "lease_fences"
CLOSE_REQUESTS = "close_requests"
EMAIL_DELIVERIES = "email_deliveries"
METERED_USAGE = "metered_usage"
SUBSCRIPTION_EVENTS = "subscription_events"
BILLABLE_METRICS = "billable_metrics"
PLAN_VERSIONS = "plan_versions"
DEAD_LETTERS = "dead_letters"

_PERIOD = re.compile(PERIOD_PATTERN)


def check_period(stmt: Statement, table: str, period: str | None) -> None:
    """``CHECK (billing_period ~ '^[0-9]{4}-(0[1-9]|1[0-2])$')`` of ``table``."""
    if period is not None and not _PERIOD.fullmatch(period):
        raise stmt.check_violation(
            f"{table}_billing_period_check", f"billing_period {period!r} is not YYYY-MM"
        )


def as_uuid(stmt: Statement, value: str, column: str) -> str:
    """A ``uuid`` column's value as PostgreSQL returns it (``::text``: lower case,
    hyphenated). Raises ``psycopg.errors.InvalidTextRepresentation`` otherwise."""
    try:
        return str(uuid.UUID(value))
    except (ValueError, AttributeError, TypeError):
        raise stmt.fail(
            psycopg.errors.InvalidTextRepresentation(
                f"invalid input syntax for type uuid: {value!r} ({column})"
            )
        ) from None


@dataclass(frozen=True)
class CustomerRow:
    customer_id: str
    name: str
    email: str
    currency: str
    billing_account_id: str | None
    event_id: str
    source_topic: str
    source_partition: int
    source_offset: int
    updated_at: datetime
    #: The event's own time (migration 0016); ``datetime.min`` (UTC) stands for ``-infinity``.
    event_time: datetime
    #: The customer's grace period in hours (migration 0024); None: it states none.
    invoice_grace_hours: Decimal | None = None


@dataclass(frozen=True)
class UsageRow:
    event_id: str
    customer_id: str
    billing_period: str
    amount: Decimal
    currency: str
    quantity: Decimal | None
    unit: str | None
    consumed_quantity: Decimal | None
    consumed_unit: str | None
    sku_id: str | None
    description: str | None
    region_id: str | None
    charge_category: str | None
    provider: str | None
    event_time: datetime
    payload_sha256: str
    source_topic: str
    source_partition: int
    source_offset: int
    recorded_at: datetime


@dataclass(frozen=True)
class CloseRow:
    event_id: str
    customer_id: str
    billing_period: str
    reason: str
    outcome: str
    invoice_id: str | None
    source_topic: str
    source_partition: int
    source_offset: int
    received_at: datetime


@dataclass(frozen=True)
class InvoiceRow:
    invoice_id: str
    invoice_number: str
    customer_id: str
    billing_period: str
    revision: int
    status: str
    customer_name: str
    email: str
    currency: str
    line_count: int
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    taxes: Any
    close_event_id: str
    source_topic: str
    source_partition: int
    first_offset: int | None
    last_offset: int | None
    close_offset: int
    fence_group: str | None
    fence_generation: int | None
    fence_member: str | None
    lease_fencing_token: int | None
    supersedes_invoice_id: str | None
    issued_at: datetime


@dataclass(frozen=True)
class InvoiceLineRow:
    invoice_id: str
    line_no: int
    event_id: str
    amount: Decimal
    quantity: Decimal | None
    unit: str | None
    description: str | None
    sku_id: str | None
    region_id: str | None
    tax_code: str
    tax_rate: Decimal
    tax: Decimal
    source_topic: str
    source_partition: int
    source_offset: int


@dataclass(frozen=True)
class CreditNoteRow:
    credit_note_id: str
    credit_note_number: str
    invoice_id: str
    customer_id: str
    billing_period: str
    currency: str
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    reason: str
    issued_at: datetime


@dataclass(frozen=True)
class OutboxRow:
    id: str
    aggregatetype: str
    aggregateid: str
    type: str
    payload: Any
    ce_source: str
    ce_time: str
    document_id: str
    created_at: datetime
    #: insertion order (rows of one transaction share ``created_at``)
    seq: int


@dataclass(frozen=True)
class HoldRow:
    hold_id: int
    customer_id: str
    billing_period: str | None
    reason: str
    event_id: str | None
    source_topic: str
    source_partition: int
    source_offset: int
    created_at: datetime
    released_at: datetime | None = None
    released_by: str | None = None
    release_note: str | None = None


@dataclass(frozen=True)
class PartitionFenceRow:
    group_id: str
    topic: str
    partition: int
    generation: int
    member_id: str
    updated_at: datetime


@dataclass(frozen=True)
class LeaseFenceRow:
    lease_name: str
    fencing_token: int
    holder: str
    updated_at: datetime


@dataclass(frozen=True)
class CloseRequestRow:
    customer_id: str
    billing_period: str
    event_id: str
    lease_fencing_token: int
    requested_at: datetime
