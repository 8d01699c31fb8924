"""Finding 5, the outbox can publish anywhere (docs/security.md "The outbox"): Debezium's
EventRouter publishes each outbox row to the topic its ``aggregatetype`` names, so any login
that may insert outbox rows could put a record on the account events topic (a
``billing_period.closed`` past the edge and the close lease). Migration 0015's CHECK allows
only the invoices topic, under any dot-ended topic prefix (the test sandboxes' ``t<hex>.``).

Before the fix every insert below succeeded.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import errors

from streams.core.billing.store import invoices
from streams.settings import PostgresSettings, RoleName
from streams.topics import ACCOUNT_EVENTS, INVOICES, REGISTRY

#: The logins whose privileges include INSERT on the outbox (docs/roles.md), and the owner.
WRITERS: tuple[RoleName, ...] = ("owner", "worker", "replay")  # admin: no INSERT since 0022

REFUSED = [
    *(spec.name for spec in REGISTRY if spec is not INVOICES),
    *(spec.with_prefix("t1a2b3c.").name for spec in REGISTRY if spec is not INVOICES),
    "billing.invoices.v1.",
    "billing.invoices.v10",
    "xbilling.invoices.v1",
    "t1a2b3c..billing.invoices.v1",
    "../billing.invoices.v1",
    "billing.invoices.v1\n",
    "a/b.billing.invoices.v1",
    "x" * 240 + ".billing.invoices.v1",  # longer than Kafka's 249 characters
    "",
]
ALLOWED = [
    INVOICES.name,
    INVOICES.with_prefix("t1a2b3c.").name,
    INVOICES.with_prefix("test.run7.").name,
    INVOICES.with_prefix("test-close-ab12.").name,
]


def insert(conn: Any, topic: str, store: Any = invoices) -> None:
    """One outbox row routed to ``topic`` (``store``: the PostgreSQL one, or a twin's)."""
    store.insert_outbox_row(
        conn,
        event_id=str(uuid.uuid4()),
        topic=topic,
        customer_id="acme",
        event_type="billing_period.closed",
        payload=json.dumps({"customer_id": "acme", "billing_period": "2026-01"}),
        source="/security/test",
        time=datetime(2026, 2, 1, tzinfo=UTC),
        document_id=str(uuid.uuid4()),
    )


@pytest.mark.parametrize("role", WRITERS)
def test_no_outbox_row_routes_to_another_topic_than_the_invoices_one(
    db: PostgresSettings, role: RoleName
) -> None:
    with psycopg.connect(db.dsn(role), autocommit=True) as conn:
        for topic in REFUSED:
            with pytest.raises(errors.CheckViolation, match="outbox_routes_to_invoices"):
                insert(conn, topic)
    with psycopg.connect(db.dsn("owner"), autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM outbox WHERE aggregatetype = ANY(%s)", (REFUSED,)
        ).fetchone()
    assert found == (0,)


@pytest.mark.parametrize("role", WRITERS)
def test_the_invoices_topic_under_any_prefix_is_still_allowed(
    db: PostgresSettings, role: RoleName
) -> None:
    with psycopg.connect(db.dsn(role), autocommit=True) as conn:
        for topic in ALLOWED:
            insert(conn, topic)


def test_the_route_rule_is_a_constraint_of_the_table(db: PostgresSettings) -> None:
    """A CHECK of the table (not a trigger a data fix disables in passing), for every role."""
    with psycopg.connect(db.dsn("owner"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'outbox_routes_to_invoices' AND conrelid = 'outbox'::regclass"
        ).fetchone()
    assert row is not None, "outbox has no outbox_routes_to_invoices constraint"
    assert "aggregatetype" in row[0]
    assert ACCOUNT_EVENTS.name not in row[0]
