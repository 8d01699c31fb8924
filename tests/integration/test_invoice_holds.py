"""Holds that can be released, against a real (own, migrated) PostgreSQL database.

1. An invoice refused for its data must be refused *before* the tax call: the
   tax document is committed under ``<invoice id>:r<revision>``, the same key for
   every attempt at the revision, so a document committed for refused data would
   meet the corrected data (after ``invoicing holds release``) with a 409 and
   hold the customer again, for ever (streams/apps/invoicing/jobs.py).
2. One dead-lettered record can hold several customers (its key and its
   ``ce_subject`` differ): one hold row per (record, customer), idempotent on
   redelivery (migration 0004, ``streams.core.billing.store.holds.record_hold``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import ConnectionPool

from streams.adapters.memory.tax import InMemoryTaxService
from streams.adapters.postgres import migrate
from streams.apps.invoicing.jobs import JobContext, Outcome, run_invoice_job
from streams.core.billing import fencing, rows, store
from streams.core.billing.store.holds import record_hold
from streams.core.domain.events import CustomerUpserted, UsageRecorded
from streams.devtools.sandbox.pipeline import _drop_database
from streams.settings import Settings

TOPIC = "events"
PERIOD = "2025-01"


@pytest.fixture
def pool(settings: Settings, unique: str) -> Iterator[ConnectionPool[Any]]:
    """A pool of the invoicing worker's role on a fresh database of this test (created by
    the provisioner, owned by the owner), migrated to head with its grants."""
    database = f"inv_{unique}"
    with psycopg.connect(settings.postgres.dsn("provisioner"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(settings.postgres.owner.user)
            )
        )
    pg = settings.postgres.model_copy(update={"database": database})
    try:
        migrate.upgrade(pg)
        with ConnectionPool(
            pg.dsn("worker"), min_size=1, max_size=4, kwargs={"autocommit": False}
        ) as p:
            yield p
    finally:
        _drop_database(settings.postgres, database)


def customer(customer_id: str, currency: str) -> CustomerUpserted:
    return CustomerUpserted(
        customer_id=customer_id,
        name="Customer",
        email=f"{customer_id}@example.test",
        currency=currency,
    )


def usage(customer_id: str, amount: str, currency: str) -> UsageRecorded:
    return UsageRecorded(
        customer_id=customer_id,
        billing_period=PERIOD,
        amount=Decimal(amount),
        currency=currency,
        region_id="us-east-1",
        event_time=datetime(2025, 1, 15, tzinfo=UTC),
    )


def at(offset: int) -> rows.SourceCoordinates:
    return rows.SourceCoordinates(TOPIC, 0, offset)


def test_an_invoice_refused_for_its_data_is_invoiced_once_the_data_is_fixed(
    pool: ConnectionPool[Any], unique: str
) -> None:
    cust = f"c-{unique}"
    token = fencing.FencingToken(f"g-{unique}", TOPIC, 0, 1, "member-1")
    tax = InMemoryTaxService()
    ctx = JobContext(pool=pool, tax=tax, invoices_topic="test.billing.invoices.v1")
    with pool.connection() as conn:
        fencing.claim(conn, token)
        with conn.transaction():
            store.usage.upsert_customer(conn, "cu-1", customer(cust, "EUR"), at(0))
            store.usage.insert_usage(
                conn,
                [
                    rows.UsageRecord("u-1", usage(cust, "10.00", "USD"), at(1)),
                    rows.UsageRecord("u-2", usage(cust, "2.50", "USD"), at(2)),
                ],
            )

    first = rows.CloseMarker("close-1", cust, PERIOD, "period_end", at(3))
    refused = run_invoice_job(ctx, first, token, threading.Event())
    assert refused.outcome is Outcome.FAILED
    assert "currency" in refused.detail
    assert tax.calls == []  # refused before any tax document was committed

    # The operator fixes the customer's currency, releases the hold: a new marker.
    with pool.connection() as conn, conn.transaction():
        store.usage.upsert_customer(conn, "cu-2", customer(cust, "USD"), at(4))
    again = rows.CloseMarker("close-2", cust, PERIOD, "hold_released", at(5))
    result = run_invoice_job(ctx, again, token, threading.Event())
    assert result.outcome is Outcome.INVOICED, result.detail
    assert [c.outcome for c in tax.calls] == ["ok"]
    with pool.connection() as conn:
        issued = store.invoices.current_invoice(conn, cust, PERIOD)
    assert issued is not None and issued.subtotal == Decimal("12.50")


def test_one_dead_lettered_record_holds_each_customer_it_names_once(
    pool: ConnectionPool[Any],
) -> None:
    source = at(9)
    for _redelivery in range(2):
        with pool.connection() as conn, conn.transaction():
            for cust in ("by-key", "by-subject"):
                record_hold(
                    conn,
                    customer_id=cust,
                    billing_period=PERIOD,
                    reason="dead-lettered: key differs from ce_subject",
                    event_id="e-9",
                    source=source,
                )
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT customer_id FROM invoice_holds WHERE source_offset = 9 ORDER BY 1"
        ).fetchall()
        held = [
            cust
            for cust in ("by-key", "by-subject", "someone-else")
            if store.holds.open_holds(conn, cust, PERIOD)
        ]
    assert rows == [("by-key",), ("by-subject",)]
    assert held == ["by-key", "by-subject"]
