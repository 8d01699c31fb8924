"""Contract of the :class:`~streams.core.billing.ports.CloseStore` port (``period_closes``).

Run on the twin (:mod:`streams.adapters.memory.store.closes`) and on PostgreSQL
(:mod:`streams.core.billing.store.closes`, a sandbox database).
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from streams.core.billing.rows import CloseMarker, SourceCoordinates
from tests.contracts.stores import PERIOD, StoreHarness, unique


def marker(customer: str, topic: str, period: str = PERIOD, offset: int = 9) -> CloseMarker:
    return CloseMarker(
        unique("close"), customer, period, "period_closed", SourceCoordinates(topic, 1, offset)
    )


class CloseStoreContract:
    """The close store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_closed_customers_by_period_and_topic(self, harness: StoreHarness) -> None:
        topic, a, b, elsewhere = unique("t"), unique("c"), unique("c"), unique("c")
        c = harness.stores.closes
        with harness.tx() as conn:
            assert c.closed_customers(conn, PERIOD, topic) == set()
            c.record_close(conn, marker(a, topic), "invoiced", str(uuid.uuid4()))
            c.record_close(conn, marker(b, topic), "held", None)
            c.record_close(conn, marker(b, topic, "2026-02"), "already_invoiced", None)
            c.record_close(conn, marker(elsewhere, unique("t")), "held", None)  # another topic
            assert c.closed_customers(conn, PERIOD, topic) == {a, b}
            assert c.closed_customers(conn, "2026-02", topic) == {b}

    def test_a_redelivered_marker_is_recorded_once(self, harness: StoreHarness) -> None:
        topic, customer = unique("t"), unique("c")
        m = marker(customer, topic)
        c = harness.stores.closes
        with harness.tx() as conn:
            c.record_close(conn, m, "invoiced", str(uuid.uuid4()))
            c.record_close(conn, m, "already_invoiced", None)  # no error: ON CONFLICT DO NOTHING
            assert c.closed_customers(conn, PERIOD, topic) == {customer}

    def test_an_unknown_outcome_is_refused(self, harness: StoreHarness) -> None:
        with pytest.raises(psycopg.errors.CheckViolation), harness.tx() as conn:
            harness.stores.closes.record_close(
                conn, marker(unique("c"), unique("t")), "maybe", None
            )
