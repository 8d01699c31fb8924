"""Benchmark: invoices per second of a group of invoicing workers, steady state.

Runs in a sandbox (its own database, topics, connector, SMTP sink and fake tax
service) on the local stack, which must be up (``invoicing stack up``):

1. starts W invoicing workers and waits until the group is stable (all 12
   partitions claimed);
2. produces N customers with L usage lines each and lets the workers store them;
3. closes the period and measures the time until every invoice is issued.

Prints figures; asserts nothing about speed.

    .venv/bin/python -m benchmarks.bench_invoicing --customers 300 --lines 20 --workers 3
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from streams.adapters.kafka import make_producer
from streams.bootstrap import run_close_period
from streams.core.domain.codec import encode
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded
from streams.devtools.sandbox.pipeline import isolated_pipeline
from streams.settings import Settings

PERIOD = "2026-09"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--customers", type=int, default=300)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    unique = "b" + uuid.uuid4().hex[:8]
    with (
        tempfile.TemporaryDirectory() as tmp,
        isolated_pipeline(Settings(), unique, Path(tmp)) as p,
    ):
        p.workers.start("invoicing", args.workers)
        started = time.monotonic()
        with p.connect() as conn:
            while conn.execute("SELECT count(*) FROM partition_fences").fetchone() != (12,):
                time.sleep(0.2)
            # a short settle: the last members' incremental assignments
            time.sleep(3)
        group_s = time.monotonic() - started

        producer = make_producer(p.settings.kafka)
        t0 = time.monotonic()
        for c in range(args.customers):
            customer = f"{unique}-c{c}"
            events = [
                Envelope.wrap(
                    CustomerUpserted(
                        customer_id=customer,
                        name=customer,
                        email=f"{customer}@customers.invalid",
                        currency="USD",
                    ),
                    id=f"cu-{customer}",
                    source="/bench",
                )
            ]
            for n in range(args.lines):
                events.append(
                    Envelope.wrap(
                        UsageRecorded(
                            customer_id=customer,
                            billing_period=PERIOD,
                            amount=Decimal("0.01234567891") * (n + 1),
                            currency="USD",
                            event_time=datetime(2026, 9, 2, tzinfo=UTC) + timedelta(minutes=n),
                            region_id="eu-west-1",
                        ),
                        id=f"u-{customer}-{n}",
                        source="/bench",
                    )
                )
            for envelope in events:
                record = encode(envelope)
                producer.produce(
                    p.topic, key=record.key, value=record.value, headers=list(record.headers)
                )
            producer.poll(0)
        producer.flush(60)
        produce_s = time.monotonic() - t0
        total_lines = args.customers * args.lines
        t1 = time.monotonic()
        with p.connect() as conn:
            while conn.execute("SELECT count(*) FROM usage_lines").fetchone() != (total_lines,):
                time.sleep(0.1)
        store_s = time.monotonic() - t1

        t2 = time.monotonic()
        run_close_period(PERIOD, p.settings, progress=False)
        close_s = time.monotonic() - t2
        with p.connect() as conn:
            while conn.execute("SELECT count(*) FROM invoices").fetchone() != (args.customers,):
                time.sleep(0.1)
        invoice_s = time.monotonic() - t2
        print(f"workers={args.workers} customers={args.customers} lines/customer={args.lines}")
        print(f"group stable after           {group_s:6.1f} s")
        print(
            f"produce {total_lines + args.customers} events       {produce_s:6.2f} s "
            f"({(total_lines + args.customers) / produce_s:,.0f} events/s)"
        )
        print(
            f"store {total_lines} usage lines    {store_s:6.2f} s ({total_lines / store_s:,.0f} lines/s)"
        )
        print(f"close-period (markers sent)  {close_s:6.2f} s")
        print(
            f"close → all invoices issued  {invoice_s:6.2f} s ({args.customers / invoice_s:,.1f} invoices/s, "
            f"{total_lines / invoice_s:,.0f} invoiced lines/s)"
        )


if __name__ == "__main__":
    main()
