"""Prometheus metrics of the HTTP ingest edge (``invoicing worker ingest``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

INGEST_EVENTS = Counter(
    "invoicing_ingest_events_total",
    "Events received by the HTTP ingest edge, by outcome (accepted, duplicate, rejected)",
    ["outcome"],
)
INGEST_REQUESTS = Counter(
    "invoicing_ingest_requests_total", "HTTP requests to the ingest edge, by status", ["status"]
)
INGEST_PRODUCE_SECONDS = Histogram(
    "invoicing_ingest_produce_seconds",
    "Time from a request's validation to the broker's delivery report of its last event",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
