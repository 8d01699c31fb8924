"""Usage deduplication against the real database (rolled back after each test)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import psycopg

from streams.domain.events import UsageRecorded
from streams.invoicing.store import SourceCoordinates, UsageRecord, insert_usage
from streams.settings import Settings


def _usage(customer: str, event_id: str, amount: str, offset: int) -> UsageRecord:
    data = UsageRecorded(
        customer_id=customer,
        billing_period="2026-01",
        amount=Decimal(amount),
        currency="USD",
        event_time=datetime(2026, 1, 2, tzinfo=UTC),
    )
    return UsageRecord(event_id, data, SourceCoordinates("t", 0, offset))


def test_duplicate_after_a_conflict_in_one_batch_is_not_a_conflict(
    settings: Settings, unique: str
) -> None:
    customer, event_id = f"c-{unique}", f"e-{unique}"
    with psycopg.connect(settings.postgres.dsn()) as conn:
        try:
            assert insert_usage(conn, [_usage(customer, event_id, "1.00", 1)]) == []
            batch = [_usage(customer, event_id, "9.99", 2), _usage(customer, event_id, "1.00", 3)]
            conflicts = insert_usage(conn, batch)
            assert [c.record.source.offset for c in conflicts] == [2]
            assert conflicts[0].stored_source.offset == 1
        finally:
            conn.rollback()


def test_first_occurrence_in_a_batch_wins(settings: Settings, unique: str) -> None:
    customer, event_id = f"c-{unique}", f"e-{unique}"
    with psycopg.connect(settings.postgres.dsn()) as conn:
        try:
            batch = [
                _usage(customer, event_id, "2.00", 5),
                _usage(customer, event_id, "2.00", 6),
                _usage(customer, event_id, "3.00", 7),
            ]
            conflicts = insert_usage(conn, batch)
            assert [c.record.source.offset for c in conflicts] == [7]
            amount = conn.execute(
                "SELECT amount, source_offset FROM usage_lines WHERE event_id = %s", (event_id,)
            ).fetchone()
            assert amount == (Decimal("2.00"), 5)
        finally:
            conn.rollback()
