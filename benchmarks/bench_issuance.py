"""Concurrent issuance of one period: the number taken last (the product) against the number
taken first (the previous order, kept here as the same-run baseline)
(docs/benchmarks.md, "Issuance: the number taken last").

``python -m benchmarks.bench_issuance [--lines 1,250,1000] [--threads 4] [--invoices 40]
[--blocks 3]`` makes a database of its own (created by the provisioner, migrated by
``invoicing db migrate``, dropped at the end) and, per line count, issues ``--invoices``
invoices of one period from ``--threads`` threads at once (the worker's ``max_jobs``
job threads, each on its own connection), alternating the two orders block by block so
that drift and neighbours' load hit both:

- **number last**: the kernel's issuance transaction
  (:func:`streams.core.billing.issuance.issue`): fence check, invoice under its
  provisional number, lines, ``number_invoice``, outbox row, close record, commit;
- **number first**: the same statements with the number taken before the invoice
  (:func:`issue_number_first`), so the period's counter row is locked from the number
  to the commit, the whole transaction.

Prints invoices/s of each (median of the blocks), their ratio, and the serial rates (one
thread, each order, one block each) for reference: what the number taken last costs
where nothing waits for the counter. Needs the local stack up. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
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
from streams.apps.invoicing.job_types import EVENT_SOURCE
from streams.core.billing import fencing, rows
from streams.core.billing import store as pg
from streams.core.billing.issuance import invoice_issued, outbox_event_id
from streams.core.domain.events import InvoiceIssued
from streams.settings import Settings

Issue = Callable[[psycopg.Connection[Any], rows.InvoiceDraft, fencing.FencingToken, str], None]


def issue_number_first(
    conn: psycopg.Connection[Any],
    draft: rows.InvoiceDraft,
    token: fencing.FencingToken,
    invoices_topic: str,
) -> None:
    """The baseline: the issuance transaction in its previous order, the gapless number
    first (the counter row locked from here to the commit), then the invoice and its
    lines, the outbox row and the close record; one commit.

    Raises:
        fencing.Fenced: the fence no longer holds ``token``.
        RuntimeError: the invoice already existed (the benchmark reused a draft).
    """
    issued_at = datetime.now(UTC)
    period = draft.billing_period
    marker = draft.marker
    assert isinstance(marker, rows.CloseMarker)
    with conn.transaction():
        fencing.check(conn, token)
        number = pg.invoices.invoice_number(period, pg.invoices.next_number(conn, f"INV-{period}"))
        if not pg.invoices.insert_invoice(
            conn,
            draft,
            number=number,
            fence=(token.group_id, token.generation, token.member_id),
            lease_fencing_token=None,
            issued_at=issued_at,
        ):
            raise RuntimeError(f"invoice {draft.invoice_id} already existed")
        pg.invoices.insert_outbox(
            conn,
            event_id=outbox_event_id(InvoiceIssued.event_type, draft.invoice_id),
            topic=invoices_topic,
            customer_id=draft.customer.customer_id,
            event=invoice_issued(draft, number, issued_at),
            source=EVENT_SOURCE,
            time=issued_at,
            document_id=draft.invoice_id,
        )
        pg.closes.record_close(conn, marker, "invoiced", draft.invoice_id)


def number_last(
    conn: psycopg.Connection[Any],
    draft: rows.InvoiceDraft,
    token: fencing.FencingToken,
    invoices_topic: str,
) -> None:
    """The product's issuance transaction (:func:`benchmarks.product.issue_invoice`)."""
    issue_invoice(conn, draft, token, invoices_topic)


class SeparateCheck:
    """The partition fence checked by its own statement before the invoice (the previous
    issuance): not a :class:`~streams.core.billing.fencing.FencingToken`, so the kernel
    calls :meth:`check` first instead of folding it into the insert."""

    def __init__(self, token: fencing.FencingToken) -> None:
        self.token = token

    def check(self, conn: psycopg.Connection[Any]) -> None:
        fencing.check(conn, self.token)


def fencing_rates(dsn: str, lines: int, invoices: int, blocks: int) -> dict[str, float]:
    """Invoices/s of folded, separate and unfenced issuance on one connection (median of
    ``blocks`` blocks of ``invoices`` each way, interleaved one by one, rotating order)."""
    with psycopg.connect(dsn) as conn:
        fixture = prepare_fencing(
            conn, count=3 * invoices * blocks, lines=lines, unique=new_unique()
        )
        drafts = iter(fixture.drafts)
        token = fixture.token
        ways: dict[str, Any] = {
            "folded": token,
            "separate": SeparateCheck(token),
            "unfenced": None,
        }
        rates: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for _ in range(blocks):
            spent = dict.fromkeys(ways, 0.0)
            for i in range(invoices):
                for name in names[i % 3 :] + names[: i % 3]:
                    t0 = time.perf_counter()
                    issue_invoice(conn, next(drafts), ways[name], fixture.invoices_topic)
                    spent[name] += time.perf_counter() - t0
            for name in ways:
                rates[name].append(invoices / spent[name])
    return {name: median(r) for name, r in rates.items()}


def run_block(
    dsn: str,
    way: Issue,
    drafts: list[rows.InvoiceDraft],
    token: fencing.FencingToken,
    topic: str,
    threads: int,
) -> float:
    """Issue ``drafts`` from ``threads`` threads at once; returns invoices/s (wall clock,
    from the first thread's start to the last one's end; connections opened before)."""
    work: queue.SimpleQueue[rows.InvoiceDraft] = queue.SimpleQueue()
    for d in drafts:
        work.put(d)
    conns = [psycopg.connect(dsn) for _ in range(threads)]
    errors: list[BaseException] = []
    start = threading.Barrier(threads + 1)

    def loop(conn: psycopg.Connection[Any]) -> None:
        start.wait()
        try:
            while True:
                try:
                    d = work.get_nowait()
                except queue.Empty:
                    return
                way(conn, d, token, topic)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    pool = [threading.Thread(target=loop, args=(c,)) for c in conns]
    for t in pool:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in pool:
        t.join()
    spent = time.perf_counter() - t0
    for c in conns:
        c.close()
    if errors:
        raise errors[0]
    return len(drafts) / spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", default="1,250,1000")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--invoices", type=int, default=40)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--fencing", action="store_true", help="the fence's cost instead")
    args = parser.parse_args()
    load = os.getloadavg()
    print(
        f"load average at start: {load[0]:.2f} {load[1]:.2f}"
        + ("  (above 1.0: not a measurement)" if load[0] > 1.0 else "")
    )
    settings = Settings()
    with migrated_database(settings, "issuance", Path.cwd()) as database:
        dsn = settings.postgres.dsn("owner", database=database)
        if args.fencing:
            print(
                f"{'lines':>6} {'folded inv/s':>13} {'separate inv/s':>15} {'unfenced inv/s':>15}"
                f" {'folded/unfenced':>16} {'separate/unfenced':>18}"
            )
            for n in (int(x) for x in args.lines.split(",")):
                r = fencing_rates(dsn, n, args.invoices, args.blocks)
                print(
                    f"{n:>6} {r['folded']:>13.1f} {r['separate']:>15.1f} {r['unfenced']:>15.1f}"
                    f" {r['folded'] / r['unfenced']:>16.3f} {r['separate'] / r['unfenced']:>18.3f}"
                )
            return
        print(
            f"{'lines':>6} {'threads':>7} {'number last inv/s':>18} {'number first inv/s':>19}"
            f" {'ratio':>6} {'1 thread, last':>15} {'1 thread, first':>16}"
        )
        for n in (int(x) for x in args.lines.split(",")):
            with psycopg.connect(dsn) as conn:
                fixture = prepare_fencing(
                    conn, count=(2 * args.blocks + 2) * args.invoices, lines=n, unique=new_unique()
                )
            chunks = [
                fixture.drafts[i : i + args.invoices]
                for i in range(0, len(fixture.drafts), args.invoices)
            ]
            take = iter(chunks).__next__

            rates: dict[str, list[float]] = {"last": [], "first": []}
            for b in range(args.blocks):
                order = ("last", "first") if b % 2 == 0 else ("first", "last")
                for name in order:
                    way = number_last if name == "last" else issue_number_first
                    rates[name].append(
                        run_block(
                            dsn, way, take(), fixture.token, fixture.invoices_topic, args.threads
                        )
                    )
            serial = run_block(dsn, number_last, take(), fixture.token, fixture.invoices_topic, 1)
            serial_first = run_block(
                dsn, issue_number_first, take(), fixture.token, fixture.invoices_topic, 1
            )
            last, first = median(rates["last"]), median(rates["first"])
            print(
                f"{n:>6} {args.threads:>7} {last:>18.1f} {first:>19.1f} {last / first:>6.2f}"
                f" {serial:>15.1f} {serial_first:>16.1f}"
            )


if __name__ == "__main__":
    main()
