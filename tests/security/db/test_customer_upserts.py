"""Finding 7, late resends restore old contact data (docs/security.md "Customer data"), on
PostgreSQL: ``customer.upserted`` was kept by highest offset, so a resend of an old upsert
(past the edge's idempotency window) restored the old email, and invoices went there.
Now deduplicated by event id and ordered by the event's own time (migration 0016).

Before the fix the third step stored ``old@acme.example`` again.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg

from streams.core.billing.stores import POSTGRES
from streams.settings import PostgresSettings
from tests.security.upserts import EXPECTED, late_resend_keeps_the_newer_email


def test_a_late_resend_of_an_old_upsert_never_restores_the_old_email(
    db: PostgresSettings,
) -> None:
    @contextlib.contextmanager
    def tx() -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(db.dsn("worker")) as conn:  # the role that writes customers
            yield conn

    customer = f"sec-{uuid.uuid4().hex[:8]}"
    seen = late_resend_keeps_the_newer_email(POSTGRES.usage, tx, customer, "t.sec.account-events")
    assert seen == EXPECTED
