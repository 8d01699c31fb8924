"""Contract of the :class:`~streams.core.billing.ports.HoldStore` port (``invoice_holds``).

Run on the twin (:mod:`streams.adapters.memory.store.holds`) and on PostgreSQL
(:mod:`streams.core.billing.store.holds`, a sandbox database).
"""

from __future__ import annotations

import psycopg
import pytest

from streams.core.billing.rows import SourceCoordinates
from tests.contracts.stores import PERIOD, StoreHarness, unique


class HoldStoreContract:
    """The hold store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_a_hold_blocks_its_period_and_one_without_a_period_blocks_all(
        self, harness: StoreHarness
    ) -> None:
        customer, topic = unique("c"), unique("t")
        h = harness.stores.holds
        with harness.tx() as conn:
            assert not h.has_open_hold(conn, customer, PERIOD)
            h.record_hold(
                conn,
                customer_id=customer,
                billing_period=PERIOD,
                reason="bad usage",
                event_id="e-1",
                source=SourceCoordinates(topic, 2, 40),
            )
            assert h.has_open_hold(conn, customer, PERIOD)
            assert not h.has_open_hold(conn, customer, "2026-02")
            h.record_hold(
                conn,
                customer_id=customer,
                billing_period=None,
                reason="undecodable",
                event_id=None,
                source=SourceCoordinates(topic, 2, 41),
            )
            assert h.has_open_hold(conn, customer, "2026-02")
            holds = h.open_holds(conn, customer, PERIOD)
            assert customer in h.held_customers(conn, "2026-07")
            assert customer in h.held_customers(conn, PERIOD)
        assert [(x.billing_period, x.reason, x.source_offset) for x in holds] == [
            (PERIOD, "bad usage", 40),
            (None, "undecodable", 41),
        ]
        assert holds[0].hold_id < holds[1].hold_id
        assert (holds[0].customer_id, holds[0].source_topic, holds[0].source_partition) == (
            customer,
            topic,
            2,
        )
        assert holds[0].created_at.tzinfo is not None

    def test_one_hold_per_source_record_and_customer(self, harness: StoreHarness) -> None:
        a, b, topic = unique("c"), unique("c"), unique("t")
        source = SourceCoordinates(topic, 0, 7)
        h = harness.stores.holds
        with harness.tx() as conn:
            for customer in (a, a, b):  # a redelivered record, and a second customer of it
                h.record_hold(
                    conn,
                    customer_id=customer,
                    billing_period=PERIOD,
                    reason="x" * 3000,
                    event_id=None,
                    source=source,
                )
            assert len(h.open_holds(conn, a, PERIOD)) == 1
            (held_b,) = h.open_holds(conn, b, PERIOD)
            assert {a, b} <= h.held_customers(conn, PERIOD)
        assert len(held_b.reason) == 2000  # cut, as the column's writers do

    def test_other_customers_are_not_held(self, harness: StoreHarness) -> None:
        customer = unique("c")
        with harness.tx() as conn:
            assert harness.stores.holds.open_holds(conn, customer, PERIOD) == []
            assert customer not in harness.stores.holds.held_customers(conn, PERIOD)

    def test_an_invalid_period_is_refused(self, harness: StoreHarness) -> None:
        with pytest.raises(psycopg.errors.CheckViolation), harness.tx() as conn:
            harness.stores.holds.record_hold(
                conn,
                customer_id=unique("c"),
                billing_period="2026-1",
                reason="r",
                event_id=None,
                source=SourceCoordinates(unique("t"), 0, 0),
            )
