"""The drill's result: one table for both modes, and what each mode must show.

Every number is counted after the run from what the run left behind — the
invoices and email tables, the SMTP sink's Maildir, the tax service's request
records, the workers' logs — never from the workers' own idea of what they did.
Each row names its source.

Expectations (the exit status of ``invoicing drill``):

- ``naive`` reproduces the incident: it holds when ``duplicate_invoices > 0``;
- ``safe`` is the pipeline: it holds when there is no duplicate invoice, no
  duplicate email, no customer without an invoice and no invoice without its email.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rich.table import Table

Mode = Literal["naive", "safe"]


@dataclass
class DrillReport:
    """Counts of one drill run (times in seconds)."""

    mode: Mode
    seed: int
    run_tag: str
    period: str
    customers: int
    large_customers: int
    workers: int
    #: The lease whose end the run was exposed to, e.g. "lock TTL 2 s".
    lease: str
    invoices: int = 0
    #: Invoices beyond the first of each customer.
    duplicate_invoices: int = 0
    customers_invoiced_twice: int = 0
    customers_invoiced_3_plus: int = 0
    #: Customers without any invoice.
    missing: int = 0
    emails: int = 0
    #: Emails beyond the first per invoice (safe: per Message-ID) or per customer (naive).
    duplicate_emails: int = 0
    #: Invoices (first of each customer) without an email.
    unemailed: int = 0
    #: Write transactions the database refused because the writer's fence moved on.
    fencing_refusals: int = 0
    #: Jobs whose lock or partition ended while they ran.
    leases_lost: int = 0
    #: naive: releases (plain DEL) that deleted another worker's lock.
    foreign_lock_deletes: int = 0
    tax_requests: int = 0
    #: Tax documents committed at the service beyond one per line (naive) / per invoice (safe).
    duplicate_tax_commits: int = 0
    longest_job_s: float = 0.0
    #: Invoice jobs of large customers: (min, median, max) seconds, to compare with the lease.
    large_job_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    setup_s: float = 0.0
    wall_s: float = 0.0
    workdir: str = ""
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Whether the mode's expectation holds (see the module docstring)."""
        if self.mode == "naive":
            return self.duplicate_invoices > 0
        return (
            self.duplicate_invoices == 0
            and self.duplicate_emails == 0
            and self.missing == 0
            and self.unemailed == 0
        )

    @property
    def expectation(self) -> str:
        if self.mode == "naive":
            return "duplicates > 0 (the incident reproduced)"
        return "no duplicate invoice or email, nothing missing"

    def rows(self) -> list[tuple[str, str, str]]:
        """(metric, value, source) in table order."""
        src = self.sources

        def row(label: str, key: str, value: object) -> tuple[str, str, str]:
            return (label, str(value), src.get(key, ""))

        return [
            row("customers (large)", "customers", f"{self.customers} ({self.large_customers})"),
            row("workers", "workers", self.workers),
            row("lease", "lease", self.lease),
            row("invoices", "invoices", self.invoices),
            row("duplicate invoices", "duplicate_invoices", self.duplicate_invoices),
            row(
                "customers invoiced twice / 3+ times",
                "duplicate_invoices",
                f"{self.customers_invoiced_twice} / {self.customers_invoiced_3_plus}",
            ),
            row("customers without invoice", "missing", self.missing),
            row("emails", "emails", self.emails),
            row("duplicate emails", "duplicate_emails", self.duplicate_emails),
            row("invoices without email", "unemailed", self.unemailed),
            row("writes refused by fencing", "fencing_refusals", self.fencing_refusals),
            row("leases/partitions lost while a job ran", "leases_lost", self.leases_lost),
            row(
                "locks deleted that were another's",
                "foreign_lock_deletes",
                self.foreign_lock_deletes,
            ),
            row("tax requests", "tax_requests", self.tax_requests),
            row("duplicate tax commits", "duplicate_tax_commits", self.duplicate_tax_commits),
            row(
                "large invoice jobs min / median / max",
                "longest_job_s",
                " / ".join(f"{v:.1f}" for v in self.large_job_s) + " s",
            ),
            row("longest invoice job", "longest_job_s", f"{self.longest_job_s:.1f} s"),
            row("setup time", "setup_s", f"{self.setup_s:.1f} s"),
            row("wall time", "wall_s", f"{self.wall_s:.1f} s"),
        ]

    def table(self) -> Table:
        table = Table(
            title=f"incident drill: {self.mode} (seed {self.seed}, run {self.run_tag}, period {self.period})",
            title_justify="left",
        )
        table.add_column("metric")
        table.add_column("value", justify="right")
        table.add_column("source", style="dim")
        for metric, value, source in self.rows():
            table.add_row(metric, value, source)
        return table

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ok"] = self.ok
        data["expectation"] = self.expectation
        return data


def spread(values: list[float]) -> tuple[float, float, float]:
    """(min, median, max) of ``values``; zeros when empty."""
    if not values:
        return (0.0, 0.0, 0.0)
    return (min(values), statistics.median(values), max(values))


def duplicate_counts(per_key: dict[str, int]) -> tuple[int, int, int]:
    """From occurrences per key: (extra occurrences beyond one each, keys seen exactly
    twice, keys seen three times or more)."""
    extra = sum(n - 1 for n in per_key.values() if n > 1)
    twice = sum(1 for n in per_key.values() if n == 2)
    more = sum(1 for n in per_key.values() if n >= 3)
    return extra, twice, more
