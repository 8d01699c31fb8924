"""Invoice holds: list them, and release them after the bad input was dealt with.

A hold is written when a record of a customer was dead-lettered (undecodable,
invalid, a conflicting duplicate), when a close marker's invoice was refused
by a permanent rule, or when rating found a gap in the price book or the data
(reason ``rating: <code>: …``, docs/rating.md "Gaps are holds, also in the
pipeline": fix it by publishing the missing plan version or sending the
missing subscription event, then release). While a hold is open, that customer's invoice for the
period (or every period, when the bad record named none) is not built: nobody
is invoiced from partial data.

Releasing (runbook; docs/decisions/0007-holds-instead-of-partial-invoices.md):

1. read the reason and the dead-letter record (``invoicing holds list``; the
   DLQ record carries the same source coordinates);
2. fix the input at its source and re-publish the corrected event (a corrected
   usage event needs a **new** event id when the bad one was a conflicting
   duplicate; the stored line is never overwritten);
3. ``invoicing holds release HOLD_ID --note "why"``: marks the hold released
   and, for every close of that customer that was held, sends a new
   ``billing_period.closed`` marker (reason ``hold_released``, id derived from
   the hold id, so a repeated release sends the same id). The partition owner
   then builds the invoice from the usage that precedes the new marker;
4. if the customer's only usage of the period was the bad record, no close was
   held (``close-period`` never saw the customer): run ``invoicing close-period
   YYYY-MM`` again after step 2 — idempotent: markers keep their ids, and a
   customer already invoiced finds its invoice written.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg.rows import class_row, scalar_row

from streams.core.domain.codec import encode
from streams.core.domain.events import BillingPeriodClosed, Envelope, close_marker_id
from streams.errors import InvoicingError

SOURCE = "/ops/holds"


class HoldError(InvoicingError):
    """A hold operation that cannot be done (unknown hold, already released)."""


@dataclass(frozen=True)
class HoldRow:
    hold_id: int
    customer_id: str
    billing_period: str | None
    reason: str
    source: str
    created_at: datetime
    released_at: datetime | None
    held_closes: int


def list_holds(conn: psycopg.Connection[Any], *, include_released: bool = False) -> list[HoldRow]:
    """Holds, open ones first; ``held_closes`` counts close markers that were held by them."""
    with conn.cursor(row_factory=class_row(HoldRow)) as cur:
        return cur.execute(
            f"""
            SELECT h.hold_id, h.customer_id, h.billing_period, h.reason,
                   h.source_topic || '[' || h.source_partition || ']@' || h.source_offset AS source,
                   h.created_at, h.released_at,
                   (SELECT count(*) FROM period_closes c
                     WHERE c.customer_id = h.customer_id AND c.outcome = 'held'
                       AND (h.billing_period IS NULL OR c.billing_period = h.billing_period))
                   AS held_closes
              FROM invoice_holds h
             {"" if include_released else "WHERE h.released_at IS NULL"}
             ORDER BY h.released_at IS NOT NULL, h.hold_id
            """
        ).fetchall()


@dataclass(frozen=True)
class _HoldState:
    customer_id: str
    billing_period: str | None
    released_at: datetime | None


def release_hold(
    conn: psycopg.Connection[Any],
    producer: Producer,
    topic: str,
    hold_id: int,
    *,
    released_by: str,
    note: str,
) -> list[str]:
    """Release ``hold_id`` and (re-)send close markers for the closes it held.

    Order: the hold row is marked released and **committed first**, then the
    markers are sent — a worker that reads a marker must find the hold released,
    or it would hold the close again. Idempotent: releasing a released hold
    re-sends the same markers (deterministic ids), so a release whose markers
    were not delivered is simply run again.

    ``conn`` must be in autocommit mode. Returns the billing periods re-closed.

    Raises:
        HoldError: no such hold, or the markers were not delivered (run it again).
    """
    with conn.cursor(row_factory=class_row(_HoldState)) as cur:
        hold = cur.execute(
            "SELECT customer_id, billing_period, released_at FROM invoice_holds WHERE hold_id = %s",
            (hold_id,),
        ).fetchone()
    if hold is None:
        raise HoldError(f"no hold #{hold_id}")
    customer_id, period, released_at = hold.customer_id, hold.billing_period, hold.released_at
    if released_at is None:
        conn.execute(
            "UPDATE invoice_holds SET released_at = now(), released_by = %s, release_note = %s "
            "WHERE hold_id = %s AND released_at IS NULL",
            (released_by, note, hold_id),
        )
    with conn.cursor(row_factory=scalar_row) as cur:
        periods: list[str] = cur.execute(
            "SELECT DISTINCT billing_period FROM period_closes WHERE customer_id = %s AND outcome = 'held' "
            "AND (%s::text IS NULL OR billing_period = %s) ORDER BY 1",
            (customer_id, period, period),
        ).fetchall()
        still_held: set[str] = set(
            cur.execute(
                "SELECT DISTINCT coalesce(billing_period, '*') FROM invoice_holds "
                "WHERE customer_id = %s AND released_at IS NULL AND hold_id <> %s",
                (customer_id, hold_id),
            ).fetchall()
        )
    errors: list[str] = []
    sent: list[str] = []
    for billing_period in periods:
        if billing_period in still_held or "*" in still_held:
            continue  # another open hold still blocks this period: its release will re-close
        data = BillingPeriodClosed(
            customer_id=customer_id,
            billing_period=billing_period,
            closed_at=datetime.now(UTC),
            reason="hold_released",
        )
        event_id = close_marker_id(customer_id, billing_period, "hold_released", str(hold_id))
        record = encode(Envelope.wrap(data, id=event_id, source=SOURCE))
        producer.produce(
            topic,
            key=record.key,
            value=record.value,
            headers=[(name, value) for name, value in record.headers],
            on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
        )
        sent.append(billing_period)
    if producer.flush(30) or errors:
        raise HoldError(
            f"hold #{hold_id} is released but its re-close markers were not delivered "
            f"({errors or 'timeout'}): run the release again to re-send them"
        )
    return sent
