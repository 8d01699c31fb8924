"""``invoicing drill --mode naive|safe``: the incident of docs/design.md "The incident" at
compressed time.

The runs are :mod:`streams.devtools.drill` (:func:`streams.devtools.drill.run.run_drill`). Heavy
imports happen inside the command, so ``invoicing --help`` stays fast.

Exit status: 0 when the mode's expectation holds (naive: duplicates, the
reproduction; safe: none), 1 when it does not, 2 when the run could not
complete (:class:`streams.devtools.drill.DrillError`: a timeout, a dead worker).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from streams.devtools.drill.run import DrillMode
from streams.entrypoints.common import configure_logging, exit_on, settings_of


def drill_command(
    ctx: typer.Context,
    mode: Annotated[
        DrillMode,
        typer.Option(
            "--mode",
            help="naive: the design that failed (expects duplicates); safe: the pipeline "
            "(expects none).",
        ),
    ],
    customers: Annotated[int, typer.Option("--customers", min=1, help="Customers.")] = 250,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Worker threads (naive) or processes (safe).")
    ] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Makes the customer set deterministic.")] = 1,
    large_share: Annotated[
        float, typer.Option("--large-share", min=0.0, max=1.0, help="Share of large customers.")
    ] = 0.10,
    large_lines: Annotated[
        tuple[int, int], typer.Option("--large-lines", help="MIN MAX usage lines of a large one.")
    ] = (1000, 3000),
    small_lines: Annotated[
        tuple[int, int], typer.Option("--small-lines", help="MIN MAX usage lines of a small one.")
    ] = (5, 50),
    lock_ttl: Annotated[
        float, typer.Option("--lock-ttl", help="naive: lock expiry, seconds.")
    ] = 4.0,
    max_poll_interval_ms: Annotated[
        int,
        typer.Option("--max-poll-interval-ms", help="safe: max.poll.interval.ms (>= 6000)."),
    ] = 6000,
    base_latency: Annotated[
        float, typer.Option("--tax-base-latency", help="Tax: seconds per request.")
    ] = 0.001,
    per_line_latency: Annotated[
        float, typer.Option("--tax-per-line-latency", help="Tax: seconds per line.")
    ] = 0.0025,
    spike_probability: Annotated[
        float, typer.Option("--tax-spike-probability", help="Tax: share of slow requests.")
    ] = 0.001,
    spike_latency: Annotated[
        float, typer.Option("--tax-spike-latency", help="Tax: extra seconds of a slow request.")
    ] = 1.0,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Fail the run after this many seconds.")
    ] = 900.0,
    workdir: Annotated[
        Path | None,
        typer.Option("--workdir", help="Logs, Maildir, tax records (default .local/drill/…)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Also print the report as JSON.")
    ] = False,
) -> None:
    """Reproduce the double-invoicing incident (naive) or show the pipeline prevents it (safe)."""
    from streams import bootstrap
    from streams.devtools.drill import DrillError
    from streams.devtools.drill.config import DrillConfig
    from streams.devtools.drill.run import run_drill
    from streams.devtools.sandbox.smtp import SmtpSinkError
    from streams.devtools.stack.fake_tax import FakeTaxConfig

    console = Console(stderr=True)
    out = Console(width=max(Console().width, 110))
    configure_logging("WARNING")
    settings = settings_of(ctx)
    config = DrillConfig(
        customers=customers,
        large_share=large_share,
        large_lines=large_lines,
        small_lines=small_lines,
        workers=workers,
        seed=seed,
        lock_ttl_s=lock_ttl,
        max_poll_interval_ms=max_poll_interval_ms,
        session_timeout_ms=min(6000, max_poll_interval_ms),
        tax=FakeTaxConfig(
            base_latency_s=base_latency,
            per_line_latency_s=per_line_latency,
            spike_probability=spike_probability,
            spike_latency_s=spike_latency,
            seed=seed,
        ),
        timeout_s=timeout_s,
    )
    run_tag = uuid.uuid4().hex[:6]
    where = workdir or settings.stack.local_dir / "drill" / f"{mode.value}-s{seed}-{run_tag}"
    console.print(
        f"[bold]drill[/] mode={mode.value} seed={seed} run={run_tag} customers={customers} "
        f"(large {config.large_count}, {large_lines[0]}-{large_lines[1]} lines; small "
        f"{small_lines[0]}-{small_lines[1]}) workers={workers} tax: base {base_latency:g} s + "
        f"{per_line_latency:g} s/line, spikes {spike_probability:g} x {spike_latency:g} s; "
        f"files in {where}"
    )

    def say(message: str) -> None:
        console.print(f"[cyan]drill[/]: {message}")

    with exit_on(((DrillError, SmtpSinkError), 2, "drill failed"), to=console):
        report = run_drill(
            mode,
            settings,
            config,
            where,
            run_tag=run_tag,
            clients=bootstrap.drill_clients(),
            progress=say,
        )
    out.print(report.table())
    verdict = "[green]holds[/]" if report.ok else "[red]does NOT hold[/]"
    out.print(f"expectation ({report.expectation}): {verdict}")
    if json_out:
        out.print_json(json.dumps(report.to_dict()))
    if not report.ok:
        raise typer.Exit(1)
