"""``invoicing close-period PERIOD``: a ``billing_period.closed`` marker per customer with usage."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Annotated

import typer

from streams.entrypoints.common import console, leased_job, out, settings_of


def close_period_command(
    ctx: typer.Context,
    period: Annotated[str, typer.Argument(help="Billing period, YYYY-MM.")],
    lease_ttl: float = typer.Option(30.0, "--lease-ttl", help="Lease TTL, seconds."),
    scan_margin_days: float = typer.Option(
        7.0, "--scan-margin-days", help="Scan the topic from this long before the period."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
) -> None:
    """Emit billing_period.closed for every customer with usage in PERIOD, under a Redis lease.

    Exit 0: done; 1: delivery failure, Kafka or database error; 2: invalid period;
    3: Redis unreachable (nothing emitted); 4: another run holds the lease (nothing
    emitted); 5: aborted part-way (lease lost or fenced; rerun to continue).
    """
    from streams import bootstrap
    from streams.apps.importers import ImporterError
    from streams.apps.importers.close_period import CloseAborted

    with leased_job(
        job="close-period",
        busy="another close-period run is active",
        aborted=CloseAborted,
        errors=(ImporterError,),
    ):
        summary = bootstrap.run_close_period(
            period,
            settings_of(ctx),
            lease_ttl_s=lease_ttl,
            progress=progress,
            scan_margin=timedelta(days=scan_margin_days),
        )
    style = "green" if summary.ok else "red"
    console.print(
        f"[{style}]close-period {summary.period}[/] on {summary.topic}: "
        f"{len(summary.customers)} customers ({summary.from_topic} from the topic, "
        f"{summary.from_db} from the database), {summary.markers_produced} markers delivered, "
        f"{summary.newly_requested} newly requested, {summary.already_requested} already "
        f"requested; lease {summary.lease_name} token {summary.fencing_token}; "
        f"{summary.scanned_records} records scanned ({summary.undecodable_records} invalid), "
        f"{summary.stored_records} already stored by the workers and not read; "
        f"{summary.elapsed_s:.2f}s"
    )
    for failure in summary.delivery_failures:
        console.print(
            f"  [red]not delivered[/]: {failure.customer_id} {failure.event_id}: {failure.error}"
        )
    if json_out:
        out.print_json(json.dumps(summary.to_dict()))
    if not summary.ok:
        raise typer.Exit(1)
