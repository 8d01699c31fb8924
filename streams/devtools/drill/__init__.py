"""The incident drill: docs/design.md "The incident" at compressed time, in two modes.

``invoicing drill --mode naive`` reproduces the month-end run that failed: eight
workers, a per-customer Redis lock with an expiry (``SET NX EX``), a plain
``DEL`` release, the tax service called per line, invoices saved without a
unique key, emails sent straight from the worker. Jobs outlive their locks and
customers are invoiced (and emailed) twice or more. That design lives in
:mod:`streams.devtools.drill.naive` and only there: the pipeline never imports it (a
unit test checks).

``invoicing drill --mode safe`` runs the pipeline itself on the same customers,
the same number of workers and the same tax-service latencies, in an isolated
sandbox (:func:`streams.devtools.sandbox.pipeline.isolated_pipeline`), with
``max.poll.interval.ms`` shorter than the longest invoice job. It must show no
duplicate invoice and no duplicate email.

Both print the same table (:mod:`streams.devtools.drill.report`). Modules:

- :mod:`streams.devtools.drill.config` — :class:`DrillConfig` (sizes, lock TTL, tax knobs);
- :mod:`streams.devtools.drill.customers` — the deterministic customer set of a seed;
- :mod:`streams.devtools.drill.naive` — the failed design (reproduction only);
- :mod:`streams.devtools.drill.safe` — the pipeline run;
- :mod:`streams.devtools.drill.report` — the table and the expectation of each mode;
- :mod:`streams.devtools.drill.run` — one run in either mode (the command is
  :mod:`streams.entrypoints.drill`).
"""

from __future__ import annotations

from streams.errors import InvoicingError


class DrillError(InvoicingError):
    """Root of the drill's errors: a run that could not complete (a timeout, a dead
    worker, a service that does not answer). Not raised for duplicates: counting
    them is the drill's result."""
