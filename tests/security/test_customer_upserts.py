"""Finding 7, late resends restore old contact data (docs/security.md "Customer data"),
through the invoicing worker on the twins (in-memory Kafka and database): the worker passes
each ``customer.upserted``'s own time (its envelope's ``time``) to the store, so the late
resend of an old upsert, read at a higher offset, leaves the newer email. The same
scenario on the store alone, for the twin here and PostgreSQL in ``db/``.

Before the fix the worker stored whatever it read last (``old@acme.example``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from datetime import datetime

from streams.adapters.memory.database import InMemoryDatabase
from streams.adapters.memory.store import tables
from streams.adapters.memory.stores import MEMORY
from streams.core.domain.codec import encode
from streams.core.domain.events import Envelope
from streams.settings import Settings
from tests.security.upserts import (
    EXPECTED,
    NEW_TIME,
    OLD_TIME,
    late_resend_keeps_the_newer_email,
    upserted,
)
from tests.support.twins import Twins, drive, subscribe


def test_the_worker_keeps_the_newer_email_when_an_old_upsert_is_resent(
    settings: Settings,
) -> None:
    twins = Twins.create(settings)
    customer = twins.customer_on(3)

    def send(event_id: str, email: str, when: datetime) -> None:
        record = encode(
            Envelope.wrap(upserted(customer, email), id=event_id, source="/crm", time=when)
        )
        twins.kafka.append(
            twins.topic, key=record.key, value=record.value, headers=list(record.headers)
        )

    send("cu-old", "old@acme.example", OLD_TIME)
    send("cu-new", "new@acme.example", NEW_TIME)
    send("cu-old", "old@acme.example", OLD_TIME)  # the late resend
    send("cu-older", "attacker@evil.example", OLD_TIME)  # an old time under a new id
    worker = twins.worker()
    subscribe(worker)
    drive(
        worker,
        lambda: twins.committed().get(twins.partition_of(customer), 0) >= 4,
        what="the four upserts read and committed",
    )
    (row,) = [r for r in twins.rows(tables.CUSTOMERS) if r.customer_id == customer]
    assert (row.email, row.event_id) == ("new@acme.example", "cu-new")
    assert row.event_time == NEW_TIME


def test_the_twin_store_keeps_the_newer_email() -> None:
    db = InMemoryDatabase()

    @contextlib.contextmanager
    def tx() -> Iterator[object]:
        with db.connection() as conn:
            yield conn

    customer = f"sec-{uuid.uuid4().hex[:8]}"
    assert late_resend_keeps_the_newer_email(MEMORY.usage, tx, customer, "t.sec") == EXPECTED
