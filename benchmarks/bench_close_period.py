"""close-period's close requests recorded a chunk at a time (the product, ``CLOSE_BATCH``
customers per transaction) against one transaction per customer (``CLOSE_BATCH = 1``, the
previous behaviour), in one run (docs/benchmarks.md, "Close requests in chunks").

``python -m benchmarks.bench_close_period [--customers 1000] [--rounds 4]`` creates topics
under a fresh prefix on the local stack (which must be up), produces ``--customers``
customers with 5 usage lines in each of ``2 * --rounds`` past periods, then closes the
periods one by one in process (:func:`streams.bootstrap.run_close_period`: lease, topic
scan, requests, markers), alternating the two ways (ABBA), every close on a period no
run has requested yet. Prints each close's seconds and the median of each way. The scan
reads the whole topic each time (the markers of earlier closes too), the same for both.
Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
import uuid

from benchmarks import kafka_tools, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--customers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    load_avg = os.getloadavg()
    print(
        f"load average at start: {load_avg[0]:.2f} {load_avg[1]:.2f}"
        + ("  (above 1.0: not a measurement)" if load_avg[0] > 1.0 else "")
    )
    prefix = f"bcp{uuid.uuid4().hex[:6]}."
    os.environ["INVOICING_KAFKA__TOPIC_PREFIX"] = prefix
    subprocess.run(
        [".venv/bin/invoicing", "topics", "create"], env=os.environ, check=True, capture_output=True
    )
    # imported after the prefix is set: the settings read it
    from streams.apps.importers import close_period as cp
    from streams.bootstrap import run_close_period
    from streams.settings import Settings

    settings = Settings()
    periods = [f"2025-{m:02d}" for m in range(1, 2 * args.rounds + 1)]
    customers = [f"{prefix}c{i:05d}" for i in range(args.customers)]
    for period in periods:
        kafka_tools.produce(
            settings, prefix + "billing.account-events.v1", load.usage_for(customers, period, 5)
        )
    product = cp.CLOSE_BATCH
    seconds: dict[int, list[float]] = {1: [], product: []}
    try:
        for i, period in enumerate(periods):
            batch = (1, product, product, 1)[i % 4]  # ABBA
            cp.CLOSE_BATCH = batch
            t0 = time.perf_counter()
            summary = run_close_period(period, settings, progress=False)
            spent = time.perf_counter() - t0
            if not summary.ok or summary.newly_requested != args.customers:
                raise SystemExit(f"close of {period} did not request every customer: {summary}")
            seconds[batch].append(spent)
            print(
                f"{period} CLOSE_BATCH={batch}: {spent:.2f} s ({summary.scanned_records:,} "
                "records scanned)"
            )
    finally:
        cp.CLOSE_BATCH = product
    one, chunked = statistics.median(seconds[1]), statistics.median(seconds[product])
    print(
        f"{args.customers} customers: a transaction per customer {one:.2f} s, chunks of "
        f"{product} {chunked:.2f} s (median of {args.rounds} each); ratio {chunked / one:.2f}"
    )


if __name__ == "__main__":
    main()
