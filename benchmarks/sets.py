"""The scenario sets and their sizes: the one place where sizes live.

A set names which scenarios run and how big each is. ``smoke`` is tiny (the CI
smoke test runs it; every row, tiny numbers); ``standard`` is the size of the first
measurement (200 customers x 250 lines); ``month-end`` is the target close
(1,000 customers x 1,000 lines); ``incident`` is the shape of docs/design.md "The
incident" (docs/benchmarks.md "Targets"). ``--customers/--lines`` on the command line
override the main scenario's size (e.g. ``month-end`` at 300 x 1,000 when 1,000 x 1,000
is too slow).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MainSizes:
    """Sandbox "main": FOCUS import, usage ingest, the close, the replay dry run."""

    customers: int
    lines: int
    #: Rows of the generated FOCUS CSV (sampled and perturbed from the bundled sample).
    focus_rows: int
    #: Accounts (SubAccountId) the FOCUS rows are spread over.
    focus_accounts: int
    #: Fake tax latency per document request during the close (seconds).
    tax_latency_s: float = 0.05
    #: Invoicing worker processes of the close.
    workers: int = 1


@dataclass(frozen=True)
class LinearSizes:
    """Sandbox "latency": idle close → email latency, one-partition ingest, linearity."""

    #: Closes of one customer on an idle pipeline (one period each), after ``idle_warmup``.
    idle_closes: int
    idle_lines: int
    #: Usage rows produced to partition 0 only (measured per-partition throughput).
    partition_rows: int
    #: Linearity: ``customers`` x ``lines`` against ``customers`` x 10 ``lines``.
    linear_customers: int
    linear_lines: int
    idle_warmup: int = 1
    #: Fake tax latency of the idle closes (the fake's default, seconds).
    idle_tax_latency_s: float = 0.02
    #: Fake tax latency of the linearity closes: 0, so the ratio is the pipeline's own work.
    linear_tax_latency_s: float = 0.0


@dataclass(frozen=True)
class FencingSizes:
    """DB-level micro-benchmark of the issuance transaction, with and without the fence."""

    #: Invoices per timed block; blocks alternate fenced/unfenced ``repeats`` times each.
    invoices: int
    #: Lines per invoice, one measurement per entry.
    lines: tuple[int, ...]


@dataclass(frozen=True)
class IncidentSizes:
    """docs/design.md "The incident" as a scenario (docs/benchmarks.md "Targets")."""

    customers: int
    large_share: float
    large_lines: int
    #: Small customers get a seeded random count in this inclusive range (the drill's).
    small_lines: tuple[int, int]
    #: Worker counts compared (first = the incident's 8, second = 1).
    workers: tuple[int, int]
    tax_latency_s: float = 0.2
    spike_probability: float = 0.02
    spike_latency_s: float = 3.0
    seed: int = 1


@dataclass(frozen=True)
class BenchSet:
    """One named set: what runs and how big."""

    name: str
    description: str
    main: MainSizes | None
    linear: LinearSizes | None
    fencing: FencingSizes | None
    incident: IncidentSizes | None
    #: Timed repetitions of each cheap baseline / micro-benchmark (median reported).
    repeats: int = 3
    #: Untimed warm-up runs before them.
    warmup: int = 1
    #: Samples of the tax round trip (p50/p99 reported), after 3 warm-up requests.
    tax_samples: int = 20

    def only(self, groups: set[str]) -> BenchSet:
        """This set with only the scenario groups named (``main``, ``latency``, ``incident``;
        the fencing micro-benchmark belongs to ``main``).

        Raises:
            ValueError: an unknown group name.
        """
        unknown = groups - {"main", "latency", "incident"}
        if unknown:
            raise ValueError(f"unknown scenario groups {sorted(unknown)}")
        return replace(
            self,
            main=self.main if "main" in groups else None,
            fencing=self.fencing if "main" in groups else None,
            linear=self.linear if "latency" in groups else None,
            incident=self.incident if "incident" in groups else None,
        )

    def with_main_size(self, customers: int | None, lines: int | None) -> BenchSet:
        if self.main is None or (customers is None and lines is None):
            return self
        main = replace(
            self.main,
            customers=customers or self.main.customers,
            lines=lines or self.main.lines,
        )
        return replace(self, main=main)


SETS: dict[str, BenchSet] = {
    "smoke": BenchSet(
        name="smoke",
        description="every scenario, tiny (the CI smoke test; well under 2 minutes)",
        main=MainSizes(customers=20, lines=20, focus_rows=1_000, focus_accounts=20),
        linear=LinearSizes(
            idle_closes=2, idle_lines=100, partition_rows=2_000, linear_customers=5, linear_lines=20
        ),
        fencing=FencingSizes(invoices=20, lines=(1,)),
        incident=IncidentSizes(
            customers=10,
            large_share=0.2,
            large_lines=300,
            small_lines=(5, 20),
            workers=(2, 1),
            tax_latency_s=0.05,
            spike_probability=0.1,
            spike_latency_s=0.2,
        ),
        repeats=1,
        warmup=0,
        tax_samples=5,
    ),
    "standard": BenchSet(
        name="standard",
        description="the first measurement's size: 200 customers x 250 lines, one worker",
        main=MainSizes(customers=200, lines=250, focus_rows=50_000, focus_accounts=200),
        linear=LinearSizes(
            idle_closes=20,
            idle_lines=1_000,
            partition_rows=50_000,
            linear_customers=200,
            linear_lines=25,
        ),
        fencing=FencingSizes(invoices=200, lines=(1, 250)),
        incident=None,
    ),
    "month-end": BenchSet(
        name="month-end",
        description="the target close: 1,000 customers x 1,000 lines (1M lines), one worker",
        main=MainSizes(customers=1_000, lines=1_000, focus_rows=200_000, focus_accounts=1_000),
        linear=LinearSizes(
            idle_closes=20,
            idle_lines=1_000,
            partition_rows=100_000,
            linear_customers=100,
            linear_lines=100,
        ),
        fencing=FencingSizes(invoices=200, lines=(1, 1_000)),
        incident=None,
    ),
    "incident": BenchSet(
        name="incident",
        description="the incident (docs/design.md): 8 workers, 500 customers, 10% with 5,000 lines, tax 200 ms + spikes",
        main=None,
        linear=None,
        fencing=None,
        incident=IncidentSizes(
            customers=500, large_share=0.10, large_lines=5_000, small_lines=(5, 50), workers=(8, 1)
        ),
    ),
}
