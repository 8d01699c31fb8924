"""Benchmark: the close of C customers x L lines under worker configurations, alternated
in one sandbox, so that their figures come from the same box, stack and moment.

For each round (configurations in turn, ``--rounds`` times each): the invoicing worker
processes (``--workers``) are (re)started with the configuration's environment (``NAME=VALUE`` overrides of the
settings, e.g. ``INVOICING_WORKER__MARKERS_IN_FLIGHT=1``), the usage of a billing
period of its own is produced and stored, then ``invoicing close-period`` runs with the
fake tax at ``--tax-ms`` per request. Printed per round: the 1-minute load average at
the close's start, close command start → last invoice issued, first close request →
last issued, the command's own time, and the CPU seconds the box's processes used
meanwhile (by process name, from ``/proc/<pid>/stat``); then the median per
configuration. Nothing is
asserted about speed.

    .venv/bin/python -m benchmarks.bench_close_ab --customers 200 --lines 250 \\
        --config one=INVOICING_WORKER__MARKERS_IN_FLIGHT=1 --config four= --rounds 3

Needs the local stack (``invoicing stack up``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import kafka_tools, load
from benchmarks.measure import run_cli, wait_until
from benchmarks.product import Settings, invoicing_command, new_unique, sandbox
from benchmarks.scenarios import _configure_tax, _one, _stop_workers, _wait_claimed, _wait_stored


def cpu_ticks() -> dict[int, tuple[str, int]]:
    """Every process's CPU time so far (user + system, clock ticks), by pid: (name, ticks)."""
    found: dict[int, tuple[str, int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        if name.startswith("python"):  # which Python: its module or command
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                argv = []
            words = [a.decode(errors="replace") for a in argv[1:4] if a and a != b"-m"]
            name = f"python {' '.join(words)}"[:48]
        fields = text[text.rindex(")") + 2 :].split()
        found[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))
    return found


def cpu_used(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> str:
    """The CPU seconds each kind of process used between two :func:`cpu_ticks`."""
    hz = os.sysconf("SC_CLK_TCK")
    by_name: dict[str, int] = {}
    for pid, (name, ticks) in after.items():
        used = ticks - before.get(pid, (name, 0))[1]
        if used > 0:
            by_name[name] = by_name.get(name, 0) + used
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:6]
    return ", ".join(f"{name} {ticks / hz:.2f}" for name, ticks in top)


#: One billing period per round (in the past, and not the harness's).
PERIODS = tuple(f"{year}-{month:02d}" for year in (2022, 2021) for month in range(1, 13))


def _config(text: str) -> tuple[str, dict[str, str]]:
    """``name=VAR=VALUE,VAR=VALUE`` (or ``name=`` for the defaults)."""
    name, _, rest = text.partition("=")
    env = dict(item.split("=", 1) for item in rest.split(",") if item)
    return name, env


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--lines", type=int, default=250)
    parser.add_argument("--tax-ms", type=float, default=50.0)
    parser.add_argument("--workers", type=int, default=1, help="invoicing worker processes")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--config", action="append", type=_config, required=True)
    parser.add_argument("--keep-logs", type=Path, help="copy each round's worker logs here")
    args = parser.parse_args()
    if len(PERIODS) < args.rounds * len(args.config):
        parser.error(f"at most {len(PERIODS)} rounds in all")
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name, _ in args.config}
    with (
        tempfile.TemporaryDirectory(prefix="bench-close-ab-") as tmp,
        sandbox(Settings(), new_unique(), Path(tmp)) as p,
    ):
        _configure_tax(
            p,
            base_latency_s=args.tax_ms / 1000,
            per_line_latency_s=0.0,
            spike_probability=0.0,
            error_rate=0.0,
        )
        customers = load.customer_ids(p.unique, args.customers)
        periods = iter(PERIODS)
        for n in range(args.rounds):
            for name, env in args.config:
                period = next(periods)
                _stop_workers(p)
                started = time.time()
                p.workers.start("invoicing", args.workers, extra_env=env)
                _wait_claimed(p, started)
                kafka_tools.produce(
                    p.settings, p.topic, load.usage_for(customers, period, args.lines)
                )
                _wait_stored(
                    p,
                    rows_where="billing_period = %s",
                    params=(period,),
                    rows=args.customers * args.lines,
                    timeout_s=3600,
                )
                time.sleep(2)  # the ingest's tail (commits, the connector) settles
                load1 = os.getloadavg()[0]
                cpu_before = cpu_ticks()
                result = run_cli(
                    [*invoicing_command(), "close-period", period, "--no-progress", "--json"],
                    p.env,
                    cwd=Path(tmp),
                    timeout_s=3600,
                )
                with p.connect() as conn:

                    def issued(period: str = period) -> bool:
                        count = _one(
                            conn,
                            "SELECT count(*) FROM invoices WHERE billing_period = %s",
                            (period,),
                        )
                        return bool(int(count) >= args.customers)

                    wait_until(f"the invoices of {period}", issued, timeout_s=3600)
                    cpu = cpu_used(cpu_before, cpu_ticks())
                    last = float(
                        _one(
                            conn,
                            "SELECT extract(epoch FROM max(issued_at))::float8 FROM invoices "
                            "WHERE billing_period = %s",
                            (period,),
                        )
                    )
                    first = float(
                        _one(
                            conn,
                            "SELECT extract(epoch FROM min(requested_at))::float8 "
                            "FROM close_requests WHERE billing_period = %s",
                            (period,),
                        )
                    )
                figures = (last - result.started, last - first, result.seconds)
                results[name].append(figures)
                print(
                    f"round {n + 1} {name:>10}: load {load1:4.2f}  close → last invoice "
                    f"{figures[0]:6.3f} s  first request → last invoice {figures[1]:6.3f} s  "
                    f"command {figures[2]:5.3f} s",
                    flush=True,
                )
                print(f"    CPU seconds from the close's start to its last invoice: {cpu}")
                if args.keep_logs:
                    args.keep_logs.mkdir(parents=True, exist_ok=True)
                    for worker in p.workers.processes:
                        target = args.keep_logs / f"{n + 1}-{name}-{worker.log.name}"
                        target.write_bytes(worker.log.read_bytes())
    for name, rows in results.items():
        print(
            f"median {name:>10}: close → last invoice "
            f"{statistics.median(r[0] for r in rows):6.3f} s  first request → last invoice "
            f"{statistics.median(r[1] for r in rows):6.3f} s  ({len(rows)} rounds)"
        )


if __name__ == "__main__":
    main()
