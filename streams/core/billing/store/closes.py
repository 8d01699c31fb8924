"""``period_closes``: the close markers the invoicing workers handled, one row per event id.

``outcome`` is ``invoiced``, ``already_invoiced`` or ``held`` (migration 0001);
the row is written in the transaction that decides it (the issuance transaction
for ``invoiced``), so a redelivered marker finds its outcome recorded.

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import scalar_row

from streams.core.billing.rows import CloseMarker

__all__ = ["closed_customers", "last_close_held", "record_close"]


def record_close(
    conn: psycopg.Connection[Any], marker: CloseMarker, outcome: str, invoice_id: str | None
) -> None:
    """Record that a close marker was handled (idempotent per marker event id)."""
    conn.execute(
        """
        INSERT INTO period_closes (event_id, customer_id, billing_period, reason, outcome, invoice_id,
                                   source_topic, source_partition, source_offset)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (event_id) DO NOTHING
        """,
        (
            marker.event_id,
            marker.customer_id,
            marker.billing_period,
            marker.reason,
            outcome,
            invoice_id,
            marker.source.topic,
            marker.source.partition,
            marker.source.offset,
        ),
    )


def closed_customers(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Customers whose close marker of the period the workers handled (``period_closes``)."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                "SELECT DISTINCT customer_id FROM period_closes WHERE billing_period = %s "
                "AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        )


def last_close_held(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Customers whose last handled close marker of the period (by offset, on its
    partition of ``topic``) has the outcome ``held``: a release of their hold re-sends
    a marker, from which the invoicing worker invoices them."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                """
                SELECT customer_id FROM (
                    SELECT DISTINCT ON (customer_id) customer_id, outcome
                      FROM period_closes
                     WHERE billing_period = %s AND source_topic = %s
                     ORDER BY customer_id, received_at DESC, source_offset DESC
                ) last WHERE outcome = 'held'
                """,
                (billing_period, topic),
            ).fetchall()
        )
