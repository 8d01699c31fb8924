"""Drafts: which grace period an invoice gets, and the reasons of the markers that end it.

Pure (no I/O). The rule (docs/invoices.md "Drafts and finalisation"):

- the **customer's** ``invoice_grace_hours`` (``customer.upserted``) wins when it states
  one, 0 included (a customer can opt out of its plan's grace period);
- else the **plan version's** ``invoice_grace_hours`` (price book) of the last segment of
  the period (the plan the customer is on at the period's end);
- else 0: no draft, the invoice is issued at the close (the behaviour before drafts).

Hours are ``Decimal`` (fractions allowed: ``0.5`` is 30 minutes); the end of the grace
period is a UTC time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from streams.core.domain.events import BillingPeriodClosed, Envelope, close_marker_id

__all__ = [
    "FINALIZE_REASON",
    "RERATE_REASON",
    "Grace",
    "finalize_marker",
    "grace_ends_at",
    "grace_of",
]

#: ``billing_period.closed`` reason of the marker that finalises a draft (the grace
#: period's end in the owning worker, or ``invoicing invoice finalize``).
FINALIZE_REASON = "draft_finalize"
#: Reason of the worker's own re-rating of an open draft after late usage (never on the
#: topic: a job of the owning worker at the position it has stored up to).
RERATE_REASON = "draft_rerate"


@dataclass(frozen=True)
class Grace:
    """A grace period: ``hours`` (``Decimal``, 0 = none) and where it came from
    (``customer``, ``plan`` or ``default``)."""

    hours: Decimal
    source: str

    @property
    def drafts(self) -> bool:
        """Whether the close makes a draft (``hours`` above 0)."""
        return self.hours > 0


def grace_of(customer_hours: Decimal | None, plan_hours: Decimal | None) -> Grace:
    """The grace period of an invoice: the customer's value when it states one, else the
    plan version's, else 0 (module docstring)."""
    if customer_hours is not None:
        return Grace(customer_hours, "customer")
    if plan_hours is not None:
        return Grace(plan_hours, "plan")
    return Grace(Decimal(0), "default")


def grace_ends_at(start: datetime, hours: Decimal) -> datetime:
    """``start`` (UTC) plus ``hours``, to the microsecond (exact for 6 decimals of an hour)."""
    return start + timedelta(microseconds=int(hours * 3_600_000_000))


def finalize_marker(
    customer_id: str, billing_period: str, invoice_id: str, *, at: datetime, source: str
) -> Envelope:
    """The marker that finalises the draft ``invoice_id``: a ``billing_period.closed`` of
    reason :data:`FINALIZE_REASON`, to produce with the customer id as its key (so it
    reaches the customer's partition, behind the usage already there). Its id derives
    from the draft, so the grace timer and ``invoicing invoice finalize`` send the same
    id: whichever comes second finds the draft finalised and changes nothing."""
    data = BillingPeriodClosed(
        customer_id=customer_id,
        billing_period=billing_period,
        closed_at=at,
        reason=FINALIZE_REASON,
    )
    event_id = close_marker_id(customer_id, billing_period, FINALIZE_REASON, invoice_id)
    return Envelope.wrap(data, id=event_id, source=source, time=at)
