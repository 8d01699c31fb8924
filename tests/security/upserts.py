"""The scenario of finding 7 (late resends restore old contact data), for one store: the
customer changes their email, then the old ``customer.upserted`` is sent again (past the
edge's idempotency window it reaches the topic, at a higher offset)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from streams.core.billing.ports.stores import UsageStore
from streams.core.billing.rows import SourceCoordinates
from streams.core.domain.events import CustomerUpserted

OLD_TIME = datetime(2026, 1, 1, 9, tzinfo=UTC)
NEW_TIME = datetime(2026, 1, 20, 9, tzinfo=UTC)


def upserted(customer: str, email: str) -> CustomerUpserted:
    return CustomerUpserted(customer_id=customer, name="Acme", email=email, currency="USD")


def late_resend_keeps_the_newer_email(
    store: UsageStore[Any], tx: Callable[[], Any], customer: str, topic: str
) -> list[str]:
    """The stored email after each step (``tx()``: a context manager yielding a connection
    in a transaction that commits on exit)."""
    seen: list[str] = []

    def step(event_id: str, email: str, offset: int, when: datetime) -> None:
        with tx() as conn:
            store.upsert_customer(
                conn, event_id, upserted(customer, email), SourceCoordinates(topic, 0, offset), when
            )
            got = store.get_customer(conn, customer)
            assert got is not None
            seen.append(got.email)

    step("cu-old", "old@acme.example", 10, OLD_TIME)
    step("cu-new", "new@acme.example", 11, NEW_TIME)
    step("cu-old", "old@acme.example", 50, OLD_TIME)  # the late resend, same id
    step("cu-older", "attacker@evil.example", 51, OLD_TIME)  # an old time under a new id
    step("cu-new", "new@acme.example", 52, NEW_TIME)  # the newest one resent: no change
    step("cu-newest", "newest@acme.example", 5, datetime(2026, 2, 1, tzinfo=UTC))
    return seen


EXPECTED = [
    "old@acme.example",
    "new@acme.example",
    "new@acme.example",
    "new@acme.example",
    "new@acme.example",
    "newest@acme.example",  # a newer event wins even from a lower offset
]
