"""Prometheus metrics of the billing kernel (default registry, ``invoicing_`` prefix).

The names are those the alert rules use (``ops/prometheus-alerts.yml``); they
moved here with their code and did not change.
"""

from __future__ import annotations

from prometheus_client import Counter

__all__ = [
    "CLAIMS_REFUSED",
    "DEAD_LETTERED",
    "DEAD_LETTERS_TRUNCATED",
    "FENCING_REFUSALS",
    "OFFSET_COMMIT_FAILURES",
]

FENCING_REFUSALS = Counter(
    "invoicing_fencing_refusals_total",
    "Write transactions refused because the partition's fence moved on",
    ["stage"],
)
CLAIMS_REFUSED = Counter(
    "invoicing_fence_claims_refused_total",
    "Partition claims refused at assignment (stale member or reset group)",
)
OFFSET_COMMIT_FAILURES = Counter(
    "invoicing_offset_commit_failures_total",
    "Offset commits that failed after the database commit (records are redelivered)",
)
DEAD_LETTERED = Counter(
    "invoicing_dead_lettered_total",
    "Records sent to the dead-letter topic, by reason kind and attribution "
    "(customer: a hold was written for its customer(s); unattributed: no customer "
    "could be read from it, so nothing is held)",
    ["kind", "attribution"],
)
DEAD_LETTERS_TRUNCATED = Counter(
    "invoicing_dead_letters_truncated_total",
    "Dead-letter records sent truncated because the original did not fit the "
    "dead-letter topic (the original stays at its source offset)",
    ["kind"],
)
