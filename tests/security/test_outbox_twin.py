"""Finding 5 on the memory twin (docs/security.md "The outbox"): the twin's outbox refuses
the rows PostgreSQL's ``outbox_routes_to_invoices`` refuses (tests/security/db/
test_outbox_routes.py has the same lists against the real database)."""

from __future__ import annotations

import pytest
from psycopg import errors

from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.stores import MEMORY
from streams.topics import is_outbox_route
from tests.security.db.test_outbox_routes import ALLOWED, REFUSED, insert


def test_the_route_rule_refuses_every_other_topic() -> None:
    assert [t for t in REFUSED if is_outbox_route(t)] == []
    assert [t for t in ALLOWED if not is_outbox_route(t)] == []


@pytest.mark.parametrize("topic", REFUSED)
def test_the_twin_outbox_refuses_other_topics(topic: str) -> None:
    db = InMemoryDatabase()
    with (
        pytest.raises(errors.CheckViolation, match="outbox_routes_to_invoices"),
        db.connection() as conn,
    ):
        insert(conn, topic, MEMORY.invoices)
    with db.connection() as conn:
        for allowed in ALLOWED:
            insert(conn, allowed, MEMORY.invoices)
