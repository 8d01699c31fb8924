"""PostgreSQL statements of the replay (psycopg 3): run state, issued invoices, credit notes,
late usage.

Every function takes an open connection and runs inside the caller's
transaction; the apply's write transactions start with the lease's fence check
(:meth:`streams.adapters.lease.Lease.check_fence`). Invoice rows, their lines,
numbers and outbox rows are written with :mod:`streams.invoicing.store` (the
worker's statements), so both writers use the same unique keys.

Shapes: money is ``Decimal`` in the currency's units (``NUMERIC``), periods are
``YYYY-MM`` text, times are UTC ``timestamptz``, offsets JSON objects
``{"<partition>": offset}``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from streams.invoicing import store
from streams.replay.diff import IssuedInvoice, IssuedLine

# --------------------------------------------------------------------------- run state


@dataclass(frozen=True)
class RunRow:
    """A ``replay_runs`` row."""

    run_id: str
    billing_period: str
    mode: str
    status: str
    topic: str
    consumer_group: str
    window_start: datetime
    start_offsets: dict[str, int]
    end_offsets: dict[str, int]
    holder: str
    lease_fencing_token: int
    attempts: int
    started_at: datetime


_RUN_COLUMNS = (
    "run_id, billing_period, mode, status, topic, consumer_group, window_start, start_offsets, "
    "end_offsets, holder, lease_fencing_token, attempts, started_at"
)


def insert_run(
    conn: psycopg.Connection[Any],
    *,
    run_id: str,
    billing_period: str,
    mode: str,
    topic: str,
    consumer_group: str,
    window_start: datetime,
    start_offsets: dict[str, int],
    end_offsets: dict[str, int],
    holder: str,
    lease_fencing_token: int,
) -> None:
    """A new run, ``running``.

    Raises:
        psycopg.errors.UniqueViolation: an apply of the period is already running.
    """
    conn.execute(
        """
        INSERT INTO replay_runs (run_id, billing_period, mode, status, topic, consumer_group,
            window_start, start_offsets, end_offsets, holder, lease_fencing_token)
        VALUES (%s, %s, %s, 'running', %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            run_id,
            billing_period,
            mode,
            topic,
            consumer_group,
            window_start,
            Jsonb(start_offsets),
            Jsonb(end_offsets),
            holder,
            lease_fencing_token,
        ),
    )


def open_apply_run(conn: psycopg.Connection[Any], billing_period: str) -> RunRow | None:
    """The period's unfinished apply run (at most one, by the partial unique index)."""
    with conn.cursor(row_factory=class_row(RunRow)) as cur:
        return cur.execute(
            f"SELECT {_RUN_COLUMNS} FROM replay_runs "
            "WHERE billing_period = %s AND mode = 'apply' AND status = 'running' FOR UPDATE",
            (billing_period,),
        ).fetchone()


def get_run(conn: psycopg.Connection[Any], run_id: str) -> RunRow | None:
    with conn.cursor(row_factory=class_row(RunRow)) as cur:
        return cur.execute(
            f"SELECT {_RUN_COLUMNS} FROM replay_runs WHERE run_id = %s", (run_id,)
        ).fetchone()


def resume_run(
    conn: psycopg.Connection[Any], run_id: str, *, holder: str, lease_fencing_token: int
) -> None:
    """Record a new attempt of ``run_id`` by ``holder`` under ``lease_fencing_token``."""
    conn.execute(
        """
        UPDATE replay_runs SET attempts = attempts + 1, holder = %s, lease_fencing_token = %s,
               updated_at = now()
         WHERE run_id = %s
        """,
        (holder, lease_fencing_token, run_id),
    )


def finish_run(
    conn: psycopg.Connection[Any],
    run_id: str,
    *,
    status: str,
    events_read: int | None,
    summary: dict[str, Any] | None,
    error: str | None = None,
) -> None:
    """Set the run's status (``completed``/``failed``, or ``running`` with ``error`` for a
    run left to resume), its counters and summary."""
    conn.execute(
        """
        UPDATE replay_runs SET status = %s, events_read = COALESCE(%s, events_read),
               summary = COALESCE(%s, summary), last_error = %s, updated_at = now(),
               finished_at = CASE WHEN %s = 'running' THEN NULL ELSE now() END
         WHERE run_id = %s
        """,
        (
            status,
            events_read,
            Jsonb(summary) if summary is not None else None,
            error,
            status,
            run_id,
        ),
    )


@dataclass(frozen=True)
class ResultRow:
    """A ``replay_results`` row: what an apply did for one customer."""

    customer_id: str
    outcome: str
    old_invoice_id: str | None
    new_invoice_id: str | None
    credit_note_id: str | None
    detail: dict[str, Any]


def record_result(
    conn: psycopg.Connection[Any],
    run_id: str,
    *,
    customer_id: str,
    outcome: str,
    detail: dict[str, Any],
    old_invoice_id: str | None = None,
    new_invoice_id: str | None = None,
    credit_note_id: str | None = None,
) -> None:
    """Record that the run finished ``customer_id`` (idempotent per (run, customer))."""
    conn.execute(
        """
        INSERT INTO replay_results (run_id, customer_id, outcome, old_invoice_id, new_invoice_id,
                                    credit_note_id, detail)
        VALUES (%s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT (run_id, customer_id) DO NOTHING
        """,
        (
            run_id,
            customer_id,
            outcome,
            old_invoice_id,
            new_invoice_id,
            credit_note_id,
            Jsonb(detail),
        ),
    )


def results(conn: psycopg.Connection[Any], run_id: str) -> dict[str, ResultRow]:
    """customer → what the run recorded for it."""
    with conn.cursor(row_factory=class_row(ResultRow)) as cur:
        rows = cur.execute(
            "SELECT customer_id, outcome, old_invoice_id::text, new_invoice_id::text, "
            "credit_note_id::text, detail FROM replay_results WHERE run_id = %s",
            (run_id,),
        ).fetchall()
    return {row.customer_id: row for row in rows}


# --------------------------------------------------------------------------- issued state


def issued_invoices(
    conn: psycopg.Connection[Any],
    billing_period: str,
    topic: str,
    customer_id: str | None = None,
) -> dict[str, IssuedInvoice]:
    """customer → the issued revision of ``billing_period`` built from ``topic``, with its
    lines (only ``customer_id``'s when given)."""
    params = {"period": billing_period, "topic": topic, "customer": customer_id}
    heads = conn.execute(
        """
        SELECT invoice_id::text, invoice_number, revision, customer_id, currency, subtotal,
               tax_total, total, line_count, source_partition, close_offset
          FROM invoices
         WHERE billing_period = %(period)s AND status = 'issued' AND source_topic = %(topic)s
           AND (%(customer)s::text IS NULL OR customer_id = %(customer)s::text)
        """,
        params,
    ).fetchall()
    lines: dict[str, list[IssuedLine]] = defaultdict(list)
    for invoice_id, event_id, amount, partition, offset in conn.execute(
        """
        SELECT l.invoice_id::text, l.event_id, l.amount, l.source_partition, l.source_offset
          FROM invoice_lines l JOIN invoices i ON i.invoice_id = l.invoice_id
         WHERE i.billing_period = %(period)s AND i.status = 'issued' AND i.source_topic = %(topic)s
           AND (%(customer)s::text IS NULL OR i.customer_id = %(customer)s::text)
         ORDER BY l.invoice_id, l.line_no
        """,
        params,
    ):
        lines[invoice_id].append(IssuedLine(event_id, amount, partition, offset))
    return {
        row[3]: IssuedInvoice(
            invoice_id=row[0],
            invoice_number=row[1],
            revision=row[2],
            customer_id=row[3],
            currency=row[4].strip(),
            subtotal=row[5],
            tax_total=row[6],
            total=row[7],
            line_count=row[8],
            source_partition=row[9],
            close_offset=row[10],
            lines=tuple(lines.get(row[0], ())),
        )
        for row in heads
    }


def revisions(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> dict[str, int]:
    """customer → its highest revision of the period, whatever the status."""
    rows = conn.execute(
        "SELECT customer_id, max(revision) FROM invoices "
        "WHERE billing_period = %s AND source_topic = %s GROUP BY customer_id",
        (billing_period, topic),
    ).fetchall()
    return {row[0]: int(row[1]) for row in rows}


def held_customers(conn: psycopg.Connection[Any], billing_period: str) -> set[str]:
    """Customers with an unreleased hold on the period (or on every period)."""
    rows = conn.execute(
        "SELECT DISTINCT customer_id FROM invoice_holds WHERE released_at IS NULL "
        "AND (billing_period = %s OR billing_period IS NULL)",
        (billing_period,),
    ).fetchall()
    return {row[0] for row in rows}


def closed_customers(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Customers whose close marker of the period the workers handled (``period_closes``)."""
    rows = conn.execute(
        "SELECT DISTINCT customer_id FROM period_closes WHERE billing_period = %s "
        "AND source_topic = %s",
        (billing_period, topic),
    ).fetchall()
    return {row[0] for row in rows}


def stored_usage_ids(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> set[str]:
    """Event ids of the period in ``usage_lines`` read from ``topic``."""
    rows = conn.execute(
        "SELECT event_id FROM usage_lines WHERE billing_period = %s AND source_topic = %s",
        (billing_period, topic),
    ).fetchall()
    return {row[0] for row in rows}


def customers(conn: psycopg.Connection[Any], ids: list[str]) -> dict[str, store.Customer]:
    """The stored customer rows of ``ids``."""
    with conn.cursor(row_factory=class_row(store.Customer)) as cur:
        rows = cur.execute(
            "SELECT customer_id, name, email, currency FROM customers WHERE customer_id = ANY(%s)",
            (ids,),
        ).fetchall()
    return {row.customer_id: row for row in rows}


@dataclass(frozen=True)
class LockedInvoice:
    invoice_id: str
    revision: int


def lock_issued(
    conn: psycopg.Connection[Any], customer_id: str, billing_period: str
) -> LockedInvoice | None:
    """``SELECT … FOR UPDATE`` the customer's issued revision: a concurrent writer of the same
    row (another replay, a void) waits until this transaction ends."""
    row = conn.execute(
        "SELECT invoice_id::text, revision FROM invoices "
        "WHERE customer_id = %s AND billing_period = %s AND status = 'issued' FOR UPDATE",
        (customer_id, billing_period),
    ).fetchone()
    return LockedInvoice(row[0], int(row[1])) if row else None


def max_revision(conn: psycopg.Connection[Any], customer_id: str, billing_period: str) -> int:
    """The customer's highest revision of the period (0: none)."""
    row = conn.execute(
        "SELECT coalesce(max(revision), 0) FROM invoices WHERE customer_id = %s AND billing_period = %s",
        (customer_id, billing_period),
    ).fetchone()
    return int(row[0]) if row else 0


def supersede(conn: psycopg.Connection[Any], invoice_id: str) -> bool:
    """``issued`` → ``superseded`` (the only change an issued invoice ever gets)."""
    row = conn.execute(
        "UPDATE invoices SET status = 'superseded' WHERE invoice_id = %s AND status = 'issued' "
        "RETURNING invoice_id",
        (invoice_id,),
    ).fetchone()
    return row is not None


def credit_note_number(billing_period: str, sequence: int) -> str:
    """Readable credit note number: ``CN-2024-09-000001`` (gapless series per period)."""
    return f"CN-{billing_period}-{sequence:06d}"


def insert_credit_note(
    conn: psycopg.Connection[Any],
    *,
    credit_note_id: str,
    number: str,
    invoice_id: str,
    customer_id: str,
    billing_period: str,
    currency: str,
    subtotal: Decimal,
    tax_total: Decimal,
    total: Decimal,
    reason: str,
    issued_at: datetime,
) -> bool:
    """Insert the credit note of ``invoice_id``; False when that revision was already credited
    (``credit_notes.invoice_id`` is unique)."""
    row = conn.execute(
        """
        INSERT INTO credit_notes (credit_note_id, credit_note_number, invoice_id, customer_id,
            billing_period, currency, subtotal, tax_total, total, reason, issued_at)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
        ON CONFLICT DO NOTHING
        RETURNING credit_note_id
        """,
        (
            credit_note_id,
            number,
            invoice_id,
            customer_id,
            billing_period,
            currency,
            subtotal,
            tax_total,
            total,
            reason[:2000],
            issued_at,
        ),
    ).fetchone()
    return row is not None


def has_open_hold(conn: psycopg.Connection[Any], customer_id: str, billing_period: str) -> bool:
    return bool(store.open_holds(conn, customer_id, billing_period))


# --------------------------------------------------------------------------- late usage


@dataclass(frozen=True)
class LateUsage:
    """A stored usage line that the customer's issued invoice of its period does not include.

    ``after_close`` is True when it was read at or after the offset of the close
    marker the issued revision was built up to (usage that arrived late); False
    means an earlier line the invoice lacks (a lost write; the replay will say).
    ``amount`` is exact, in ``currency`` units; ``recorded_at`` is when the worker
    stored it (UTC).
    """

    event_id: str
    customer_id: str
    billing_period: str
    amount: Decimal
    currency: str
    source_topic: str
    source_partition: int
    source_offset: int
    recorded_at: datetime
    invoice_id: str
    invoice_number: str
    revision: int
    after_close: bool


def late_usage(conn: psycopg.Connection[Any], period: str | None = None) -> list[LateUsage]:
    """Usage recorded for a (customer, period) whose issued invoice does not include it.

    The policy (docs/replay.md "Late usage"): late usage is stored by the worker,
    listed here (``invoicing status``) and in the next ``invoicing replay PERIOD
    --dry-run`` as "usage not invoiced", and invoiced by the next ``--apply`` as a
    credit note plus a new revision — after which it is no longer listed.

    Args:
        conn: any connection (read-only query; runs in the caller's transaction if any).
        period: ``YYYY-MM`` to restrict to one billing period; None for all.

    Returns:
        Rows ordered by period, customer, partition, offset.
    """
    with conn.cursor(row_factory=class_row(LateUsage)) as cur:
        return cur.execute(
            """
            SELECT u.event_id, u.customer_id, u.billing_period, u.amount, trim(u.currency) AS currency,
                   u.source_topic, u.source_partition, u.source_offset, u.recorded_at,
                   i.invoice_id::text AS invoice_id, i.invoice_number, i.revision,
                   (u.source_topic = i.source_topic AND u.source_partition = i.source_partition
                    AND u.source_offset >= i.close_offset) AS after_close
              FROM usage_lines u
              JOIN invoices i ON i.customer_id = u.customer_id
                             AND i.billing_period = u.billing_period
                             AND i.status = 'issued'
             WHERE (%(period)s::text IS NULL OR u.billing_period = %(period)s::text)
               AND NOT EXISTS (SELECT 1 FROM invoice_lines l
                                WHERE l.invoice_id = i.invoice_id AND l.event_id = u.event_id)
             ORDER BY u.billing_period, u.customer_id, u.source_partition, u.source_offset
            """,
            {"period": period},
        ).fetchall()
