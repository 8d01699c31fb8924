"""PostgreSQL statements of the billing kernel (psycopg 3), one module per table family.

=====================  ==========================================================
:mod:`.usage`          ``customers`` and ``usage_lines`` (dedup by event id)
:mod:`.invoices`       ``invoices``, ``invoice_lines``, ``document_counters``
                       (gapless numbers), ``credit_notes`` and the ``outbox``
:mod:`.holds`          ``invoice_holds``
:mod:`.documents`      issued documents read back whole (the PDF, the hosted page)
:mod:`.closes`         ``period_closes``
:mod:`.dead_letters`   ``dead_letters`` (what was dead-lettered, so never twice)
:mod:`.metering`       ``metered_usage`` and ``subscription_events`` (dedup by event id)
:mod:`.pricing`        ``billable_metrics`` and ``plan_versions`` (the published
                       price book, immutable entries)
=====================  ==========================================================

The fence tables (``partition_fences``, ``lease_fences``, ``close_requests``)
are written by :mod:`streams.core.billing.fencing`.

Every function takes an open connection as its first argument and runs inside
the caller's transaction (it never begins or commits one), so one transaction
composes statements of several modules: the issuance transaction
(:mod:`streams.core.billing.issuance`) is the fence check, a number, the invoice, its
lines, the outbox row and the caller's extra rows, on one connection. A write
transaction starts with a fence check (:mod:`streams.core.billing.fencing`).

Rows map to the frozen dataclasses of :mod:`streams.core.billing.rows` through
psycopg's ``class_row``: no caller reads a row by position.
"""

from streams.core.billing.store import (
    closes,
    dead_letters,
    documents,
    drafts,
    holds,
    invoices,
    metering,
    pricing,
    usage,
)

__all__ = [
    "closes",
    "dead_letters",
    "documents",
    "drafts",
    "holds",
    "invoices",
    "metering",
    "pricing",
    "usage",
]
