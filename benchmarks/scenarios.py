"""The scenarios: each runs in a sandbox of its own and adds rows to the run's report.

Three sandboxes per set at most (each ``streams.devtools.sandbox.isolated_pipeline``: own
database, topics, consumer groups, connector and slot, SMTP sink, fake tax service):

- **main**: the Debezium relay and FOCUS import baselines, usage ingest (one
  worker) with its COPY and bare-consumer baselines, the fencing micro-benchmark
  (own database), the close with its physical lower bound, the replay dry run;
- **latency**: the idle close → email latency, the one-partition ingest, linearity;
- **incident**: the shape of docs/design.md "The incident" with N workers, then with 1 worker.

Workers are ``invoicing worker …`` processes (``streams.processes`` through the
sandbox); import, close and replay are ``invoicing …`` commands. Times of the
pipeline are read from the database (``partition_fences.updated_at``,
``close_requests.requested_at``, ``invoices.issued_at``,
``email_deliveries.sent_at``): same clock as the harness (one machine).
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

from benchmarks import baselines, kafka_tools, load
from benchmarks.measure import (
    BenchError,
    Profile,
    Profiler,
    RssSampler,
    median,
    percentile,
    py_spy_record,
    run_cli,
    summarize_collapsed,
    wait_until,
)
from benchmarks.product import (
    Pipeline,
    Settings,
    invoicing_command,
    issue_invoice,
    migrated_database,
    new_unique,
    prepare_fencing,
    sandbox,
)
from benchmarks.report import Row, RunReport
from benchmarks.sets import BenchSet, FencingSizes, IncidentSizes, LinearSizes, MainSizes

#: Billing periods used by the scenarios (in the past: close-period's and replay's
#: topic windows start at period start - 7 days, before every record's produce time).
MAIN_PERIOD = "2025-09"
FOCUS_PERIOD = "2024-09"
PARTITION_PERIOD = "2023-01"
LINEAR_PERIODS = ("2025-05", "2025-06")
INCIDENT_PERIODS = ("2025-01", "2025-02")


@dataclass
class Context:
    """What every scenario gets."""

    settings: Settings
    bset: BenchSet
    report: RunReport
    console: Console
    out_dir: Path
    profile: bool
    py_spy: str | None
    profiles: list[Profile] = field(default_factory=list)
    #: profile idle threads too (wall clock, not CPU): ``--profile-idle``
    profile_idle: bool = False
    #: lines per invoice → fenced issuance rate (invoices/s, one connection) of this run
    issuance_rates: dict[int, float] = field(default_factory=dict)

    def phase(self, name: str, seconds: float) -> None:
        self.report.phases[name] = round(seconds, 3)
        self.console.log(f"{name}: {seconds:,.1f} s")


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _sandbox(ctx: Context, name: str) -> Iterator[tuple[Pipeline, Path]]:
    """A sandbox for one scenario group. A failure of the sandbox's own teardown after
    the measurements succeeded is recorded in the report (``teardown_errors``) and
    does not discard them."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        manager = sandbox(ctx.settings, new_unique(), Path(tmp))
        p = manager.__enter__()
        ctx.phase(f"{name}: sandbox up", time.perf_counter() - t0)
        try:
            yield p, Path(tmp)
        except BaseException:
            print(f"{name} failed; worker logs:\n{p.worker_logs()[-8000:]}", file=sys.stderr)
            if not manager.__exit__(*sys.exc_info()):
                raise
        else:
            try:
                manager.__exit__(None, None, None)
            except Exception as exc:
                ctx.report.details.setdefault("teardown_errors", []).append(f"{name}: {exc}")
                ctx.console.log(
                    f"[yellow]{name}: sandbox teardown failed (kept the figures): {exc}[/]"
                )
        ctx.phase(f"{name}: total (with teardown)", time.perf_counter() - t0)


def _alive(p: Pipeline) -> str | None:
    dead = [w.name for w in p.workers.processes if w.process.poll() is not None]
    return f"workers exited: {dead}\n{p.worker_logs()[-4000:]}" if dead else None


def _one(conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()) -> Any:
    row = conn.execute(query, params).fetchone()
    return row[0] if row else None


def _stop_workers(p: Pipeline) -> None:
    """Stop every worker process and forget them (so a later start is not reported
    as "workers exited" because of these)."""
    p.workers.stop()
    p.workers.processes.clear()


def _start_workers(p: Pipeline, invoicing: int, email: int) -> float:
    """Start worker processes; returns ``time.time()`` of the start."""
    started = time.time()
    p.workers.start("invoicing", invoicing)
    if email:
        p.workers.start("email", email)
    return started


def _wait_claimed(p: Pipeline, since: float, timeout_s: float = 120.0) -> float:
    """Until the invoicing group has claimed all 12 partitions after ``since``;
    returns the epoch of the last claim."""
    group = p.settings.worker.invoicing_group
    with p.connect() as conn:

        def claimed() -> bool:
            n = _one(
                conn,
                "SELECT count(*) FROM partition_fences WHERE group_id = %s "
                "AND updated_at >= to_timestamp(%s)",
                (group, since - 0.5),
            )
            return int(n) >= 12

        wait_until(
            "the invoicing group's claims", claimed, timeout_s=timeout_s, alive=lambda: _alive(p)
        )
        last = _one(
            conn,
            "SELECT extract(epoch FROM max(updated_at))::float8 FROM partition_fences WHERE group_id = %s",
            (group,),
        )
    return float(last)


def _wait_stored(
    p: Pipeline, *, rows_where: str, params: tuple[Any, ...], rows: int, timeout_s: float
) -> float:
    """Until the invoicing group's committed offsets reach the topic's end and
    ``rows`` usage rows match ``rows_where``; returns the epoch it was seen."""
    end = sum(kafka_tools.end_offsets(p.settings, p.topic).values())
    committed = kafka_tools.CommittedOffsets(p.settings, p.settings.worker.invoicing_group, p.topic)
    try:
        seen = wait_until(
            "committed offsets at the end of the topic",
            lambda: committed.total() >= end,
            timeout_s=timeout_s,
            interval_s=0.1,
            alive=lambda: _alive(p),
        )
    finally:
        committed.close()
    with p.connect() as conn:
        stored = int(_one(conn, f"SELECT count(*) FROM usage_lines WHERE {rows_where}", params))
    if stored < rows:
        raise BenchError(f"offsets committed but only {stored} of {rows} usage rows stored")
    return seen


@dataclass
class CloseTimes:
    command_started: float
    command_s: float
    first_request: float
    last_issued: float
    last_email: float | None
    invoices: int
    lines: int
    rss_before_mib: float
    rss_peak_mib: float

    @property
    def to_issued(self) -> float:
        return self.last_issued - self.command_started

    @property
    def to_email(self) -> float:
        return (self.last_email or math.nan) - self.command_started

    @property
    def request_to_issued(self) -> float:
        return self.last_issued - self.first_request


def _close(
    ctx: Context,
    p: Pipeline,
    cwd: Path,
    period: str,
    customers: int,
    *,
    emails: bool,
    timeout_s: float,
    profile_name: str | None = None,
) -> CloseTimes:
    """``invoicing close-period PERIOD``, then wait until ``customers`` invoices are issued
    (and emailed); worker RSS sampled meanwhile (``/proc/<pid>/status`` VmRSS)."""
    pids = [w.process.pid for w in p.workers.alive() if w.kind == "invoicing"]
    profiler = None
    if profile_name and ctx.profile and ctx.py_spy and pids:
        profiler = Profiler(pids[0], profile_name, ctx.out_dir, ctx.py_spy, idle=ctx.profile_idle)
    with RssSampler(pids) as rss, p.connect() as conn:
        time.sleep(0.3)  # at least one sample before the close
        before = max((s[2] for s in rss.samples), default=0) / 2**20
        if profiler:
            profiler.start()
        result = run_cli(
            [*invoicing_command(), "close-period", period, "--no-progress", "--json"],
            p.env,
            cwd=cwd,
            timeout_s=timeout_s,
        )

        def issued() -> bool:
            n = int(
                _one(conn, "SELECT count(*) FROM invoices WHERE billing_period = %s", (period,))
            )
            return n >= customers

        wait_until(
            f"{customers} invoices of {period}",
            issued,
            timeout_s=timeout_s,
            interval_s=0.2,
            alive=lambda: _alive(p),
        )
        if profiler:
            ctx.profiles.append(profiler.stop())
        if emails:

            def emailed() -> bool:
                n = int(
                    _one(
                        conn,
                        "SELECT count(*) FROM email_deliveries e JOIN invoices i "
                        "ON i.invoice_id = e.document_id WHERE i.billing_period = %s "
                        "AND e.status IN ('sent', 'skipped')",
                        (period,),
                    )
                )
                return n >= customers

            wait_until(
                f"{customers} emails of {period}",
                emailed,
                timeout_s=timeout_s,
                interval_s=0.2,
                alive=lambda: _alive(p),
            )
        row = conn.execute(
            "SELECT extract(epoch FROM max(issued_at))::float8, count(*), sum(line_count) "
            "FROM invoices WHERE billing_period = %s",
            (period,),
        ).fetchone()
        assert row is not None
        first_request = _one(
            conn,
            "SELECT extract(epoch FROM min(requested_at))::float8 FROM close_requests "
            "WHERE billing_period = %s",
            (period,),
        )
        last_email = None
        if emails:
            last_email = _one(
                conn,
                "SELECT extract(epoch FROM max(e.sent_at))::float8 FROM email_deliveries e "
                "JOIN invoices i ON i.invoice_id = e.document_id WHERE i.billing_period = %s",
                (period,),
            )
    return CloseTimes(
        command_started=result.started,
        command_s=result.seconds,
        first_request=float(first_request),
        last_issued=float(row[0]),
        last_email=float(last_email) if last_email is not None else None,
        invoices=int(row[1]),
        lines=int(row[2] or 0),
        rss_before_mib=before,
        rss_peak_mib=rss.peak_mib(),
    )


def _close_backlog(p: Pipeline, cwd: Path, period: str, customers: int) -> dict[str, float]:
    """A close whose markers are all on the topic before the (one) worker starts: the
    invoicing work alone, not paced by close-period's per-customer requests. Seconds
    from the worker's last fence claim to the last invoice issued; its RSS meanwhile."""
    _stop_workers(p)
    run_cli(
        [*invoicing_command(), "close-period", period, "--no-progress", "--json"],
        p.env,
        cwd=cwd,
        timeout_s=3600,
    )
    started = _start_workers(p, 1, 0)
    claimed = _wait_claimed(p, started)
    pids = [w.process.pid for w in p.workers.alive() if w.kind == "invoicing"]
    with RssSampler(pids) as rss, p.connect() as conn:

        def issued() -> bool:
            n = _one(conn, "SELECT count(*) FROM invoices WHERE billing_period = %s", (period,))
            return int(n) >= customers

        wait_until(
            f"{customers} invoices of {period}",
            issued,
            timeout_s=3600,
            interval_s=0.2,
            alive=lambda: _alive(p),
        )
        row = conn.execute(
            "SELECT extract(epoch FROM max(issued_at))::float8, sum(line_count) FROM invoices "
            "WHERE billing_period = %s",
            (period,),
        ).fetchone()
    assert row is not None
    return {
        "seconds": float(row[0]) - claimed,
        "lines": float(row[1] or 0),
        "rss_peak_mib": rss.peak_mib(),
    }


@dataclass(frozen=True)
class Bound:
    """The physical lower bound of a close and its terms (seconds)."""

    write_s: float
    tax_s: float
    outbox_s: float

    @property
    def seconds(self) -> float:
        return max(self.write_s, self.tax_s, self.outbox_s)

    def describe(self) -> str:
        return (
            f"max(write {self.write_s:.2f} s, tax {self.tax_s:.2f} s, outbox {self.outbox_s:.2f} s)"
        )


def lower_bound(
    *,
    lines: int,
    copy_rate: float,
    requests: list[int],
    latency_s: float,
    concurrency: int,
    invoices: int,
    relay_rate: float,
) -> Bound:
    """``max(lines / COPY rate, tax, invoices / relay rate)`` where tax =
    ``max(sum(requests) * latency / concurrency, max(requests) * latency)`` (a
    customer's requests run one after another). docs/benchmarks.md "Lower bound"."""
    tax = max(sum(requests) * latency_s / max(1, concurrency), max(requests, default=0) * latency_s)
    return Bound(lines / copy_rate, tax, invoices / relay_rate if relay_rate else 0.0)


def _requests_per_customer(lines: list[int], max_lines: int) -> list[int]:
    return [max(1, math.ceil(n / max_lines)) for n in lines]


def _concurrency(settings: Settings, workers: int) -> int:
    return workers * min(settings.tax.max_concurrency, settings.worker.max_jobs)


def _configure_tax(p: Pipeline, **knobs: Any) -> None:
    p.tax.admin.configure(**knobs)


# --------------------------------------------------------------------------- main


def run_main(ctx: Context, sizes: MainSizes) -> None:
    bset, report = ctx.bset, ctx.report
    rep, warm = bset.repeats, bset.warmup
    with _sandbox(ctx, "main") as (p, cwd):
        unique = p.unique
        customers = load.customer_ids(unique, sizes.customers)
        rows = sizes.customers * sizes.lines
        records = rows + sizes.customers

        # Debezium relay of bare outbox rows (before any other load)
        t0 = time.perf_counter()
        relay = baselines.debezium_relay(p, rows=max(50, sizes.customers), repeats=rep, warmup=warm)
        ctx.phase("main: debezium relay baseline", time.perf_counter() - t0)
        report.details["debezium_relay"] = {
            "rows": relay.rows,
            "rows_per_s_samples": relay.samples,
            "first_record_latency_s": relay.first_latency_s,
        }

        # FOCUS import vs a bare producer of the same records
        t0 = time.perf_counter()
        _focus(ctx, p, cwd, sizes)
        ctx.phase("main: focus import + bare producer", time.perf_counter() - t0)

        # the usage, produced while no worker runs
        t0 = time.perf_counter()
        produced, _ = kafka_tools.produce(
            p.settings, p.topic, load.usage_for(customers, MAIN_PERIOD, sizes.lines)
        )
        ctx.phase(f"main: produce {produced:,} records", time.perf_counter() - t0)

        # bare counting consumer on the same records
        t0 = time.perf_counter()
        bare_s = [kafka_tools.bare_count(p.settings, p.topic, produced) for _ in range(warm + rep)]
        bare_rate = median([produced / s for s in bare_s[warm:]])
        ctx.phase("main: bare consumer baseline", time.perf_counter() - t0)

        # ingest by one worker
        started = _start_workers(p, sizes.workers, 1)
        claimed = _wait_claimed(p, started)
        profiler = None
        pids = [w.process.pid for w in p.workers.alive() if w.kind == "invoicing"]
        if ctx.profile and ctx.py_spy:
            profiler = Profiler(pids[0], "ingest", ctx.out_dir, ctx.py_spy, idle=ctx.profile_idle)
            profiler.start()
        done = _wait_stored(
            p,
            rows_where="billing_period = %s",
            params=(MAIN_PERIOD,),
            rows=rows,
            timeout_s=3600,
        )
        if profiler:
            ctx.profiles.append(profiler.stop())
        ingest_s = done - claimed
        ctx.phase("main: ingest", ingest_s)

        t0 = time.perf_counter()
        copy = baselines.copy_rate(
            p, "usage_lines", "billing_period = %s", (MAIN_PERIOD,), repeats=rep, warmup=warm
        )
        ctx.phase("main: COPY usage_lines baseline", time.perf_counter() - t0)
        size = f"{sizes.customers}x{sizes.lines}"
        report.add(
            Row(
                "usage ingest",
                f"stored by {sizes.workers} worker ({size})",
                rows / ingest_s,
                "rows/s",
                "COPY same rows into copy of usage_lines",
                copy.rate,
                "rows/s",
                "rate",
                "≥ 0.5",
                f"{rows:,} rows in {ingest_s:.2f} s (from the last fence claim to committed offsets at the end); COPY samples {[round(s) for s in copy.samples]}",
            )
        )
        report.add(
            Row(
                "usage ingest",
                f"records consumed by {sizes.workers} worker ({size})",
                records / ingest_s,
                "rec/s",
                "bare confluent-kafka consumer, counting",
                bare_rate,
                "rec/s",
                "rate",
                "≥ 0.4",
                f"bare consumer seconds {[round(s, 2) for s in bare_s]} (first = warm-up)",
            )
        )

        # fencing micro-benchmark (own database, no connector)
        if bset.fencing is not None:
            t0 = time.perf_counter()
            _fencing(ctx, bset.fencing)
            ctx.phase("main: fencing micro-benchmark", time.perf_counter() - t0)

        # the close
        _configure_tax(
            p,
            base_latency_s=sizes.tax_latency_s,
            per_line_latency_s=0.0,
            spike_probability=0.0,
            error_rate=0.0,
        )
        rtt = baselines.tax_round_trips(
            p.tax.url, lines=min(1000, sizes.lines), samples=bset.tax_samples
        )
        report.details["main_tax_round_trip_s"] = {
            "p50": percentile(rtt, 50),
            "p99": percentile(rtt, 99),
        }
        t0 = time.perf_counter()
        close = _close(
            ctx,
            p,
            cwd,
            MAIN_PERIOD,
            sizes.customers,
            emails=True,
            timeout_s=3600,
            profile_name="close",
        )
        ctx.phase("main: close → last email", time.perf_counter() - t0)
        t0 = time.perf_counter()
        copy_lines = baselines.copy_rate(
            p,
            "invoice_lines",
            "invoice_id IN (SELECT invoice_id FROM invoices WHERE billing_period = %s)",
            (MAIN_PERIOD,),
            repeats=rep,
            warmup=warm,
        )
        ctx.phase("main: COPY invoice_lines baseline", time.perf_counter() - t0)
        requests = _requests_per_customer(
            [sizes.lines] * sizes.customers, p.settings.tax.max_lines_per_request
        )
        concurrency = _concurrency(p.settings, sizes.workers)
        bound = lower_bound(
            lines=close.lines,
            copy_rate=copy_lines.rate,
            requests=requests,
            latency_s=sizes.tax_latency_s,
            concurrency=concurrency,
            invoices=close.invoices,
            relay_rate=relay.rate,
        )
        report.details["main_close"] = {
            "command_s": close.command_s,
            "to_issued_s": close.to_issued,
            "to_email_s": close.to_email,
            "first_request_to_issued_s": close.request_to_issued,
            "lower_bound": {
                "write_s": bound.write_s,
                "tax_s": bound.tax_s,
                "outbox_s": bound.outbox_s,
            },
            "tax_concurrency": concurrency,
            "invoice_lines_copy_rows_per_s": copy_lines.samples,
            "rss_before_mib": close.rss_before_mib,
            "rss_peak_mib": close.rss_peak_mib,
        }
        lb_note = (
            f"first close request → last issued {close.request_to_issued:.2f} s; "
            f"lower bound {bound.describe()}: {close.lines:,} lines at COPY {copy_lines.rate:,.0f} rows/s; "
            f"{sum(requests)} tax requests x {sizes.tax_latency_s * 1000:.0f} ms / {concurrency}; "
            f"{close.invoices} outbox rows at {relay.rate:,.0f} rows/s"
        )
        report.add(
            Row(
                "close",
                f"close → last invoice issued ({size}, tax {sizes.tax_latency_s * 1000:.0f} ms)",
                close.to_issued,
                "s",
                "physical lower bound",
                bound.seconds,
                "s",
                "time",
                "≤ 1.3",
                lb_note,
            )
        )
        serial = ctx.issuance_rates.get(sizes.lines)
        if serial:
            report.add(
                Row(
                    "close",
                    "close → last invoice issued (same)",
                    close.to_issued,
                    "s",
                    f"serial issuance: {close.invoices} invoices at the fencing benchmark's rate",
                    close.invoices / serial,
                    "s",
                    "time",
                    "",
                    f"one connection issuing every invoice: {serial:.1f} invoices/s of "
                    f"{sizes.lines} lines (the INV-<period> counter row is locked only from "
                    f"the number, taken last, to the commit)",
                )
            )
        report.add(
            Row(
                "close",
                "close → last email",
                close.to_email,
                "s",
                "physical lower bound",
                bound.seconds,
                "s",
                "time",
                "≤ 1.3 (+5 s)",
                f"{close.to_email - close.to_issued:.2f} s after the last invoice",
            )
        )
        report.add(
            Row(
                "close",
                "last invoice → last email",
                close.to_email - close.to_issued,
                "s",
                f"Debezium relay of {close.invoices} bare outbox rows",
                close.invoices / relay.rate,
                "s",
                "time",
                "≤ 5 s",
                "relay of bare outbox rows measured at the start of this run",
            )
        )
        report.add(
            Row(
                "close",
                "invoiced lines per second",
                close.lines / close.to_issued,
                "lines/s",
                "COPY same invoice lines into copy of invoice_lines",
                copy_lines.rate,
                "rows/s",
                "rate",
                "",
                f"{close.invoices} invoices, {close.lines:,} lines",
            )
        )
        report.add(
            Row(
                "close",
                "close-period command (scan + markers)",
                close.command_s,
                "s",
                "bare consumer over the same topic",
                produced / bare_rate,
                "s",
                "time",
                "",
                "includes the CLI's start-up",
            )
        )
        report.add(
            Row(
                "memory",
                f"worker RSS peak during the close ({size})",
                close.rss_peak_mib,
                "MiB",
                "worker RSS just before the close",
                close.rss_before_mib,
                "MiB",
                "size",
                "bounded by batch",
                "/proc/<pid>/status VmRSS every 0.25 s",
            )
        )

        # replay dry run vs the bare consumer on the same records
        total = sum(kafka_tools.end_offsets(p.settings, p.topic).values())
        t0 = time.perf_counter()
        command = [
            *invoicing_command(),
            *("replay", MAIN_PERIOD, "--dry-run", "--json", "--no-progress"),
        ]
        replay_profile = None
        if ctx.profile and ctx.py_spy:  # the command run under py-spy (its own process)
            replay_profile = Profile("replay", ctx.out_dir / "profile-replay.txt")
            command = [*py_spy_record(ctx.py_spy, replay_profile.path, ctx.profile_idle), *command]
        replay = run_cli(command, p.env, cwd=cwd, timeout_s=3600)
        ctx.phase("main: replay dry run", time.perf_counter() - t0)
        if replay_profile is not None and replay_profile.path.exists():
            summarize_collapsed(replay_profile.path.read_text(), replay_profile)
            ctx.profiles.append(replay_profile)
        doc = replay.json()
        summary = doc.get("summary", doc)
        read_s = float(summary.get("read_s") or 0)
        elapsed = float(summary.get("elapsed_s") or replay.seconds)
        events = int(summary.get("events_read") or total)
        bare_r = [kafka_tools.bare_count(p.settings, p.topic, total) for _ in range(warm + rep)]
        bare_rr = median([total / s for s in bare_r[warm:]])
        report.details["replay"] = {
            "summary": summary,
            "command_s": replay.seconds,
            "bare_s": bare_r,
        }
        report.add(
            Row(
                "replay",
                f"dry run, whole run ({events:,} events)",
                events / elapsed,
                "ev/s",
                "bare consumer, counting the same records",
                bare_rr,
                "rec/s",
                "rate",
                "≥ 0.5",
                f"{elapsed:.2f} s in all (its own elapsed_s); command {replay.seconds:.2f} s",
            )
        )
        if read_s:
            report.add(
                Row(
                    "replay",
                    "dry run, re-read phase",
                    events / read_s,
                    "ev/s",
                    "bare consumer, counting the same records",
                    bare_rr,
                    "rec/s",
                    "rate",
                    "",
                    f"read_s {read_s:.2f}",
                )
            )


def _focus(ctx: Context, p: Pipeline, cwd: Path, sizes: MainSizes) -> None:
    """The FOCUS import against a bare producer of the same records: both ``warmup +
    repeats`` times, alternated (import, then bare producer), each import into a topic
    of its own; each figure is the median of its runs after the warm-up."""
    bset, report = ctx.bset, ctx.report
    path = cwd / "focus.csv"
    load.write_focus_csv(
        path,
        rows=sizes.focus_rows,
        accounts=sizes.focus_accounts,
        prefix=p.unique + "f",
        period=FOCUS_PERIOD,
    )
    bare_topic = p.settings.kafka.topic_prefix + "focus-bare.billing.account-events.v1"
    kafka_tools.create_topic(p.settings, bare_topic)
    elapsed: list[float] = []
    commands: list[float] = []
    bare: list[float] = []
    records: list[Any] = []
    events = rows = 0
    for run in range(bset.warmup + bset.repeats):
        prefix = f"{p.settings.kafka.topic_prefix}focus{run}."
        topic = prefix + "billing.account-events.v1"
        kafka_tools.create_topic(p.settings, topic)
        result = run_cli(
            [*invoicing_command(), "import", "focus", str(path), "--json", "--no-progress"],
            {**p.env, "INVOICING_KAFKA__TOPIC_PREFIX": prefix},
            cwd=cwd,
            timeout_s=3600,
        )
        summary = result.json()
        events = int(summary["produced"]) + int(summary["customers_produced"])
        rows = int(summary["rows"])
        elapsed.append(float(summary["elapsed_s"]))
        commands.append(result.seconds)
        if not records:
            records = kafka_tools.read_records(p.settings, topic, events)
        bare.append(kafka_tools.produce(p.settings, bare_topic, records)[1])
    import_s = median(elapsed[bset.warmup :])
    bare_rate = median([events / s for s in bare[bset.warmup :]])
    report.details["focus_import"] = {
        "rows": rows,
        "events": events,
        "elapsed_s": elapsed,
        "command_s": commands,
        "bare_producer_s": bare,
    }
    report.add(
        Row(
            "FOCUS import",
            f"invoicing import focus ({sizes.focus_rows:,} rows)",
            events / import_s,
            "ev/s",
            "bare producer, same records + config",
            bare_rate,
            "ev/s",
            "rate",
            "≥ 0.5",
            f"{rows / import_s:,.0f} rows/s; importer's elapsed_s {[round(s, 2) for s in elapsed]}"
            f" (first = warm-up, alternated with the bare producer's {[round(s, 2) for s in bare]})",
        )
    )


def _fencing(ctx: Context, sizes: FencingSizes) -> None:
    bset, report = ctx.bset, ctx.report
    settings = ctx.settings
    with (
        migrated_database(settings, "fence", ctx.out_dir) as database,
        psycopg.connect(settings.postgres.dsn("owner", database=database)) as conn,
    ):
        for lines in sizes.lines:
            count = max(20, min(sizes.invoices, 20_000 // max(1, lines)))
            blocks = 2 * (bset.warmup + bset.repeats)
            fixture = prepare_fencing(conn, count=count * blocks, lines=lines, unique=new_unique())
            drafts = iter(fixture.drafts)
            fenced: list[float] = []
            unfenced: list[float] = []
            for b in range(bset.warmup + bset.repeats):
                # one block = `count` pairs, each pair one fenced and one unfenced
                # issuance in alternating order, so drift and neighbours' load hit both
                spent = {True: 0.0, False: 0.0}
                for i in range(count):
                    for with_fence in (True, False) if i % 2 == 0 else (False, True):
                        token = fixture.token if with_fence else None
                        t0 = time.perf_counter()
                        issue_invoice(conn, next(drafts), token, fixture.invoices_topic)
                        spent[with_fence] += time.perf_counter() - t0
                if b >= bset.warmup:
                    fenced.append(count / spent[True])
                    unfenced.append(count / spent[False])
            ctx.issuance_rates[lines] = median(fenced)
            report.details.setdefault("fencing", {})[str(lines)] = {
                "invoices_per_block": count,
                "fenced": fenced,
                "unfenced": unfenced,
            }
            report.add(
                Row(
                    "fencing",
                    f"issuance txn with fence check ({lines} lines/invoice)",
                    median(fenced),
                    "inv/s",
                    "same transaction without the check",
                    median(unfenced),
                    "inv/s",
                    "rate",
                    "≥ 0.97",
                    f"{count} invoices each way per block, fenced and unfenced interleaved one by one, median of {bset.repeats} blocks",
                )
            )


# --------------------------------------------------------------------------- latency


def run_latency(ctx: Context, sizes: LinearSizes) -> None:
    bset, report = ctx.bset, ctx.report
    with _sandbox(ctx, "latency") as (p, cwd):
        unique = p.unique
        # 1. idle pipeline: one customer, one close at a time
        _configure_tax(p, base_latency_s=sizes.idle_tax_latency_s, per_line_latency_s=0.0)
        rtt = baselines.tax_round_trips(
            p.tax.url, lines=min(1000, sizes.idle_lines), samples=bset.tax_samples
        )
        started = _start_workers(p, 1, 1)
        _wait_claimed(p, started)
        closes = sizes.idle_warmup + sizes.idle_closes
        periods = [f"{2021 + i // 12}-{i % 12 + 1:02d}" for i in range(closes)]
        customer = f"{unique}-idle"

        def idle_records() -> Iterator[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
            for period in periods:  # customer.upserted again per period: same id, a no-op
                yield from load.usage_for([customer], period, sizes.idle_lines)

        kafka_tools.produce(p.settings, p.topic, idle_records())
        _wait_stored(
            p,
            rows_where="customer_id = %s",
            params=(customer,),
            rows=closes * sizes.idle_lines,
            timeout_s=600,
        )
        to_email: list[float] = []
        to_issued: list[float] = []
        cmd_to_email: list[float] = []
        t0 = time.perf_counter()
        for i, period in enumerate(periods):
            c = _close(ctx, p, cwd, period, 1, emails=True, timeout_s=300)
            if i >= sizes.idle_warmup:
                to_email.append((c.last_email or math.nan) - c.first_request)
                to_issued.append(c.last_issued - c.first_request)
                cmd_to_email.append(c.to_email)
        ctx.phase(f"latency: {closes} idle closes", time.perf_counter() - t0)
        report.details["idle"] = {
            "close_request_to_email_s": to_email,
            "close_request_to_issued_s": to_issued,
            "command_start_to_email_s": cmd_to_email,
            "tax_round_trip_s": rtt,
        }
        n = len(to_email)
        rt50, rt99 = percentile(rtt, 50), percentile(rtt, 99)
        tag = f"1 customer x {sizes.idle_lines} lines, {n} closes"
        for label, values, target in (
            ("close request → email", to_email, "p99 ≤ 1.5 s"),
            ("close request → issued", to_issued, ""),
            ("close command start → email", cmd_to_email, ""),
        ):
            report.add(
                Row(
                    "idle latency",
                    f"{label} p50 ({tag})",
                    percentile(values, 50),
                    "s",
                    f"fake tax round trip p50 ({min(1000, sizes.idle_lines)} lines)",
                    rt50,
                    "s",
                    "time",
                    "",
                )
            )
            report.add(
                Row(
                    "idle latency",
                    f"{label} p99",
                    percentile(values, 99),
                    "s",
                    "fake tax round trip p99",
                    rt99,
                    "s",
                    "time",
                    target,
                    "nearest-rank p99 (of 20: the largest)"
                    if label.startswith("close request → email")
                    else "",
                )
            )

        # 2. one partition, one worker
        _stop_workers(p)
        prows = sizes.partition_rows
        pcustomers = load.customer_ids(unique + "p", max(1, prows // 500))
        per = max(1, prows // len(pcustomers))
        produced, _ = kafka_tools.produce(
            p.settings, p.topic, load.usage_for(pcustomers, PARTITION_PERIOD, per), partition=0
        )
        stored_rows = per * len(pcustomers)
        bare_s = [
            kafka_tools.bare_count(p.settings, p.topic, produced, partitions=[0])
            for _ in range(bset.warmup + bset.repeats)
        ]
        bare_rate = median([produced / s for s in bare_s[bset.warmup :]])
        started = _start_workers(p, 1, 0)
        claimed = _wait_claimed(p, started)
        done = _wait_stored(
            p,
            rows_where="billing_period = %s",
            params=(PARTITION_PERIOD,),
            rows=stored_rows,
            timeout_s=1800,
        )
        seconds = done - claimed
        copy = baselines.copy_rate(
            p,
            "usage_lines",
            "billing_period = %s",
            (PARTITION_PERIOD,),
            repeats=bset.repeats,
            warmup=bset.warmup,
        )
        report.details["partition"] = {
            "rows": stored_rows,
            "seconds": seconds,
            "bare_s": bare_s,
            "copy": copy.samples,
        }
        report.add(
            Row(
                "one partition",
                f"usage stored, 1 partition, 1 worker ({stored_rows:,} rows)",
                stored_rows / seconds,
                "rows/s",
                "COPY same rows into copy of usage_lines",
                copy.rate,
                "rows/s",
                "rate",
                "",
                "the unit of docs/scaling.md",
            )
        )
        report.add(
            Row(
                "one partition",
                "records consumed, 1 partition, 1 worker",
                produced / seconds,
                "rec/s",
                "bare consumer on that partition, counting",
                bare_rate,
                "rec/s",
                "rate",
                "",
            )
        )

        # 3. linearity: C x L against C x 10L, tax latency 0
        _configure_tax(p, base_latency_s=sizes.linear_tax_latency_s, per_line_latency_s=0.0)
        c1 = load.customer_ids(unique + "l1", sizes.linear_customers)
        c2 = load.customer_ids(unique + "l2", sizes.linear_customers)
        n1, n2 = sizes.linear_lines, sizes.linear_lines * 10

        def linear_records() -> Iterator[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
            yield from load.usage_for(c1, LINEAR_PERIODS[0], n1, seed=2)
            yield from load.usage_for(c2, LINEAR_PERIODS[1], n2, seed=3)

        kafka_tools.produce(p.settings, p.topic, linear_records())
        _wait_stored(
            p,
            rows_where="billing_period = ANY(%s)",
            params=(list(LINEAR_PERIODS),),
            rows=sizes.linear_customers * (n1 + n2),
            timeout_s=3600,
        )
        t0 = time.perf_counter()
        small = _close_backlog(p, cwd, LINEAR_PERIODS[0], sizes.linear_customers)
        large = _close_backlog(p, cwd, LINEAR_PERIODS[1], sizes.linear_customers)
        ctx.phase("latency: linearity closes", time.perf_counter() - t0)
        report.details["linearity"] = {"small": small, "large": large}
        report.add(
            Row(
                "linearity",
                f"close, {sizes.linear_customers} x {n2} lines (markers queued; worker start → last issued)",
                large["seconds"],
                "s",
                f"10 x the close of {sizes.linear_customers} x {n1}",
                10 * small["seconds"],
                "s",
                "time",
                "≤ 1.1 (11x)",
                f"{large['seconds'] / small['seconds']:.2f}x the time for 10x the lines; the markers "
                "are on the topic before the worker starts, so close-period's pacing is out; "
                f"tax latency {sizes.linear_tax_latency_s * 1000:.0f} ms",
            )
        )
        report.add(
            Row(
                "memory",
                f"worker RSS peak, close of {sizes.linear_customers} x {n2}",
                large["rss_peak_mib"],
                "MiB",
                f"same, close of {sizes.linear_customers} x {n1}",
                small["rss_peak_mib"],
                "MiB",
                "size",
                "≈ 1 (bounded by batch)",
                "/proc/<pid>/status VmRSS every 0.25 s",
            )
        )


# --------------------------------------------------------------------------- incident


def incident_lines(sizes: IncidentSizes) -> list[int]:
    rng = random.Random(sizes.seed)
    large = round(sizes.customers * sizes.large_share)
    counts = [sizes.large_lines] * large + [
        rng.randint(*sizes.small_lines) for _ in range(sizes.customers - large)
    ]
    rng.shuffle(counts)
    return counts


def run_incident(ctx: Context, sizes: IncidentSizes) -> None:
    bset, report = ctx.bset, ctx.report
    many, one = sizes.workers
    with _sandbox(ctx, "incident") as (p, cwd):
        unique = p.unique
        counts = incident_lines(sizes)
        relay = baselines.debezium_relay(
            p, rows=sizes.customers, repeats=bset.repeats, warmup=bset.warmup
        )
        ca = load.customer_ids(unique + "a", sizes.customers)
        cb = load.customer_ids(unique + "b", sizes.customers)

        def records() -> Iterator[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
            yield from load.usage_for(ca, INCIDENT_PERIODS[0], counts, seed=4)
            yield from load.usage_for(cb, INCIDENT_PERIODS[1], counts, seed=5)

        t0 = time.perf_counter()
        kafka_tools.produce(p.settings, p.topic, records())
        ctx.phase("incident: produce", time.perf_counter() - t0)
        _configure_tax(
            p,
            base_latency_s=sizes.tax_latency_s,
            per_line_latency_s=0.0,
            spike_probability=sizes.spike_probability,
            spike_latency_s=sizes.spike_latency_s,
            seed=sizes.seed,
        )
        results = {}
        for workers, period in ((many, INCIDENT_PERIODS[0]), (one, INCIDENT_PERIODS[1])):
            _stop_workers(p)
            started = _start_workers(p, workers, 1)
            claimed = _wait_claimed(p, started)
            time.sleep(3)  # the last members' incremental assignments settle
            done = _wait_stored(
                p,
                rows_where="billing_period = ANY(%s)",
                params=(list(INCIDENT_PERIODS),),
                rows=2 * sum(counts),
                timeout_s=3600,
            )
            ctx.phase(
                f"incident: {workers} workers ingest (after claims)", max(0.0, done - claimed)
            )
            t0 = time.perf_counter()
            results[workers] = _close(
                ctx, p, cwd, period, sizes.customers, emails=True, timeout_s=3600
            )
            ctx.phase(f"incident: {workers} workers close → last email", time.perf_counter() - t0)
        copy_lines = baselines.copy_rate(
            p,
            "invoice_lines",
            "invoice_id IN (SELECT invoice_id FROM invoices WHERE billing_period = %s)",
            (INCIDENT_PERIODS[0],),
            repeats=bset.repeats,
            warmup=bset.warmup,
        )
        requests = _requests_per_customer(counts, p.settings.tax.max_lines_per_request)
        expected_spike = sum(requests) * sizes.spike_probability * sizes.spike_latency_s
        report.details["incident"] = {
            "lines_total": sum(counts),
            "requests": sum(requests),
            "relay": relay.samples,
            "copy": copy_lines.samples,
        }
        shape = (
            f"{sizes.customers} customers, {round(sizes.customers * sizes.large_share)} with "
            f"{sizes.large_lines:,} lines, tax {sizes.tax_latency_s * 1000:.0f} ms + spikes"
        )
        for workers in (many, one):
            r = results[workers]
            conc = _concurrency(p.settings, workers)
            bound = lower_bound(
                lines=r.lines,
                copy_rate=copy_lines.rate,
                requests=requests,
                latency_s=sizes.tax_latency_s,
                concurrency=conc,
                invoices=r.invoices,
                relay_rate=relay.rate,
            )
            report.details["incident"][f"{workers}_workers"] = {
                "to_issued_s": r.to_issued,
                "to_email_s": r.to_email,
                "command_s": r.command_s,
                "bound": {
                    "write_s": bound.write_s,
                    "tax_s": bound.tax_s,
                    "outbox_s": bound.outbox_s,
                },
                "rss_peak_mib": r.rss_peak_mib,
            }
            report.add(
                Row(
                    "incident",
                    f"{workers} workers: close → last email ({shape})",
                    r.to_email,
                    "s",
                    "physical lower bound (no spikes)",
                    bound.seconds,
                    "s",
                    "time",
                    "",
                    f"{bound.describe()}; {sum(requests)} requests / {conc}; spikes add ≈ {expected_spike / conc:.1f} s of tax time spread over the concurrency",
                )
            )
            report.add(
                Row(
                    "incident",
                    f"{workers} workers: close → last invoice issued",
                    r.to_issued,
                    "s",
                    "physical lower bound (no spikes)",
                    bound.seconds,
                    "s",
                    "time",
                    "",
                )
            )
        report.add(
            Row(
                "incident",
                f"{many} workers against {one}: close → last email",
                results[many].to_email,
                "s",
                f"same with {one} worker",
                results[one].to_email,
                "s",
                "time",
                "",
                "ratio < 1: the workers' speed-up",
            )
        )
