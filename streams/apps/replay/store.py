"""The replay's own PostgreSQL statements (psycopg 3): its run state (``replay_runs``,
``replay_results``) and its read of the issued state it compares against.

Every function takes an open connection and runs inside the caller's
transaction; the apply's write transactions start with the lease's fence check
(:mod:`streams.core.billing.fencing`). Invoices, credit notes, their lines, numbers,
outbox rows, holds and usage are read and written with the billing kernel's
stores (:mod:`streams.core.billing.store`), the statements the worker uses, so both
writers use the same unique keys.

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

from streams.apps.replay.diff import IssuedCharge, IssuedInvoice, IssuedLine

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


@dataclass(frozen=True)
class _IssuedHead:
    invoice_id: str
    invoice_number: str
    revision: int
    customer_id: str
    currency: str
    subtotal: Decimal
    tax_total: Decimal
    total: Decimal
    line_count: int
    source_partition: int
    close_offset: int


@dataclass(frozen=True)
class _IssuedLineRow:
    invoice_id: str
    event_id: str
    amount: Decimal
    source_partition: int
    source_offset: int


@dataclass(frozen=True)
class _IssuedChargeRow:
    invoice_id: str
    line_id: str
    description: str
    amount: Decimal


def issued_invoices(
    conn: psycopg.Connection[Any],
    billing_period: str,
    topic: str,
    customer_id: str | None = None,
) -> dict[str, IssuedInvoice]:
    """customer → the issued revision of ``billing_period`` built from ``topic``, with its
    lines and charge lines (only ``customer_id``'s when given): the replay's comparison model
    (:class:`streams.apps.replay.diff.IssuedInvoice`)."""
    params = {"period": billing_period, "topic": topic, "customer": customer_id}
    with conn.cursor(row_factory=class_row(_IssuedHead)) as cur:
        heads = cur.execute(
            """
            SELECT invoice_id::text, invoice_number, revision, customer_id,
                   trim(currency) AS currency, subtotal, tax_total, total, line_count,
                   source_partition, close_offset
              FROM invoices
             WHERE billing_period = %(period)s AND status = 'issued' AND source_topic = %(topic)s
               AND (%(customer)s::text IS NULL OR customer_id = %(customer)s::text)
            """,
            params,
        ).fetchall()
    lines: dict[str, list[IssuedLine]] = defaultdict(list)
    with conn.cursor(row_factory=class_row(_IssuedLineRow)) as cur:
        for line in cur.execute(
            """
            SELECT l.invoice_id::text, l.event_id, l.amount, l.source_partition, l.source_offset
              FROM invoice_lines l JOIN invoices i ON i.invoice_id = l.invoice_id
             WHERE i.billing_period = %(period)s AND i.status = 'issued' AND i.source_topic = %(topic)s
               AND (%(customer)s::text IS NULL OR i.customer_id = %(customer)s::text)
             ORDER BY l.invoice_id, l.line_no
            """,
            params,
        ):
            lines[line.invoice_id].append(
                IssuedLine(line.event_id, line.amount, line.source_partition, line.source_offset)
            )
    charges: dict[str, list[IssuedCharge]] = defaultdict(list)
    with conn.cursor(row_factory=class_row(_IssuedChargeRow)) as cur:
        for charge in cur.execute(
            """
            SELECT c.invoice_id::text, c.line_id::text, c.description, c.amount
              FROM invoice_charges c JOIN invoices i ON i.invoice_id = c.invoice_id
             WHERE i.billing_period = %(period)s AND i.status = 'issued' AND i.source_topic = %(topic)s
               AND (%(customer)s::text IS NULL OR i.customer_id = %(customer)s::text)
             ORDER BY c.invoice_id, c.line_no
            """,
            params,
        ):
            charges[charge.invoice_id].append(
                IssuedCharge(charge.line_id, charge.description, charge.amount)
            )
    return {
        head.customer_id: IssuedInvoice(
            invoice_id=head.invoice_id,
            invoice_number=head.invoice_number,
            revision=head.revision,
            customer_id=head.customer_id,
            currency=head.currency,
            subtotal=head.subtotal,
            tax_total=head.tax_total,
            total=head.total,
            line_count=head.line_count,
            source_partition=head.source_partition,
            close_offset=head.close_offset,
            lines=tuple(lines.get(head.invoice_id, ())),
            charges=tuple(charges.get(head.invoice_id, ())),
        )
        for head in heads
    }
