"""Prometheus metrics of the usage view and the ingest edge (default registry).

The view serves them at ``GET /metrics`` on its web port; the edge at ``GET /metrics``
on its own. Alert rules: ``ops/prometheus-alerts.yml`` (group ``usage-view``).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

VIEW_RECORDS = Counter(
    "invoicing_usage_view_records_total",
    "Account-event records the usage view handled, by type and outcome (applied, late, "
    "duplicate, conflict, redelivered, refused)",
    ["type", "outcome"],
)
VIEW_LAG = Gauge(
    "invoicing_usage_view_lag_records",
    "Records of billing.account-events.v1 behind the usage view, per partition it owns "
    "(high watermark - next offset to read)",
    ["partition"],
)
VIEW_LAST_APPLIED = Gauge(
    "invoicing_usage_view_last_record_timestamp_seconds",
    "Unix time at which the view last handled a record, per partition it owns",
    ["partition"],
)
VIEW_KEYS = Gauge(
    "invoicing_usage_view_table_keys",
    "Keys held in memory per table of this instance (after the last cleanup)",
    ["table"],
)
VIEW_EXPIRED = Counter(
    "invoicing_usage_view_expired_total",
    "Table keys dropped by the view's retention (closed periods past retention, and their "
    "event ids), and, as table subscription_events, customers' subscription events no kept "
    "period can see",
    ["table"],
)
VIEW_REQUESTS = Counter(
    "invoicing_usage_view_requests_total",
    "Usage requests answered by this instance, by status and whether it owned the key "
    "(local) or forwarded it to the owner (routed)",
    ["status", "route"],
)
VIEW_REQUEST_SECONDS = Histogram(
    "invoicing_usage_view_request_seconds",
    "Time to answer a usage request on the owner (rating included)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
VIEW_BATCH_RECORDS = Histogram(
    "invoicing_usage_view_batch_records",
    "Source records applied per batch (each changed table key is written once per batch)",
    buckets=(1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000),
)
VIEW_KEYS_WRITTEN = Counter(
    "invoicing_usage_view_keys_written_total",
    "Table keys written to the changelog by the view's batches, per table",
    ["table"],
)
