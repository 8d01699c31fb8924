"""Backoff of a dependency the invoicing worker's poll thread calls (the database, the
dead-letter topic): after a failure the poll thread leaves it alone for a while, so
an outage costs one short wait per backoff instead of a timeout per partition per poll."""

from __future__ import annotations

import logging
import time

from streams.apps.invoicing.metrics import DATABASE_BACKOFFS

log = logging.getLogger("streams.apps.invoicing.worker")

__all__ = ["Gate"]


class Gate:
    """Backoff of a dependency the poll thread calls: after a failure it stays closed
    for ``initial_s`` seconds, doubling up to ``max_s`` while failures repeat."""

    def __init__(self, name: str, initial_s: float, max_s: float) -> None:
        self.name = name
        self.initial_s = initial_s
        self.max_s = max_s
        self.closed_until = 0.0
        self.failures = 0

    def open(self) -> bool:
        return time.monotonic() >= self.closed_until

    def failed(self, reason: str) -> None:
        self.failures += 1
        wait = min(self.max_s, self.initial_s * 2 ** min(self.failures - 1, 10))
        self.closed_until = time.monotonic() + wait
        if self.name == "database":
            DATABASE_BACKOFFS.inc()
        log.warning(
            "%s unavailable (%s); the poll thread leaves it alone for %.1fs",
            self.name,
            reason,
            wait,
        )

    def succeeded(self) -> None:
        if self.failures:
            log.info("%s available again after %d failure(s)", self.name, self.failures)
        self.failures = 0
        self.closed_until = 0.0
