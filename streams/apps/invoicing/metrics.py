"""Prometheus metrics of the invoicing worker (default registry, ``invoicing_`` prefix).

The kernel's own (fencing refusals, offset-commit failures, dead letters) are in
:mod:`streams.core.billing.metrics`.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECORDS = Counter(
    "invoicing_records_total",
    "Account-event records handled, by type and outcome",
    ["type", "outcome"],
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
PARTITIONS_LOST_WITH_JOB = Counter(
    "invoicing_partitions_lost_with_job_in_flight_total",
    "Partitions revoked or lost while an invoice job of theirs was in flight",
    ["how"],
)
JOB_SECONDS = Histogram(
    "invoicing_invoice_job_seconds",
    "Wall time of one invoice job (read, tax, write)",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
JOBS_IN_FLIGHT = Gauge(
    "invoicing_invoice_jobs_in_flight",
    "Invoice jobs started and not yet collected (running, or waiting for a job thread)",
)
OWNED_PARTITIONS = Gauge(
    "invoicing_owned_partitions", "Partitions this worker holds a fence claim for"
)
FAILURES = Counter(
    "invoicing_worker_failures_total",
    "Failures the worker met, by stage (claim, read, write, dead_letter, invoice) and "
    "disposition (streams.core.billing.failures: transient, permanent, contended, fenced, unexpected)",
    ["stage", "disposition"],
)
BISECTIONS = Counter(
    "invoicing_batch_bisections_total",
    "Batches split because a write failed permanently (a record PostgreSQL refused)",
)
DATABASE_BACKOFFS = Counter(
    "invoicing_database_backoffs_total",
    "Times the poll thread stopped calling the database for a while after a transient failure",
)
CROSS_PARTITION_USAGE = Counter(
    "invoicing_cross_partition_usage_total",
    "Close markers whose customer has usage of the period on another partition "
    "(the topic gained partitions): held, never invoiced from part of the usage",
)
RATING_SECONDS = Histogram(
    "invoicing_rating_seconds",
    "Wall time of the rating step of one invoice job (aggregation, segments, rate(), pricing)",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RATED_EVENTS = Counter(
    "invoicing_rated_metered_events_total", "Distinct usage.metered events rated by invoice jobs"
)
RATING_HOLDS = Counter(
    "invoicing_rating_holds_total",
    "Invoices held because rating found a gap (hold code: no_subscription, unknown_plan, …)",
    ["code"],
)
