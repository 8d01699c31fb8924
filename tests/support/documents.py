"""Store an invoice's row as issuance does, for tests that announce invoices on the invoices
topic themselves: the email sender renders each email's PDF from the stored document
(docs/email.md), and an ``invoice.issued`` never comes without its rows."""

from __future__ import annotations

import json
from typing import Any

import psycopg

from streams.core.domain.events import InvoiceIssued

__all__ = ["store_invoice"]


def store_invoice(conn: psycopg.Connection[Any], data: InvoiceIssued) -> None:
    """Insert ``data``'s ``invoices`` row (no lines; ``ON CONFLICT DO NOTHING``) on ``conn``
    (the owner). ``data.total`` must equal ``subtotal + tax_total`` (the table's check)."""
    conn.execute(
        """
        INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period,
            revision, status, customer_name, email, currency, line_count, subtotal,
            tax_total, total, taxes, close_event_id, source_topic, source_partition,
            close_offset, issued_at)
        VALUES (%s, %s, %s, %s, %s, 'issued', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 0, %s)
        ON CONFLICT DO NOTHING
        """,
        (
            data.invoice_id,
            data.invoice_number,
            data.customer_id,
            data.billing_period,
            data.revision,
            data.customer_name,
            data.email,
            data.currency,
            data.line_count,
            data.subtotal,
            data.tax_total,
            data.total,
            json.dumps([t.model_dump(mode="json") for t in data.taxes]),
            f"close-{data.invoice_id}",
            "test.account-events",
            data.issued_at,
        ),
    )
