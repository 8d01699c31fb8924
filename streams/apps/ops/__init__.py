"""Operator commands' logic: status view, holds, fences, outbox retention and reconciliation.

- :mod:`streams.apps.ops.status` — ``invoicing status`` (:func:`~streams.apps.ops.status.collect`);
- :mod:`streams.apps.ops.holds` — ``invoicing holds list|release``;
- :mod:`streams.apps.ops.fences` — ``invoicing fences list``;
- :mod:`streams.apps.ops.reconcile` — ``invoicing reconcile`` and ``invoicing outbox prune``;
- :mod:`streams.apps.ops.focus_reconcile` — ``invoicing reconcile --focus FILE`` (invoices
  against the FOCUS file they billed).

The commands are :mod:`streams.entrypoints.ops`; what these functions read and
write through (connections, consumers, a producer) they receive from it.
"""
