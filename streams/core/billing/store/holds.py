"""``invoice_holds``: a customer's invoicing held because one of its records was dead-lettered
(or because rating found a gap: :mod:`streams.apps.invoicing.jobs`).

While a hold is open, the customer's invoice for the period (or for every
period, when the hold names none) is not built: nobody is invoiced from partial
data (docs/decisions/0007-holds-instead-of-partial-invoices.md). Holds are
written by the invoicing worker and the email sender's dead-letter paths in
the transaction that moves past the bad record, and released by an operator
(:mod:`streams.apps.ops.holds`).

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import class_row, scalar_row

from streams.core.billing.rows import Hold, SourceCoordinates
from streams.core.billing.store.text import safe_text

__all__ = [
    "customers_held_in_period",
    "has_open_hold",
    "held_customers",
    "open_holds",
    "record_hold",
]


def record_hold(
    conn: psycopg.Connection[Any],
    *,
    customer_id: str,
    billing_period: str | None,
    reason: str,
    event_id: str | None,
    source: SourceCoordinates,
) -> None:
    """Hold ``customer_id``'s invoicing (for one period, or all when ``billing_period``
    is None) because the record at ``source`` was dead-lettered. Idempotent per
    (source record, customer), so one record can hold several customers (migration
    0004; docs/decisions/0007-holds-instead-of-partial-invoices.md). The reason and the
    event id quote a bad record: they are written through
    :func:`~streams.core.billing.store.text.safe_text` (no NUL, no lone surrogate). Takes a
    :class:`~streams.core.billing.rows.HoldRequest` as keywords (``record_hold(conn, **request)``).

    Raises:
        psycopg.Error: the insert failed (the caller's transaction is rolled back).
    """
    conn.execute(
        """
        INSERT INTO invoice_holds (customer_id, billing_period, reason, event_id,
                                   source_topic, source_partition, source_offset)
        VALUES (%s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (source_topic, source_partition, source_offset, customer_id) DO NOTHING
        """,
        (
            safe_text(customer_id, 128),
            billing_period,
            safe_text(reason, 2000),
            safe_text(event_id, 256) if event_id is not None else None,
            source.topic,
            source.partition,
            source.offset,
        ),
    )


def open_holds(conn: psycopg.Connection[Any], customer_id: str, billing_period: str) -> list[Hold]:
    """Unreleased holds that block ``customer_id``'s invoice for ``billing_period``."""
    with conn.cursor(row_factory=class_row(Hold)) as cur:
        return cur.execute(
            """
            SELECT hold_id, customer_id, billing_period, reason, source_topic, source_partition,
                   source_offset, created_at
              FROM invoice_holds
             WHERE customer_id = %s AND (billing_period = %s OR billing_period IS NULL)
               AND released_at IS NULL
             ORDER BY hold_id
            """,
            (customer_id, billing_period),
        ).fetchall()


def has_open_hold(conn: psycopg.Connection[Any], customer_id: str, billing_period: str) -> bool:
    """Whether an unreleased hold blocks ``customer_id``'s invoice for ``billing_period``."""
    return bool(open_holds(conn, customer_id, billing_period))


def held_customers(conn: psycopg.Connection[Any], billing_period: str) -> set[str]:
    """Customers with an unreleased hold on the period (or on every period)."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                "SELECT DISTINCT customer_id FROM invoice_holds WHERE released_at IS NULL "
                "AND (billing_period = %s OR billing_period IS NULL)",
                (billing_period,),
            ).fetchall()
        )


def customers_held_in_period(
    conn: psycopg.Connection[Any], billing_period: str, topic: str
) -> set[str]:
    """Customers with an unreleased hold naming ``billing_period`` that a record of ``topic``
    caused: a record of the period the workers dead-lettered instead of storing
    (close-period closes them, and the worker finds them held)."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return set(
            cur.execute(
                "SELECT DISTINCT customer_id FROM invoice_holds WHERE released_at IS NULL "
                "AND billing_period = %s AND source_topic = %s",
                (billing_period, topic),
            ).fetchall()
        )
