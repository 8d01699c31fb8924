"""``python -m benchmarks``: same-run benchmarks of the pipeline against physical baselines.

    .venv/bin/python -m benchmarks run --set smoke|standard|month-end|incident \\
        [--json reports/bench-<ts>.json] [--repeat N] [--profile] [--customers C --lines L]
    .venv/bin/python -m benchmarks sets          # the sets and their sizes
    .venv/bin/python -m benchmarks usage-view ingest|freshness|memory [options]   # docs/benchmarks.md
    .venv/bin/python -m benchmarks markdown reports/bench-….json   # runs as markdown tables

The local stack must be up (``invoicing stack up``; ``source .ports.env`` first in a
worktree): the command checks PostgreSQL, Kafka, Connect and Redis and exits 2
naming what is missing. Prints one table per run (every figure beside its baseline
measured in the same run, and their ratio) and writes JSON (default
``reports/bench-<set>-<UTC timestamp>.json``). Asserts nothing about speed.
Exit codes: 0 done; 1 a scenario failed; 2 the stack is not up.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import redis
from confluent_kafka.admin import AdminClient
from rich.console import Console

from benchmarks import scenarios
from benchmarks.measure import BenchError
from benchmarks.product import Settings, base_settings
from benchmarks.report import (
    RunReport,
    machine_notes,
    markdown,
    markdown_compare,
    print_report,
    write_json,
)
from benchmarks.sets import SETS, BenchSet

HOME = Path(__file__).resolve().parent.parent


class StackDown(RuntimeError):
    """A service of the local stack does not answer."""


def check_stack(settings: Settings) -> None:
    """PostgreSQL, Kafka, Connect and Redis answer.

    Raises:
        StackDown: naming every service that did not.
    """
    problems = []
    try:
        with psycopg.connect(settings.postgres.dsn("owner"), connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        problems.append(f"postgres ({settings.postgres.host}:{settings.postgres.port}): {exc}")
    try:
        AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers}).list_topics(timeout=5)
    except Exception as exc:
        problems.append(f"kafka ({settings.kafka.bootstrap_servers}): {exc}")
    try:
        httpx.get(settings.connect.url, timeout=5, trust_env=False).raise_for_status()
    except httpx.HTTPError as exc:
        problems.append(f"connect ({settings.connect.url}): {exc}")
    try:
        redis.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=5).ping()
    except redis.RedisError as exc:
        problems.append(f"redis: {exc}")
    if problems:
        raise StackDown(
            "the local stack is not up (run `invoicing stack up`; in a worktree "
            "`source .ports.env` first):\n  " + "\n  ".join(problems)
        )


def run_set(
    report: RunReport,
    bset: BenchSet,
    settings: Settings,
    console: Console,
    *,
    out_dir: Path,
    profile: bool,
    profile_idle: bool = False,
) -> RunReport:
    """One run of every scenario of ``bset`` into ``report`` (rows added as measured,
    so a failed run keeps the rows it got)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if profile and not Path(py_spy).exists():
        raise BenchError("--profile needs py-spy (pip install -e '.[dev]')")
    ctx = scenarios.Context(
        settings, bset, report, console, out_dir, profile, py_spy, profile_idle=profile_idle
    )
    started = time.perf_counter()
    try:
        if bset.main is not None:
            scenarios.run_main(ctx, bset.main)
        if bset.linear is not None:
            scenarios.run_latency(ctx, bset.linear)
        if bset.incident is not None:
            scenarios.run_incident(ctx, bset.incident)
    finally:
        report.wall_s = time.perf_counter() - started
        if ctx.profiles:
            report.details["profiles"] = {
                p.name: {"samples": p.samples, "path": str(p.path), "top": p.lines(20)}
                for p in ctx.profiles
            }
    return report


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario set")
    run.add_argument("--set", dest="set_name", choices=sorted(SETS), default="smoke")
    run.add_argument(
        "--json",
        dest="json_path",
        type=Path,
        default=None,
        help="where to write the JSON report (default reports/bench-<set>-<ts>.json)",
    )
    run.add_argument("--repeat", type=int, default=1, help="run the whole set N times (default 1)")
    run.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the invoicing worker during the main ingest and close, and the replay command",
    )
    run.add_argument(
        "--profile-idle",
        action="store_true",
        help="as --profile, idle threads sampled too: where the wall clock goes, waits included",
    )
    run.add_argument(
        "--only", default=None, help="comma-separated scenario groups to run: main,latency,incident"
    )
    run.add_argument("--customers", type=int, default=None, help="override the main customers")
    run.add_argument("--lines", type=int, default=None, help="override the main lines per customer")
    view = sub.add_parser(
        "usage-view",
        help="the usage view and the ingest edge (docs/benchmarks.md): ingest vs a bare producer, "
        "freshness p50/p99 idle and under load, memory of one instance",
        add_help=False,
    )
    view.add_argument("view_args", nargs=argparse.REMAINDER)
    sub.add_parser("sets", help="print the sets and their sizes")
    md = sub.add_parser("markdown", help="print JSON reports' runs as markdown tables")
    md.add_argument("reports", type=Path, nargs="+")
    md.add_argument("--compare", action="store_true", help="one table, the runs side by side")
    args, extra = parser.parse_known_args(argv)
    if args.command == "usage-view":
        from benchmarks import bench_usage_view

        bench_usage_view.main([*args.view_args, *extra], prog="python -m benchmarks usage-view")
        return 0
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    console = Console(stderr=True)
    # wide enough for the table when stdout is a file or a pipe (CI, tee)
    out = Console() if sys.stdout.isatty() else Console(width=250)

    if args.command == "markdown":
        documents = [json.loads(path.read_text()) for path in args.reports]
        if args.compare:
            print(markdown_compare(documents), end="")
        else:
            print("\n".join(markdown(doc) for doc in documents), end="")
        return 0
    if args.command == "sets":
        out.print_json(json.dumps({name: asdict(s) for name, s in SETS.items()}))
        return 0

    # SIGTERM unwinds like Ctrl-C, so every sandbox is torn down (workers, connector, database)
    signal.signal(signal.SIGTERM, _interrupt)
    bset = SETS[args.set_name].with_main_size(args.customers, args.lines)
    if args.only:
        bset = bset.only(set(args.only.split(",")))
    settings = base_settings()
    try:
        check_stack(settings)
    except StackDown as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path: Path = args.json_path or HOME / "reports" / f"bench-{bset.name}-{stamp}.json"
    out_dir = json_path.parent / f"{json_path.stem}-files"
    document: dict[str, Any] = {
        "set": bset.name,
        "machine": machine_notes(HOME),
        "command": " ".join(
            ["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])]
        ),
        "runs": [],
    }
    status = 0
    for i in range(args.repeat):
        console.rule(f"{bset.name}: run {i + 1} of {args.repeat}")
        report = RunReport(bset.name, asdict(bset))
        try:
            run_set(
                report,
                bset,
                settings,
                console,
                out_dir=out_dir,
                profile=args.profile or args.profile_idle,
                profile_idle=args.profile_idle,
            )
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: keep what was measured, stop
            document["runs"].append({**report.to_dict(), "error": f"interrupted ({exc})"})
            write_json(json_path, document)
            console.print(f"[red]interrupted; partial report: {json_path}[/]")
            return 130
        except Exception as exc:  # a failed run is reported with its rows, then the next runs
            if not isinstance(exc, BenchError):
                console.print_exception()
            console.print(f"[red]run {i + 1} failed: {exc}[/]")
            document["runs"].append({**report.to_dict(), "error": str(exc)})
            print_report(report, out)
            status = 1
            write_json(json_path, document)
            continue
        document["runs"].append(report.to_dict())
        print_report(report, out)
        for profile in report.details.get("profiles", {}).values():
            for line in profile["top"]:
                out.print(line, markup=False, highlight=False)
        write_json(json_path, document)
    console.print(f"JSON report: {json_path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
