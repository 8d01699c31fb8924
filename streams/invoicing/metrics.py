"""Prometheus metrics of the invoicing worker (default registry, ``invoicing_`` prefix)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECORDS = Counter(
    "invoicing_records_total",
    "Account-event records handled, by type and outcome",
    ["type", "outcome"],
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
INVOICES = Counter(
    "invoicing_invoices_total",
    "Close markers handled, by outcome "
    "(invoiced, already_invoiced, held, retry, failed, cancelled, fenced)",
    ["outcome"],
)
HOLDS = Counter(
    "invoicing_holds_total", "Invoices held because a record of the customer was dead-lettered"
)
FENCING_REFUSALS = Counter(
    "invoicing_fencing_refusals_total",
    "Write transactions refused because the partition's fence moved on",
    ["stage"],
)
CLAIMS_REFUSED = Counter(
    "invoicing_fence_claims_refused_total",
    "Partition claims refused at assignment (stale member or reset group)",
)
PARTITIONS_LOST_WITH_JOB = Counter(
    "invoicing_partitions_lost_with_job_in_flight_total",
    "Partitions revoked or lost while an invoice job of theirs was in flight",
    ["how"],
)
OFFSET_COMMIT_FAILURES = Counter(
    "invoicing_offset_commit_failures_total",
    "Offset commits that failed after the database commit (records are redelivered)",
)
JOB_SECONDS = Histogram(
    "invoicing_invoice_job_seconds",
    "Wall time of one invoice job (read, tax, write)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
JOBS_IN_FLIGHT = Gauge("invoicing_invoice_jobs_in_flight", "Invoice jobs running now")
OWNED_PARTITIONS = Gauge(
    "invoicing_owned_partitions", "Partitions this worker holds a fence claim for"
)
