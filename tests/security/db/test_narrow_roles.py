"""Finding 6, roles wider than their code (docs/security.md "Roles"), on PostgreSQL
(migration 0018): the replay role could set any issued invoice ``voided`` (no code does)
or ``superseded`` without a successor revision; the admin role published price books, and
``published_by`` / ``published_at`` were what the client sent.

Before the fix: the replay's UPDATEs went through, the admin's price book insert too, and
the pricing login did not exist.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from psycopg import errors

from streams.settings import PostgresSettings

_INVOICE = """
    INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period, revision,
        status, customer_name, email, currency, line_count, subtotal, tax_total, total,
        taxes, close_event_id, source_topic, source_partition, close_offset,
        supersedes_invoice_id)
    VALUES (%s, %s, %s, '2026-01', %s, 'issued', 'Name', 'n@customers.invalid', 'USD',
            0, 10, 1, 11, '[]', 'close', 'events', 0, 9, %s)
"""
_CREDIT = """
    INSERT INTO credit_notes (credit_note_id, credit_note_number, invoice_id, customer_id,
        billing_period, currency, subtotal, tax_total, total, reason)
    VALUES (%s, %s, %s, %s, '2026-01', 'USD', -10, -1, -11, 'replay')
"""


def _issued(db: PostgresSettings) -> tuple[str, str]:
    """An issued revision 1 (as the owner): (invoice id, customer id)."""
    invoice_id, customer = str(uuid.uuid4()), f"c-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(db.dsn("owner"), autocommit=True) as conn:
        conn.execute(_INVOICE, (invoice_id, f"INV-S-{invoice_id[:8]}", customer, 1, None))
    return invoice_id, customer


def _status(db: PostgresSettings, invoice_id: str) -> Any:
    with psycopg.connect(db.dsn("owner"), autocommit=True) as conn:
        row = conn.execute("SELECT status FROM invoices WHERE invoice_id = %s", (invoice_id,))
        return row.fetchone()


@pytest.mark.parametrize("status", ["voided", "superseded"])
def test_the_replay_may_not_update_an_invoice_directly(db: PostgresSettings, status: str) -> None:
    invoice_id, _ = _issued(db)
    with (
        psycopg.connect(db.dsn("replay"), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        conn.execute("UPDATE invoices SET status = %s WHERE invoice_id = %s", (status, invoice_id))
    assert _status(db, invoice_id) == ("issued",)


def test_supersede_needs_the_successor(db: PostgresSettings) -> None:
    invoice_id, customer = _issued(db)
    # no successor: refused at commit
    with psycopg.connect(db.dsn("replay")) as conn:
        assert conn.execute("SELECT supersede_invoice(%s)", (invoice_id,)).fetchone() == (True,)
        with pytest.raises(errors.IntegrityConstraintViolation, match="without a successor"):
            conn.commit()
    assert _status(db, invoice_id) == ("issued",)
    # credit note, supersede, successor, in one transaction (as issuance does): committed
    successor = str(uuid.uuid4())
    with psycopg.connect(db.dsn("replay")) as conn:
        conn.execute(_CREDIT, (str(uuid.uuid4()), f"CN-S-{invoice_id[:8]}", invoice_id, customer))
        assert conn.execute("SELECT supersede_invoice(%s)", (invoice_id,)).fetchone() == (True,)
        conn.execute(_INVOICE, (successor, f"INV-S-{successor[:8]}", customer, 2, invoice_id))
        conn.commit()
    assert _status(db, invoice_id) == ("superseded",)
    assert _status(db, successor) == ("issued",)
    with psycopg.connect(db.dsn("replay"), autocommit=True) as conn:  # no longer issued
        assert conn.execute("SELECT supersede_invoice(%s)", (invoice_id,)).fetchone() == (False,)


def test_even_the_owner_may_not_supersede_without_a_successor(db: PostgresSettings) -> None:
    invoice_id, _ = _issued(db)
    with (
        psycopg.connect(db.dsn("owner"), autocommit=True) as conn,
        pytest.raises(errors.IntegrityConstraintViolation, match="without a successor"),
    ):
        conn.execute(
            "UPDATE invoices SET status = 'superseded' WHERE invoice_id = %s", (invoice_id,)
        )
    assert _status(db, invoice_id) == ("issued",)


def test_only_the_pricing_role_publishes_and_the_database_says_who_and_when(
    db: PostgresSettings,
) -> None:
    code = f"m_{uuid.uuid4().hex[:8]}"
    with (
        psycopg.connect(db.dsn("admin"), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):
        conn.execute(
            "INSERT INTO billable_metrics (metric_code, definition, content_sha256) "
            "VALUES (%s, '{}', repeat('a', 64))",
            (code,),
        )
    with (
        psycopg.connect(db.dsn("pricing"), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege),
    ):  # the stamp is not the client's
        conn.execute(
            "INSERT INTO billable_metrics (metric_code, definition, content_sha256, "
            "published_at, published_by) VALUES (%s, '{}', repeat('a', 64), '2001-01-01Z', 'someone')",
            (code,),
        )
    with psycopg.connect(db.dsn("pricing")) as conn:
        conn.execute(
            "INSERT INTO billable_metrics (metric_code, definition, content_sha256) "
            "VALUES (%s, '{}', repeat('a', 64))",
            (code,),
        )
        stamped = conn.execute(
            "SELECT published_by, published_at = now() FROM billable_metrics WHERE metric_code = %s",
            (code,),
        ).fetchone()
        conn.commit()
    assert stamped == (db.pricing.user, True)
