"""Invoice numbers taken last (migration 0025, docs/decisions/0006-gapless-invoice-numbers.md
"Number last") on the real PostgreSQL, connected as the worker's role.

- an invoice inserted under ``PENDING-<id>`` and numbered by ``number_invoice`` gets the
  period's next number, formatted as :func:`invoice_number` formats it (also past
  999,999);
- an invoice cannot be committed under its provisional number; a rollback after the
  number gives it back;
- only the inserting transaction may number an invoice, once; no other change of an
  invoice gets through the guard;
- a number already used is :class:`InvoiceNumberTaken`;
- the serial point moved: an issuance of the same period commits while another one
  has written its invoice and lines but not taken its number yet.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from streams.core.billing.store.invoices import (
    InvoiceNumberTaken,
    invoice_number,
    number_invoice,
    pending_number,
)
from streams.settings import PostgresSettings, RoleName, Settings
from tests.support.roles import migrated_database


@pytest.fixture(scope="module")
def db(settings: Settings) -> Iterator[PostgresSettings]:
    with migrated_database(settings.postgres, f"numbers_{uuid.uuid4().hex[:10]}") as pg:
        yield pg


def connect(pg: PostgresSettings, role: RoleName = "worker") -> psycopg.Connection[Any]:
    return psycopg.connect(pg.dsn(role))


def insert_pending(conn: psycopg.Connection[Any], period: str, *, lines: int = 1) -> str:
    """An invoice of ``period`` under its provisional number, with ``lines`` lines."""
    invoice_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period, "
        "revision, status, customer_name, email, currency, line_count, subtotal, tax_total, "
        "total, taxes, close_event_id, source_topic, source_partition, close_offset) "
        "VALUES (%s, %s, %s, %s, 1, 'issued', 'n', 'e', 'USD', %s, 2, 0, 2, '[]', "
        "'x', 'events', 0, 5)",
        (invoice_id, pending_number(invoice_id), f"c-{invoice_id[:8]}", period, lines),
    )
    for n in range(1, lines + 1):
        conn.execute(
            "INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, tax_code, "
            "tax_rate, tax, source_topic, source_partition, source_offset) "
            "VALUES (%s, %s, %s, 1, 'std', 0, 0, 'events', 0, %s)",
            (invoice_id, n, f"e-{n}", n),
        )
    return invoice_id


def stored_number(pg: PostgresSettings, invoice_id: str) -> str | None:
    with connect(pg, "owner") as conn:
        row = conn.execute(
            "SELECT invoice_number FROM invoices WHERE invoice_id = %s", (invoice_id,)
        ).fetchone()
    return None if row is None else str(row[0])


def period() -> str:
    """A period of its own per test (the counter series is per period)."""
    return f"{2100 + uuid.uuid4().int % 800:04d}-{1 + uuid.uuid4().int % 12:02d}"


def test_an_invoice_is_numbered_last_with_the_period_s_next_number(db: PostgresSettings) -> None:
    p = period()
    ids: list[str] = []
    for _ in range(3):
        with connect(db) as conn:
            invoice_id = insert_pending(conn, p, lines=2)
            assert number_invoice(conn, invoice_id, p) == invoice_number(p, len(ids) + 1)
        ids.append(invoice_id)
    assert [stored_number(db, i) for i in ids] == [invoice_number(p, n) for n in (1, 2, 3)]


def test_the_sql_format_equals_the_python_format_past_six_digits(db: PostgresSettings) -> None:
    p = period()
    with connect(db, "owner") as conn:
        conn.execute(
            "INSERT INTO document_counters (series, last_value) VALUES (%s, 999998)", (f"INV-{p}",)
        )
        conn.commit()
    got: list[str] = []
    for _ in range(2):
        with connect(db) as conn:
            got.append(number_invoice(conn, insert_pending(conn, p), p))
    assert got == [invoice_number(p, 999_999), invoice_number(p, 1_000_000)]
    assert got == [f"INV-{p}-999999", f"INV-{p}-1000000"]


def test_an_unnumbered_invoice_is_never_committed(db: PostgresSettings) -> None:
    p = period()
    conn = connect(db)
    try:
        invoice_id = insert_pending(conn, p)
        with pytest.raises(errors.IntegrityConstraintViolation, match="without its number"):
            conn.commit()
    finally:
        conn.close()
    assert stored_number(db, invoice_id) is None
    with connect(db) as conn:  # nothing was taken from the series
        assert number_invoice(conn, insert_pending(conn, p), p) == invoice_number(p, 1)


def test_a_rollback_after_the_number_gives_it_back(db: PostgresSettings) -> None:
    p = period()
    with connect(db) as conn:
        assert number_invoice(conn, insert_pending(conn, p), p) == invoice_number(p, 1)
        conn.rollback()
        kept = insert_pending(conn, p)
        assert number_invoice(conn, kept, p) == invoice_number(p, 1)
    assert stored_number(db, kept) == invoice_number(p, 1)


def test_only_the_inserting_transaction_numbers_an_invoice_and_only_once(
    db: PostgresSettings,
) -> None:
    p = period()
    with connect(db) as conn:
        invoice_id = insert_pending(conn, p)
        number_invoice(conn, invoice_id, p)
        conn.commit()
        with pytest.raises(errors.InsufficientPrivilege, match="no provisional number"):
            number_invoice(conn, invoice_id, p)  # committed and numbered: not this transaction's
        conn.rollback()
        other = insert_pending(conn, p)
        number_invoice(conn, other, p)
        with pytest.raises(errors.InsufficientPrivilege, match="no provisional number"):
            number_invoice(conn, other, p)  # numbered already
        conn.rollback()
        other = insert_pending(conn, p)
        with pytest.raises(errors.InsufficientPrivilege):
            # the worker may not update invoices itself, not even its own provisional one
            conn.execute(
                "UPDATE invoices SET invoice_number = %s WHERE invoice_id = %s",
                (f"INV-{p}-424242", other),
            )
        conn.rollback()
    assert stored_number(db, invoice_id) == invoice_number(p, 1)


@pytest.mark.parametrize(
    "change",
    [
        "invoice_number = 'OTHER-1'",  # not an INV- number
        "invoice_number = 'INV-X-1', total = 3, subtotal = 3",  # the number and more
    ],
)
def test_the_guard_lets_only_the_number_change_through(db: PostgresSettings, change: str) -> None:
    with connect(db, "owner") as conn:
        invoice_id = insert_pending(conn, period())
        with pytest.raises(errors.InsufficientPrivilege, match="immutable"):
            conn.execute(f"UPDATE invoices SET {change} WHERE invoice_id = %s", (invoice_id,))
        conn.rollback()


def test_a_number_already_used_is_an_error(db: PostgresSettings) -> None:
    p = period()
    with connect(db) as conn:
        number_invoice(conn, insert_pending(conn, p), p)
    with connect(db, "owner") as conn:
        conn.execute("UPDATE document_counters SET last_value = 0 WHERE series = %s", (f"INV-{p}",))
        conn.commit()
    with connect(db) as conn:
        with pytest.raises(InvoiceNumberTaken, match="already used"):
            number_invoice(conn, insert_pending(conn, p), p)
        conn.rollback()


def test_an_issuance_commits_while_another_has_not_taken_its_number(
    db: PostgresSettings,
) -> None:
    """With the number taken first, the second issuance would wait on the period's
    counter row until the first commits; it has 2 s before its lock timeout."""
    p = period()
    slow = connect(db)
    try:
        first = insert_pending(slow, p, lines=50)  # invoice and lines written, not numbered
        done: dict[str, Any] = {}

        def other() -> None:
            try:
                with connect(db) as conn:
                    conn.execute("SET lock_timeout = '2s'")
                    done["number"] = number_invoice(conn, insert_pending(conn, p, lines=50), p)
            except Exception as exc:  # reported below
                done["error"] = exc

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert done == {"number": invoice_number(p, 1)}
        assert number_invoice(slow, first, p) == invoice_number(p, 2)
        slow.commit()
    finally:
        slow.close()
    assert stored_number(db, first) == invoice_number(p, 2)
