"""What a drill run is made of: sizes, the compressed clock and the tax latencies.

Compressed time (the incident in docs/design.md had a 60 s lock and invoices of 2-5 minutes): the
lock TTL is 4 s and the tax service is slow per line, so that a large invoice
takes several lock TTLs (measured on a 2-core machine: 7-22 s, median 15 s, for
the naive design's 1,000-3,000 per-line calls). Both modes get the same :class:`FakeTaxConfig`; the
latency model is per request (``base + per_line * lines``, plus a spike with
some probability), so the naive design — one request per line — pays the base
and meets the spikes once per line, as it did in production.

The defaults were measured to fit one run in about three minutes on a
2-core machine (docs/drill.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from streams.devtools.stack.fake_tax.config import FakeTaxConfig

#: The billing period the drill invoices (in the past, so close-period's topic scan
#: window covers every event).
DRILL_PERIOD = "2025-01"


def default_tax() -> FakeTaxConfig:
    """The tax latencies of the drill: 1 ms per request, 2.5 ms per line, and one
    request in a thousand 1 s slower. A 3,000-line document takes 7.5 s."""
    return FakeTaxConfig(
        base_latency_s=0.001,
        per_line_latency_s=0.0025,
        spike_probability=0.001,
        spike_latency_s=1.0,
    )


@dataclass(frozen=True)
class DrillConfig:
    """One drill run.

    Attributes:
        customers: number of customers (default 250).
        large_share: share of them that are large (0..1, default 0.10; rounded to a count).
        large_lines / small_lines: inclusive (min, max) usage lines of a large / small customer.
        workers: worker threads (naive) or invoicing worker processes (safe); default 8.
        seed: makes the customer set (sizes, amounts, regions) deterministic.
        lock_ttl_s: naive: the per-customer lock's expiry (seconds; default 4).
        max_poll_interval_ms / session_timeout_ms: safe: the consumer-group lease
            (milliseconds; the broker's minimum session timeout is 6,000).
        tax: the fake tax service's knobs (both modes).
        timeout_s: a run that has not finished after this long fails (:class:`DrillError`).
        period: the billing period invoiced.
    """

    customers: int = 250
    large_share: float = 0.10
    large_lines: tuple[int, int] = (1000, 3000)
    small_lines: tuple[int, int] = (5, 50)
    workers: int = 8
    seed: int = 1
    lock_ttl_s: float = 4.0
    max_poll_interval_ms: int = 6000
    session_timeout_ms: int = 6000
    tax: FakeTaxConfig = field(default_factory=default_tax)
    timeout_s: float = 900.0
    period: str = DRILL_PERIOD

    @property
    def large_count(self) -> int:
        return round(self.customers * self.large_share)
