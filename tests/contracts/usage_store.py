"""Contract of the :class:`~streams.core.billing.ports.UsageStore` port (``customers``,
``usage_lines``) and of the :class:`~streams.core.billing.ports.Database` it runs on
(transactions: commit at the end of the block, rollback on an exception, savepoints).

Run on the twin (:mod:`streams.adapters.memory.store.usage`) and on PostgreSQL
(:mod:`streams.core.billing.store.usage`, a sandbox database). Folded in from
``tests/integration/test_store.py``: the two batch deduplication checks.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from streams.core.billing.rows import Customer, SourceCoordinates, UsageRow
from tests.contracts.stores import (
    EVENT_TIME,
    NO_FENCE,
    PERIOD,
    StoreHarness,
    customer_upserted,
    draft,
    line,
    unique,
    usage,
)


def hot_row(
    customer: str,
    event_id: str,
    amount: str,
    offset: int,
    topic: str,
    *,
    quantity: str | None = None,
    digest: str | None = None,
) -> UsageRow:
    """A hot-path row as the fast decoder gives it (text values, the time as written)."""
    values = (customer, PERIOD, amount, "USD", quantity, "GB" if quantity else None, None, None,
              "sku-1", 'Storage "cold"\\tier\nline 2', "eu-west-1", "Usage", "AWS",
              "2024-09-02T12:30:00+02:00")  # fmt: skip
    return UsageRow(
        event_id,
        values,
        datetime(2024, 9, 2, 10, 30, tzinfo=UTC),
        digest or ("0" * 63 + str(len(amount) % 10)),
        SourceCoordinates(topic, 0, offset),
    )


class Boom(Exception):
    pass


class UsageStoreContract:
    """The usage store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    # ------------------------------------------------------------------ usage, deduplicated

    def test_new_usage_is_stored_and_read_back_exactly(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        first = usage(
            customer,
            unique("e"),
            "0.000000123456789",
            3,
            topic=topic,
            quantity=Decimal("2.5"),
            unit="GB",
            description="Storage",
            sku_id="sku-1",
            region_id="eu-west-1",
            charge_category="Usage",
        )
        second = usage(customer, unique("e"), "-1.50", 7, topic=topic)
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage(conn, [second, first]) == []
        with harness.tx() as conn:
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 0, 100)
        assert got == [line(first), line(second)]  # ordered by offset
        assert str(got[0].amount) == "1.23456789E-7"
        assert got[0].event_time == EVENT_TIME

    def test_no_records_is_no_conflict(self, harness: StoreHarness) -> None:
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage(conn, []) == []

    def test_the_same_event_again_is_a_no_op(self, harness: StoreHarness) -> None:
        customer, event_id, topic = unique("c"), unique("e"), unique("t")
        record = usage(customer, event_id, "1.00", 1, topic=topic)
        with harness.tx() as conn:
            harness.stores.usage.insert_usage(conn, [record])
        again = usage(customer, event_id, "1.00", 5, topic=topic)  # a redelivery, later offset
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage(conn, [again]) == []
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 0, 100)
        assert [(g.event_id, g.source_offset) for g in got] == [(event_id, 1)]

    def test_another_payload_under_a_stored_id_is_a_conflict_and_never_overwrites(
        self, harness: StoreHarness
    ) -> None:
        customer, event_id, topic = unique("c"), unique("e"), unique("t")
        with harness.tx() as conn:
            harness.stores.usage.insert_usage(
                conn, [usage(customer, event_id, "1.00", 1, topic=topic)]
            )
        other = usage(customer, event_id, "2.00", 4, topic=topic)
        with harness.tx() as conn:
            (conflict,) = harness.stores.usage.insert_usage(conn, [other])
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 0, 100)
        assert conflict.record == other
        assert conflict.stored_source == SourceCoordinates(topic, 0, 1)
        assert conflict.stored_sha256 == usage(customer, event_id, "1.00", 1).payload_sha256
        assert [(g.amount, g.source_offset) for g in got] == [(Decimal("1.00"), 1)]

    def test_duplicate_after_a_conflict_in_one_batch_is_not_a_conflict(
        self, harness: StoreHarness
    ) -> None:
        # from tests/integration/test_store.py
        customer, event_id = unique("c"), unique("e")
        with harness.tx() as conn:
            assert (
                harness.stores.usage.insert_usage(conn, [usage(customer, event_id, "1.00", 1)])
                == []
            )
            batch = [usage(customer, event_id, "9.99", 2), usage(customer, event_id, "1.00", 3)]
            conflicts = harness.stores.usage.insert_usage(conn, batch)
            assert [c.record.source.offset for c in conflicts] == [2]
            assert conflicts[0].stored_source.offset == 1

    def test_first_occurrence_in_a_batch_wins(self, harness: StoreHarness) -> None:
        # from tests/integration/test_store.py (the stored row read through the port)
        customer, event_id = unique("c"), unique("e")
        with harness.tx() as conn:
            batch = [
                usage(customer, event_id, "2.00", 5),
                usage(customer, event_id, "2.00", 6),
                usage(customer, event_id, "3.00", 7),
            ]
            conflicts = harness.stores.usage.insert_usage(conn, batch)
            assert [c.record.source.offset for c in conflicts] == [7]
            stored = harness.stores.usage.usage_before(conn, customer, PERIOD, "t", 0, 100)
            assert [(s.amount, s.source_offset) for s in stored] == [(Decimal("2.00"), 5)]

    # ------------------------------------------------------------------ the hot path's rows

    def test_rows_are_stored_and_read_back_exactly(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        first = hot_row(customer, unique("e"), "0.000000123456789", 3, topic, quantity="2.50")
        second = hot_row(customer, unique("e"), "-1.50", 7, topic)
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage_rows(conn, [second, first]) == []
        with harness.tx() as conn:
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 0, 100)
        assert [(g.event_id, str(g.amount), g.quantity) for g in got] == [
            (first.event_id, "1.23456789E-7", Decimal("2.50")),
            (second.event_id, "-1.50", None),
        ]
        assert got[0].event_time == datetime(2024, 9, 2, 10, 30, tzinfo=UTC)
        assert got[0].description == 'Storage "cold"\\tier\nline 2'

    def test_a_fresh_batch_with_one_stored_row_last_stores_the_rest(
        self, harness: StoreHarness
    ) -> None:
        # the direct COPY refuses the whole batch at its last row; the staged way stores
        # the fresh rows, leaves the stored one as it was and reports no conflict
        customer, topic = unique("c"), unique("t")
        kept = hot_row(customer, unique("e"), "1.00", 1, topic)
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage_rows(conn, [kept]) == []
        fresh = [hot_row(customer, unique("e"), "2.00", offset, topic) for offset in (2, 3, 4)]
        again = kept._replace(source=SourceCoordinates(topic, 0, 9))
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage_rows(conn, [*fresh, again]) == []
        with harness.tx() as conn:
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 0, 100)
        assert sorted((g.event_id, g.source_offset) for g in got) == sorted(
            [(kept.event_id, 1), *((row.event_id, row.source.offset) for row in fresh)]
        )

    def test_a_row_equal_in_canonical_form_is_a_duplicate(self, harness: StoreHarness) -> None:
        customer, event_id, topic = unique("c"), unique("e"), unique("t")
        with harness.tx() as conn:
            harness.stores.usage.insert_usage_rows(
                conn, [hot_row(customer, event_id, "1.0", 1, topic)]
            )
        # another raw value (other digest), the same amount: a no-op, not a conflict
        again = hot_row(customer, event_id, "1.000", 5, topic, digest="f" * 64)
        with harness.tx() as conn:
            assert harness.stores.usage.insert_usage_rows(conn, [again]) == []

    def test_another_payload_under_a_stored_or_batch_id_is_a_conflict(
        self, harness: StoreHarness
    ) -> None:
        customer, topic = unique("c"), unique("t")
        stored, fresh = unique("e"), unique("e")
        with harness.tx() as conn:
            harness.stores.usage.insert_usage_rows(
                conn, [hot_row(customer, stored, "1.00", 1, topic)]
            )
        batch = [
            hot_row(customer, stored, "2.00", 2, topic, digest="a" * 64),
            hot_row(customer, fresh, "3.00", 3, topic, digest="b" * 64),
            hot_row(customer, fresh, "4.00", 4, topic, digest="c" * 64),
            hot_row(customer, fresh, "3.00", 5, topic, digest="b" * 64),
        ]
        with harness.tx() as conn:
            conflicts = harness.stores.usage.insert_usage_rows(conn, batch)
        assert sorted((c.row.source.offset, c.stored_source.offset) for c in conflicts) == [
            (2, 1),
            (4, 3),
        ]
        with harness.tx() as conn:
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 0, 100)
        assert [(g.event_id, g.amount) for g in got] == [
            (stored, Decimal("1.00")),
            (fresh, Decimal("3.00")),
        ]

    def test_usage_before_selects_customer_period_partition_and_offset(
        self, harness: StoreHarness
    ) -> None:
        customer, topic = unique("c"), unique("t")
        wanted = usage(customer, unique("e"), "1", 10, topic=topic, partition=2)
        noise = [
            usage(customer, unique("e"), "1", 11, topic=topic, partition=2),  # at the marker
            usage(customer, unique("e"), "1", 12, topic=topic, partition=2),  # after it
            usage(customer, unique("e"), "1", 1, topic=topic, partition=3),  # other partition
            usage(customer, unique("e"), "1", 2, topic=unique("t"), partition=2),  # other topic
            usage(customer, unique("e"), "1", 3, topic=topic, partition=2, period="2026-02"),
            usage(unique("c"), unique("e"), "1", 4, topic=topic, partition=2),  # other customer
        ]
        with harness.tx() as conn:
            harness.stores.usage.insert_usage(conn, [wanted, *noise])
            got = harness.stores.usage.usage_before(conn, customer, PERIOD, topic, 2, 11)
        assert got == [line(wanted)]

    def test_stored_ids_and_customers_by_period_and_topic(self, harness: StoreHarness) -> None:
        topic = unique("t")
        a, b = unique("c"), unique("c")
        records = [
            usage(a, unique("e"), "1", 1, topic=topic),
            usage(b, unique("e"), "1", 2, topic=topic),
            usage(b, unique("e"), "1", 3, topic=topic, period="2026-02"),
            usage(b, unique("e"), "1", 4, topic=unique("t")),
        ]
        with harness.tx() as conn:
            harness.stores.usage.insert_usage(conn, records)
            assert harness.stores.usage.stored_usage_ids(conn, PERIOD, topic) == {
                records[0].event_id,
                records[1].event_id,
            }
            assert harness.stores.usage.customers_with_usage(conn, PERIOD, topic) == {a, b}
            assert harness.stores.usage.customers_with_usage(conn, "2026-03", topic) == set()

    # ------------------------------------------------------------------ customers

    def test_a_customer_is_replaced_only_by_a_record_not_older(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        u = harness.stores.usage
        with harness.tx() as conn:
            assert u.get_customer(conn, customer) is None
            u.upsert_customer(
                conn, "e1", customer_upserted(customer, "First"), SourceCoordinates(topic, 0, 5)
            )
            u.upsert_customer(
                conn, "e0", customer_upserted(customer, "Older"), SourceCoordinates(topic, 0, 4)
            )
            assert u.get_customer(conn, customer) == Customer(
                customer, "First", f"billing@{customer}.example", "USD"
            )
            u.upsert_customer(
                conn,
                "e2",
                customer_upserted(customer, "Same offset"),
                SourceCoordinates(topic, 0, 5),
            )
            u.upsert_customer(
                conn,
                "e3",
                customer_upserted(customer, "Newer", "EUR"),
                SourceCoordinates(topic, 0, 9),
            )
            got = u.get_customer(conn, customer)
            assert got is not None and (got.name, got.currency) == ("Newer", "EUR")
            # another topic's record replaces it whatever its offset
            u.upsert_customer(
                conn,
                "e4",
                customer_upserted(customer, "Elsewhere"),
                SourceCoordinates(unique("t"), 0, 1),
            )
            got = u.get_customer(conn, customer)
            assert got is not None and got.name == "Elsewhere"

    def test_customers_by_id(self, harness: StoreHarness) -> None:
        a, b, missing = unique("c"), unique("c"), unique("c")
        u = harness.stores.usage
        with harness.tx() as conn:
            for n, c in enumerate((a, b)):
                u.upsert_customer(conn, f"e{n}", customer_upserted(c), SourceCoordinates("t", 0, n))
            got = u.customers(conn, [a, missing, b, a])
        assert set(got) == {a, b}
        assert got[a] == Customer(a, "Name", f"billing@{a}.example", "USD")

    # ------------------------------------------------------------------ late usage

    def test_late_usage_is_usage_the_issued_invoice_lacks(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        invoiced = usage(customer, unique("e"), "1.00", 1, topic=topic)
        missed = usage(customer, unique("e"), "2.00", 2, topic=topic)  # before the close: lost
        late = usage(customer, unique("e"), "3.00", 20, topic=topic)  # after the close
        invoice = draft(customer, lines=(line(invoiced),), topic=topic, close_offset=10)
        with harness.tx() as conn:
            harness.stores.usage.insert_usage(conn, [invoiced, missed, late])
            before = harness.stores.usage.late_usage(conn, PERIOD)
            assert [r for r in before if r.customer_id == customer] == []  # nothing issued yet
            harness.stores.invoices.insert_invoice(
                conn, invoice, number=unique("INV"), issued_at=datetime.now(UTC), **NO_FENCE
            )
        with harness.tx() as conn:
            rows = [
                r
                for r in harness.stores.usage.late_usage(conn, PERIOD)
                if r.customer_id == customer
            ]
            assert rows == [
                r for r in harness.stores.usage.late_usage(conn) if r.customer_id == customer
            ]
            assert [
                r
                for r in harness.stores.usage.late_usage(conn, "2026-02")
                if r.customer_id == customer
            ] == []
        assert [(r.event_id, r.amount, r.after_close, r.source_offset) for r in rows] == [
            (missed.event_id, Decimal("2.00"), False, 2),
            (late.event_id, Decimal("3.00"), True, 20),
        ]
        assert {(r.invoice_id, r.revision, r.currency) for r in rows} == {
            (invoice.invoice_id, 1, "USD")
        }
        assert all(r.recorded_at.tzinfo is not None for r in rows)

    # ------------------------------------------------------------------ the database's transactions

    def test_a_block_that_raises_stores_nothing(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        with pytest.raises(Boom), harness.tx() as conn:
            harness.stores.usage.insert_usage(
                conn, [usage(customer, unique("e"), "1", 1, topic=topic)]
            )
            raise Boom
        with harness.tx() as conn:
            assert harness.stores.usage.customers_with_usage(conn, PERIOD, topic) == set()

    def test_a_savepoint_rolls_back_alone(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        kept, dropped = (
            usage(customer, unique("e"), "1", 1, topic=topic),
            usage(customer, unique("e"), "2", 2, topic=topic),
        )
        with harness.tx() as conn, conn.transaction():
            harness.stores.usage.insert_usage(conn, [kept])
            with pytest.raises(Boom), conn.transaction():
                harness.stores.usage.insert_usage(conn, [dropped])
                raise Boom
        with harness.tx() as conn:
            assert harness.stores.usage.stored_usage_ids(conn, PERIOD, topic) == {kept.event_id}

    def test_what_one_transaction_wrote_is_seen_by_the_next(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        record = usage(customer, unique("e"), "1", 1, topic=topic)
        with harness.tx() as conn, conn.transaction():
            harness.stores.usage.insert_usage(conn, [record])
        with harness.tx() as other:
            assert harness.stores.usage.stored_usage_ids(other, PERIOD, topic) == {record.event_id}
