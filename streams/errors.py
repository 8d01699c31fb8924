"""The root of the project's exceptions.

Every error the project raises on purpose derives from :class:`InvoicingError`, through
its package's own root (``DomainError``, ``FencingError``, ``LeaseError``,
``ImporterError``, …), so a caller can tell "the pipeline refused this" from a bug in a
library or in our code with one ``except``. Whether to retry is not the root's business:
that is :func:`streams.core.billing.failures.classify` (transient, permanent, contended,
fenced, unexpected). The tree: docs/architecture.md "Exceptions".

The lowest layer: it imports nothing of the project, so the pure domain can import it
(tests/unit/test_layer_rules.py).
"""

from __future__ import annotations

__all__ = ["InvoicingError"]


class InvoicingError(Exception):
    """Root of every exception the project raises on purpose.

    Private exceptions that never leave their module (control flow inside one
    function's retry loop, say) need not derive from it.
    """
