"""Invoice lines by ``COPY`` against the ``executemany`` they replaced, in one run
(docs/benchmarks.md, "Invoice lines by COPY").

``python -m benchmarks.bench_invoice_lines [--lines 250,1000] [--invoices 40]`` makes a
database of its own (created by the provisioner, migrated by ``invoicing db migrate``,
dropped at the end), then issues ``--invoices`` invoices of N lines each way through the
product's issuance transaction (:func:`benchmarks.product.issue_invoice`: fence check,
number, invoice, lines, outbox row, one commit), alternating one by one so that drift and
neighbours' load hit both: **COPY** (the product's
:func:`streams.core.billing.store.invoices.insert_lines`) and **executemany** (the
previous write, kept here as the same-run baseline). Prints invoices/s and lines/s of
each and their ratio. Needs the local stack up. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from pathlib import Path
from statistics import median
from typing import Any

import psycopg

from benchmarks.product import (
    issue_invoice,
    migrated_database,
    new_unique,
    prepare_fencing,
)
from streams.core.billing import rows
from streams.core.billing.store import invoices
from streams.core.domain.invoice import TaxedLine
from streams.settings import Settings


def executemany_lines(
    conn: psycopg.Connection[Any], draft: rows.InvoiceDraft, taxed: Mapping[str, TaxedLine]
) -> None:
    """The baseline: one ``INSERT`` per line through ``executemany`` (the previous write)."""
    columns = ", ".join(invoices.LINE_COLUMNS)
    marks = ", ".join(["%s"] * len(invoices.LINE_COLUMNS))
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO invoice_lines ({columns}) VALUES ({marks})",
            [
                (
                    draft.invoice_id,
                    n,
                    line.event_id,
                    line.amount,
                    line.quantity,
                    line.unit,
                    line.description,
                    line.sku_id,
                    line.region_id,
                    taxed[line.event_id].tax_code,
                    taxed[line.event_id].rate,
                    taxed[line.event_id].tax,
                    line.source_topic,
                    line.source_partition,
                    line.source_offset,
                )
                for n, line in enumerate(draft.lines, start=1)
            ],
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", default="250,1000")
    parser.add_argument("--invoices", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    settings = Settings()
    product = invoices.insert_lines
    try:
        with migrated_database(settings, "lines", Path.cwd()) as database:
            print(
                f"{'lines':>6} {'COPY inv/s':>11} {'executemany inv/s':>18} {'ratio':>6} {'COPY lines/s':>13}"
            )
            with psycopg.connect(settings.postgres.dsn("owner", database=database)) as conn:
                for n in (int(x) for x in args.lines.split(",")):
                    fixture = prepare_fencing(
                        conn, count=2 * args.invoices * args.blocks, lines=n, unique=new_unique()
                    )
                    drafts = iter(fixture.drafts)
                    rates: dict[str, list[float]] = {"copy": [], "executemany": []}
                    for _ in range(args.blocks):
                        spent = {"copy": 0.0, "executemany": 0.0}
                        for i in range(args.invoices):
                            order = (
                                ("copy", "executemany") if i % 2 == 0 else ("executemany", "copy")
                            )
                            for way in order:
                                invoices.insert_lines = (
                                    product if way == "copy" else executemany_lines
                                )
                                t0 = time.perf_counter()
                                issue_invoice(
                                    conn, next(drafts), fixture.token, fixture.invoices_topic
                                )
                                spent[way] += time.perf_counter() - t0
                        for way in spent:
                            rates[way].append(args.invoices / spent[way])
                    copy_rate, many_rate = median(rates["copy"]), median(rates["executemany"])
                    print(
                        f"{n:>6} {copy_rate:>11.1f} {many_rate:>18.1f} {copy_rate / many_rate:>6.2f}"
                        f" {copy_rate * n:>13,.0f}"
                    )
    finally:
        invoices.insert_lines = product


if __name__ == "__main__":
    main()
