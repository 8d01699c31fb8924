"""The contract of the document source (tests/contracts/documents.py) on PostgreSQL, in the
sandbox database of tests/integration/contracts/conftest.py: the harness writes a
document's rows (``invoices`` with its ``invoice_lines``, or ``credit_notes``) in one
transaction, as issuance does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from streams.adapters.documents.source import PostgresDocuments
from streams.core.domain.documents import Document
from tests.contracts.documents import DocumentsContract, DocumentsHarness


def put(pool: ConnectionPool[Any], doc: Document) -> None:
    with pool.connection() as conn, conn.transaction():
        put_in(conn, doc)


def put_in(conn: Any, doc: Document) -> None:
    """``doc``'s rows, in ``conn``'s open transaction."""
    if doc.kind == "credit_note":
        conn.execute(
            """
            INSERT INTO credit_notes (credit_note_id, credit_note_number, invoice_id,
                customer_id, billing_period, currency, subtotal, tax_total, total, reason,
                issued_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            (
                doc.document_id,
                doc.number,
                doc.credited_invoice_id,
                doc.customer_id,
                doc.billing_period,
                doc.currency,
                doc.subtotal,
                doc.tax_total,
                doc.total,
                doc.reason,
                doc.issued_at,
            ),
        )
        return
    taxes = [
        {
            "tax_code": t.code,
            "rate": str(t.rate),
            "taxable_amount": str(t.taxable_amount),
            "amount": str(t.amount),
        }
        for t in doc.taxes
    ]
    conn.execute(
        """
        INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period,
            revision, status, customer_name, email, currency, line_count, subtotal,
            tax_total, total, taxes, close_event_id, source_topic, source_partition,
            close_offset, issued_at, supersedes_invoice_id)
        VALUES (%s, %s, %s, %s, %s, 'issued', %s, 'ap@customer.example', %s, %s, %s, %s,
                %s, %s, %s, 'contract.account-events', 0, 0, %s, %s)
        """,
        (
            doc.document_id,
            doc.number,
            doc.customer_id,
            doc.billing_period,
            doc.revision,
            doc.customer_name,
            doc.currency,
            doc.line_count,
            doc.subtotal,
            doc.tax_total,
            doc.total,
            json.dumps(taxes),
            f"close-{doc.document_id}",
            doc.issued_at,
            doc.supersedes_invoice_id,
        ),
    )
    for n, line in enumerate(doc.lines, start=1):
        conn.execute(
            """
            INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, quantity,
                unit, description, tax_code, tax_rate, tax, source_topic,
                source_partition, source_offset)
            VALUES (%s, %s, %s, %s, %s, %s, %s, 'US-WA-STD', 0.065, 0,
                    'contract.account-events', 0, %s)
            """,
            (
                doc.document_id,
                n,
                f"{doc.document_id}-{n}",
                line.amount,
                line.quantity,
                line.unit,
                line.description,
                n,
            ),
        )


class TestPostgresDocuments(DocumentsContract):
    @pytest.fixture
    def harness(self, sandbox_pool: ConnectionPool[Any]) -> DocumentsHarness:
        # A revision is superseded only in the transaction that inserts its successor (a
        # deferred check of migration 0018, as a replay writes them): a "superseded" status
        # waits for the next document put and is written in its transaction.
        pending: list[tuple[str, str]] = []

        def set_status(invoice_id: str, status: str) -> None:
            if status == "superseded":
                pending.append((invoice_id, status))
                return
            with sandbox_pool.connection() as conn, conn.transaction():
                conn.execute(
                    "UPDATE invoices SET status = %s WHERE invoice_id = %s", (status, invoice_id)
                )

        def put_doc(doc: Document) -> None:
            if not pending:
                put(sandbox_pool, doc)
                return
            with sandbox_pool.connection() as conn, conn.transaction():
                for invoice_id, status in pending:
                    conn.execute(
                        "UPDATE invoices SET status = %s WHERE invoice_id = %s",
                        (status, invoice_id),
                    )
                pending.clear()
                put_in(conn, doc)

        return DocumentsHarness(PostgresDocuments(sandbox_pool), put_doc, set_status)
