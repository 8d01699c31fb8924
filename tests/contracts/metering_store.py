"""Contracts of the :class:`~streams.core.billing.ports.MeteringStore` port
(``metered_usage``, ``subscription_events``) and the
:class:`~streams.core.billing.ports.PriceBookStore` port (``billable_metrics``,
``plan_versions``).

Run on the twins (:mod:`streams.adapters.memory.store.metering`,
:mod:`~streams.adapters.memory.store.pricing`) and on PostgreSQL
(:mod:`streams.core.billing.store.metering`, :mod:`~streams.core.billing.store.pricing`, a
sandbox database).
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from streams.core.billing.rows import MeteredRecord, SourceCoordinates, SubscriptionRecord
from streams.core.domain.events import SubscriptionChanged, SubscriptionStarted, UsageMetered
from streams.core.domain.rating.book_yaml import load_price_book
from streams.core.domain.rating.published import entries_of
from tests.contracts.stores import PERIOD, StoreHarness, unique

BOOK = Path(__file__).resolve().parents[2] / "examples" / "pricing" / "price-book.yaml"


def metered(
    customer: str,
    event_id: str,
    offset: int,
    *,
    topic: str,
    calls: str = "1",
    day: int = 2,
    partition: int = 1,
) -> MeteredRecord:
    return MeteredRecord(
        event_id,
        UsageMetered(
            customer_id=customer,
            metric="api_calls",
            event_time=datetime(2026, 1, day, 12, tzinfo=UTC),
            properties={"region": "eu"},
            values={"calls": Decimal(calls)},
        ),
        SourceCoordinates(topic, partition, offset),
    )


def subscription(
    customer: str, event_id: str, offset: int, *, topic: str, version: int = 1
) -> SubscriptionRecord:
    model = SubscriptionStarted if version == 1 else SubscriptionChanged
    return SubscriptionRecord(
        event_id,
        model(
            customer_id=customer,
            effective_at=datetime(2025, 12, 1, tzinfo=UTC),
            plan_code="growth",
            plan_version=version,
        ),
        SourceCoordinates(topic, 1, offset),
    )


class MeteringStoreContract:
    """The metering store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_metered_events_dedup_by_id_and_conflicts_keep_the_first(
        self, harness: StoreHarness
    ) -> None:
        customer, topic = unique("c"), unique("t")
        m = harness.stores.metering
        with harness.tx() as conn:
            assert m.insert_metered(conn, []) == []
            first = metered(customer, "m-1", 10, topic=topic, calls="10")
            assert m.insert_metered(conn, [first, metered(customer, "m-2", 11, topic=topic)]) == []
            # the same payload again (10.0 is 10: canonical decimals) is a no-op
            assert (
                m.insert_metered(conn, [metered(customer, "m-1", 12, topic=topic, calls="10.0")])
                == []
            )
            conflicts = m.insert_metered(
                conn, [metered(customer, "m-1", 13, topic=topic, calls="11")]
            )
        assert [(c.record.source.offset, c.stored_source.offset) for c in conflicts] == [(13, 10)]
        assert conflicts[0].stored_sha256 == first.payload_sha256
        assert conflicts[0].billing_period == PERIOD

    def test_metered_before_selects_customer_period_partition_and_offsets_below(
        self, harness: StoreHarness
    ) -> None:
        customer, other, topic = unique("c"), unique("c"), unique("t")
        m = harness.stores.metering
        with harness.tx() as conn:
            m.insert_metered(
                conn,
                [
                    metered(customer, unique("m"), 5, topic=topic, calls="2"),
                    metered(customer, unique("m"), 9, topic=topic, calls="3"),
                    metered(customer, unique("m"), 20, topic=topic),  # after the marker
                    metered(other, unique("m"), 6, topic=topic),
                    metered(customer, unique("m"), 7, topic=unique("t")),
                    metered(customer, unique("m"), 3, topic=topic, calls="7", partition=4),
                ],
            )
            read = m.metered_before(conn, customer, PERIOD, topic, 1, 20)
            none = m.metered_before(conn, customer, "2026-02", topic, 1, 20)
            elsewhere = m.metered_elsewhere(conn, customer, PERIOD, topic, 1)
            not_elsewhere = m.metered_elsewhere(conn, customer, PERIOD, topic, 4)
        assert sorted(e.values["calls"] for e in read.events) == [Decimal(2), Decimal(3)]
        assert (read.first_offset, read.last_offset) == (5, 9)
        assert read.events[0].properties == {"region": "eu"}
        assert (none.events, none.first_offset, none.last_offset) == ([], None, None)
        assert [e.values["calls"] for e in elsewhere.events] == [Decimal(7)]
        assert len(not_elsewhere.events) == 3  # partition 1's, every offset

    def test_subscriptions_before_in_partition_order_with_conflicts(
        self, harness: StoreHarness
    ) -> None:
        customer, topic = unique("c"), unique("t")
        m = harness.stores.metering
        with harness.tx() as conn:
            assert (
                m.insert_subscriptions(
                    conn,
                    [
                        subscription(customer, "s-2", 8, topic=topic, version=2),
                        subscription(customer, "s-1", 3, topic=topic),
                        subscription(customer, "s-3", 30, topic=topic, version=2),
                    ],
                )
                == []
            )
            conflicts = m.insert_subscriptions(
                conn, [subscription(customer, "s-1", 31, topic=topic, version=2)]
            )
            found = m.subscriptions_before(conn, customer, topic, 1, 30)
        assert [type(s).__name__ for s in found] == ["SubscriptionStarted", "SubscriptionChanged"]
        assert [(c.record.event_id, c.stored_source.offset) for c in conflicts] == [("s-1", 3)]
        assert conflicts[0].billing_period is None


class PriceBookStoreContract:
    """The price book store's contract (what the invoice job reads)."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_published_entries_make_the_book_and_the_fingerprint_counts_them(
        self, harness: StoreHarness
    ) -> None:
        book = load_price_book(BOOK.read_text(encoding="utf-8"), source=str(BOOK))
        entries = entries_of(book, published_at=datetime(2026, 1, 1, tzinfo=UTC))
        p = harness.stores.pricing
        with harness.tx() as conn:
            before = p.book_fingerprint(conn)
            inserted = p.insert_entries(conn, entries, published_by="contract")
            again = p.insert_entries(conn, entries, published_by="contract")
            after = p.book_fingerprint(conn)
            stored = p.published_book(conn)
        assert inserted > 0 or before != (0, 0)
        assert again == 0
        assert sum(after) == sum(before) + inserted
        assert after >= (len(book.metrics), sum(len(p.versions) for p in book.plans))
        assert {m.code for m in book.metrics} <= {m.code for m in stored.metrics}
        assert {p.code for p in book.plans} <= {p.code for p in stored.plans}
