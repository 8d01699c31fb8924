"""``invoicing demo``: the main job on the bundled FOCUS sample (:mod:`streams.devtools.demo`), or the
pricing scenario (``--scenario pricing``, :mod:`streams.devtools.demo.pricing`); ``invoicing
generate-events``: the pricing scenario's events to a file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from streams.entrypoints.common import configure_logging, console, exit_on, out, settings_of

if TYPE_CHECKING:
    from streams.devtools.demo.lifecycle import LifecycleReport
    from streams.devtools.demo.pricing.run import PricingReport
    from streams.devtools.demo.run import DemoReport

SCENARIOS = ("focus", "pricing", "lifecycle", "drafts")


def demo_command(
    ctx: typer.Context,
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="focus: the bundled FOCUS 1.0 sample (pre-priced usage); pricing: the API "
            "platform's month (price book, subscriptions, metered usage); lifecycle: an "
            "invoice's life after the close (a partial credit note, a void, their emails); "
            "drafts: two drafts finalised, one by command, one by its grace period's end.",
        ),
    ] = "focus",
    path: Annotated[
        Path | None, typer.Option("--file", help="FOCUS 1.0 CSV (default: the bundled sample).")
    ] = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="Invoicing worker processes.")
    ] = 3,
    timeout_s: Annotated[
        float, typer.Option("--timeout", help="Seconds to wait for every invoice and email.")
    ] = 600.0,
    customers: Annotated[
        int, typer.Option("--customers", min=1, help="pricing: how many customers.")
    ] = 30,
    seed: Annotated[int, typer.Option("--seed", help="pricing: the generator's seed.")] = 1,
    period: Annotated[
        str, typer.Option("--period", help="pricing: the billing period YYYY-MM.")
    ] = "2024-11",
) -> None:
    """The main job end to end, reconciled against an answer computed independently.

    focus (default): stack up, import the FOCUS sample, invoice and email it, reconcile
    each (account, month) with round(Σ BilledCost). pricing: stack up, publish
    examples/pricing/price-book.yaml, produce the generated month of N customers, close it,
    invoice and email it, reconcile every invoice and line with the independent answer.
    lifecycle: two new customers invoiced, then a partial credit note on one and a void
    of the other, each emailed exactly once.

    Exit 1 on a mismatch, a missing or held invoice, or a missing or duplicate email.
    """
    from streams import bootstrap

    if scenario not in SCENARIOS:
        console.print(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
        raise typer.Exit(2)
    configure_logging("WARNING")
    settings = settings_of(ctx)
    if scenario == "drafts":
        from streams.devtools.demo.drafts import run_drafts_demo

        drafts = run_drafts_demo(
            settings,
            clients=bootstrap.drafts_demo_clients(),
            timeout_s=min(timeout_s, 180.0),
            console=console,
        )
        table = Table(title="invoicing demo: drafts and finalisation")
        table.add_column("")
        for name in drafts.rows:
            table.add_column(name)
        keys = list(dict.fromkeys(key for row in drafts.rows.values() for key in row))
        for key in keys:
            table.add_row(key, *(str(row.get(key, "-")) for row in drafts.rows.values()))
        out.print(table)
        for problem in drafts.problems:
            console.print(f"[red]problem[/]: {problem}")
        out.print(f"drafts demo: {'ok' if drafts.ok else 'FAILED'} in {drafts.seconds:.1f} s")
        if not drafts.ok:
            raise typer.Exit(1)
        return
    if scenario == "pricing":
        from streams.apps.importers import ImporterError
        from streams.devtools.demo.pricing.generator import ScenarioConfig
        from streams.devtools.demo.pricing.run import PricingDemoError, run_pricing_demo

        try:
            config = ScenarioConfig(customers=customers, seed=seed, period=period)
        except ValueError as exc:
            console.print(str(exc))
            raise typer.Exit(2) from exc
        with exit_on((PricingDemoError, 1, "pricing demo failed"), (ImporterError, 1, "import")):
            pricing = run_pricing_demo(
                settings,
                clients=bootstrap.pricing_demo_clients(),
                config=config,
                workers=workers,
                timeout_s=timeout_s,
                console=console,
            )
        print_pricing_report(pricing, out)
        if not pricing.ok:
            raise typer.Exit(1)
        return

    if scenario == "lifecycle":
        from streams.devtools.demo.lifecycle import LifecycleDemoError, run_lifecycle_demo

        with exit_on((LifecycleDemoError, 1, "lifecycle demo failed")):
            lifecycle = run_lifecycle_demo(
                settings,
                clients=bootstrap.lifecycle_demo_clients(),
                timeout_s=timeout_s,
                console=console,
            )
        print_lifecycle_report(lifecycle, out)
        if not lifecycle.ok:
            raise typer.Exit(1)
        return

    from streams.apps.ops.focus_expected import DEFAULT_SAMPLE
    from streams.devtools.demo.run import run_demo

    report = run_demo(
        settings,
        clients=bootstrap.demo_clients(),
        path=path or settings.stack.home / DEFAULT_SAMPLE,
        workers=workers,
        timeout_s=timeout_s,
        console=console,
    )
    print_report(report, out)
    if not report.ok:
        raise typer.Exit(1)


def generate_events_command(
    out_file: Annotated[Path, typer.Argument(help="Where to write the JSON lines.")],
    customers: Annotated[int, typer.Option("--customers", min=1)] = 30,
    seed: Annotated[int, typer.Option("--seed")] = 1,
    period: Annotated[str, typer.Option("--period", help="YYYY-MM")] = "2024-11",
    duplicates_per_mille: Annotated[
        int, typer.Option("--duplicates-per-mille", min=0, max=1000)
    ] = 10,
) -> None:
    """Write the pricing scenario's events (CloudEvents JSON lines) without running anything:
    `invoicing import events FILE` produces them. Same options, same bytes."""
    from streams.devtools.demo.pricing.generator import ScenarioConfig, generate

    try:
        config = ScenarioConfig(customers, seed, period, duplicates_per_mille)
    except ValueError as exc:
        console.print(str(exc))
        raise typer.Exit(2) from exc
    scenario = generate(config)
    scenario.write(out_file)
    kinds = ", ".join(
        f"{scenario.count(kind)} {kind}"
        for kind in sorted({event["type"] for event in scenario.events})
    )
    console.print(
        f"{out_file}: {len(scenario.events)} events ({kinds}; {scenario.duplicates} resent) "
        f"for {customers} customers, {period}, seed {seed}"
    )


def print_report(report: DemoReport, console: Console) -> None:
    """Print the reconciliation per (customer, month), then the summary table."""
    # One line per pair, customer last: account ids are up to ~80 characters long and
    # a bordered table would fold them on an 80-column terminal.
    console.print("reconciliation per (customer, month): round(Σ BilledCost) vs invoice subtotal")
    head = f"{'month':<8} {'Σ BilledCost (exact)':>22} {'rounded':>10} {'subtotal':>10}    customer"
    console.print(head, markup=False, soft_wrap=True)
    for customer, period, exact, want, got in report.pairs:
        verdict = "??" if got is None else ("=" if got == want else "!=")
        shown = "(none)" if got is None else str(got)
        line = f"{period:<8} {exact:>22f} {want!s:>10} {shown:>10} {verdict:>2} {customer}"
        console.print(line, markup=False, soft_wrap=True, highlight=False)
    table = Table(title="invoicing demo: FOCUS 1.0 sample")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("customers invoiced", str(report.customers))
    table.add_row("invoices issued", str(report.invoices))
    table.add_row("emails sent", str(report.emails_sent))
    table.add_row("not emailed (zero total)", str(report.emails_skipped_zero_total))
    table.add_row("not emailed (refused, failed or pending)", str(len(report.emails_not_sent)))
    table.add_row("duplicate emails", str(report.duplicate_emails))
    for currency, total in sorted(report.total_by_currency.items()):
        table.add_row(f"sum of totals ({currency})", f"{total}")
    table.add_row("reconciliation: subtotal = round(Σ BilledCost)", f"{report.matches} match")
    table.add_row("reconciliation: mismatches", str(len(report.mismatches)))
    table.add_row("missing", str(len(report.missing)))
    table.add_row("file rows not reconcilable", str(len(report.unreadable_rows)))
    for name, seconds in report.timings.items():
        table.add_row(f"time: {name}", f"{seconds:.1f} s")
    console.print(table)
    if report.mismatches:
        detail = Table(title="mismatches")
        for col in ("customer", "period", "expected subtotal", "invoice subtotal"):
            detail.add_column(col)
        for customer, period, want, got in report.mismatches:
            detail.add_row(customer, period, str(want), str(got))
        console.print(detail)
    if report.missing:
        console.print(f"[red]missing:[/] {report.missing[:20]}")
    if report.emails_not_sent:
        console.print(f"[red]not emailed:[/] {report.emails_not_sent[:20]}")
    for line_no, reason in report.unreadable_rows[:20]:
        console.print(f"[yellow]file line {line_no}[/]: {reason}")


def print_lifecycle_report(report: LifecycleReport, console: Console) -> None:
    """One row per document of the lifecycle demo (its number, status and emails), the
    timings, then what was off, if anything."""
    table = Table(title=f"invoicing demo: an invoice's life (run {report.run})")
    for col in ("document", "number", "status", "emails"):
        table.add_column(col)
    for what, number, status, emails in report.documents:
        table.add_row(what, number, status, str(emails))
    for name, seconds in report.timings.items():
        table.add_row(f"time: {name}", "", "", f"{seconds:.1f} s")
    console.print(table)
    for problem in report.problems:
        console.print(f"[red]{problem}[/]")


def print_pricing_report(report: PricingReport, console: Console) -> None:
    """Print one line per customer (its story, expected and invoiced subtotal, verdict),
    the differing lines, then the summary table."""
    console.print(
        "reconciliation per customer: the independent answer vs the invoice "
        f"({report.config.period}; lines = rated charges + pass-through)"
    )
    head = f"{'profile':<12} {'lines':>5} {'expected':>10} {'invoiced':>10} {'verdict':<8} customer: story"
    console.print(head, markup=False, soft_wrap=True, highlight=False)
    for result in report.results:
        expected = result.expected.subtotal
        shown = "(none)" if result.subtotal is None else str(result.subtotal)
        line = (
            f"{result.customer.profile:<12} {len(result.expected.lines):>5} "
            f"{expected if expected is not None else '(held)'!s:>10} {shown:>10} "
            f"{result.verdict:<8} {result.customer.customer_id}: {result.customer.story}"
        )
        console.print(line, markup=False, soft_wrap=True, highlight=False)
        for want, got in result.line_differences[:10]:
            console.print(
                f"    line expected {want or '(none)'}, invoiced {got or '(none)'}",
                markup=False,
                soft_wrap=True,
                highlight=False,
            )
        if result.hold_reason:
            console.print(f"    held: {result.hold_reason}", markup=False, soft_wrap=True)
    table = Table(title="invoicing demo: pricing scenario (API platform)")
    table.add_column("what")
    table.add_column("value", justify="right")
    config = report.config
    table.add_row(
        "customers (seed, period)", f"{config.customers} ({config.seed}, {config.period})"
    )
    table.add_row(
        "events produced (resent duplicates)",
        f"{report.events_in_file} ({report.duplicates_resent})",
    )
    table.add_row("  usage.metered", str(report.events_by_type.get("usage.metered", 0)))
    table.add_row(
        "  usage.recorded (pass-through)", str(report.events_by_type.get("usage.recorded", 0))
    )
    table.add_row(
        "subscriptions started / changed / ended in the period",
        f"{report.starts_in_period} / {report.changes_in_period} / {report.ends_in_period}",
    )
    table.add_row("invoices issued", str(report.invoices))
    table.add_row("emails sent", str(report.emails_sent))
    table.add_row("not emailed (refused, failed or pending)", str(len(report.emails_not_sent)))
    table.add_row("duplicate emails", str(report.duplicate_emails))
    for currency, total in sorted(report.total_by_currency.items()):
        table.add_row(f"sum of totals ({currency})", f"{total}")
    table.add_row(
        "reconciliation: subtotal and lines = the answer", f"{report.count('match')} match"
    )
    table.add_row("reconciliation: mismatches", str(report.count("mismatch")))
    table.add_row("missing", str(report.count("missing")))
    table.add_row("held (unexpectedly)", str(report.count("held")))
    for name, seconds in report.timings.items():
        table.add_row(f"time: {name}", f"{seconds:.1f} s")
    console.print(table)
    if report.emails_not_sent:
        console.print(f"[red]not emailed:[/] {report.emails_not_sent[:20]}")
