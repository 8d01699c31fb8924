"""The in-memory twins of the PostgreSQL stores (:mod:`streams.core.billing.store`), one
module each, with the same functions taking a
:class:`~streams.adapters.memory.database.MemoryConnection` first:

=====================  ==========================================================
:mod:`.usage`          ``customers`` and ``usage_lines`` (:class:`~streams.core.billing.ports.UsageStore`)
:mod:`.invoices`       invoices, lines, numbering, credit notes, outbox
                       (:class:`~streams.core.billing.ports.InvoiceStore`)
:mod:`.holds`          ``invoice_holds`` (:class:`~streams.core.billing.ports.HoldStore`)
:mod:`.closes`         ``period_closes`` (:class:`~streams.core.billing.ports.CloseStore`)
:mod:`.metering`       ``metered_usage``, ``subscription_events``
                       (:class:`~streams.core.billing.ports.MeteringStore`)
:mod:`.pricing`        ``billable_metrics``, ``plan_versions``
                       (:class:`~streams.core.billing.ports.PriceBookStore`)
=====================  ==========================================================

Each function runs as one statement (:meth:`MemoryConnection.statement
<streams.adapters.memory.database.MemoryConnection.statement>` named
``"<module>.<function>"``, the name :meth:`~streams.adapters.memory.database.InMemoryDatabase.fail_next`
takes) in the caller's transaction. Rows are the frozen dataclasses of
:mod:`streams.adapters.memory.store.tables`.
"""

from streams.adapters.memory.store import (
    closes,
    drafts,
    holds,
    invoices,
    metering,
    pricing,
    usage,
)

__all__ = ["closes", "drafts", "holds", "invoices", "metering", "pricing", "usage"]
