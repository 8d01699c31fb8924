"""Contract of the :class:`~streams.core.billing.ports.DraftStore` port (``invoice_drafts``,
migration 0024; docs/invoices.md "Drafts and finalisation").

Run on the twin (:mod:`streams.adapters.memory.store.drafts`) and on PostgreSQL
(:mod:`streams.core.billing.store.drafts`, a sandbox database).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from streams.core.billing.rows import CloseMarker, SourceCoordinates
from streams.core.domain.invoice import InvoiceTotals
from tests.contracts.stores import PERIOD, StoreHarness, unique

ENDS = datetime(2026, 2, 3, 4, 5, 6, tzinfo=UTC)


def _totals(subtotal: str, lines: int = 1) -> InvoiceTotals:
    amount = Decimal(subtotal)
    tax = (amount / 10).quantize(Decimal("0.01"))
    return InvoiceTotals(
        currency="USD",
        line_count=lines,
        subtotal=amount,
        taxes=(),
        tax_total=tax,
        total=amount + tax,
        largest_lines=(),
        source=(),
    )


def _marker(customer: str, topic: str, partition: int = 2, offset: int = 10) -> CloseMarker:
    return CloseMarker(
        unique("close"),
        customer,
        PERIOD,
        "period_closed",
        SourceCoordinates(topic, partition, offset),
        7,
    )


class DraftStoreContract:
    """The draft store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def _save(
        self,
        harness: StoreHarness,
        invoice_id: str,
        marker: CloseMarker,
        watermark: int,
        subtotal: str,
        lines: int = 1,
    ) -> bool:
        with harness.tx() as conn:
            return harness.stores.drafts.save_draft(
                conn,
                invoice_id=invoice_id,
                revision=1,
                marker=marker,
                watermark_offset=watermark,
                totals=_totals(subtotal, lines),
                grace_hours=Decimal("0.5"),
                grace_source="customer",
                grace_ends_at=ENDS,
                fence=(3, "member-a"),
            )

    def test_a_draft_is_created_then_re_rated_in_place_at_a_later_watermark(
        self, harness: StoreHarness
    ) -> None:
        topic, customer, invoice_id = unique("t"), unique("c"), str(uuid.uuid4())
        marker = _marker(customer, topic)
        d = harness.stores.drafts
        assert self._save(harness, invoice_id, marker, 10, "12.50")
        with harness.tx() as conn:
            first = d.open_draft(conn, customer, PERIOD)
        assert first is not None
        assert (first.invoice_id, first.status, first.subtotal, first.rerated) == (
            invoice_id, "draft", Decimal("12.50"), 0
        )  # fmt: skip
        assert (first.grace_hours, first.grace_source, first.grace_ends_at) == (
            Decimal("0.5"), "customer", ENDS
        )  # fmt: skip
        assert (first.close_event_id, first.lease_fencing_token, first.close_offset) == (
            marker.event_id, 7, 10
        )  # fmt: skip
        assert first.invoice_number is None and first.finalized_at is None
        # a redelivery at the same watermark changes nothing; a later one re-rates
        assert not self._save(harness, invoice_id, marker, 10, "99.00")
        later = _marker(customer, topic, offset=15)
        assert self._save(harness, invoice_id, later, 15, "20.00", lines=2)
        assert not self._save(harness, invoice_id, later, 12, "30.00")  # an older position
        with harness.tx() as conn:
            second = d.find_draft(conn, invoice_id)
        assert second is not None
        assert (second.subtotal, second.line_count, second.rerated, second.watermark_offset) == (
            Decimal("20.00"), 2, 1, 15
        )  # fmt: skip
        # the first close's marker and grace end stay
        assert (second.close_event_id, second.close_offset, second.grace_ends_at) == (
            marker.event_id, 10, ENDS
        )  # fmt: skip

    def test_open_drafts_are_listed_by_partition_and_finalised_once(
        self, harness: StoreHarness
    ) -> None:
        topic = unique("t")
        a, b, c = unique("c"), unique("c"), unique("c")
        ids = {name: str(uuid.uuid4()) for name in (a, b, c)}
        self._save(harness, ids[a], _marker(a, topic, partition=2), 10, "1")
        self._save(harness, ids[b], _marker(b, topic, partition=2), 11, "2")
        self._save(harness, ids[c], _marker(c, topic, partition=3), 12, "3")
        d = harness.stores.drafts
        at = ENDS + timedelta(hours=1)
        with harness.tx() as conn:
            assert {x.customer_id for x in d.open_drafts_on(conn, topic, 2)} == {a, b}
            assert d.mark_finalized(conn, ids[a], "INV-2026-01-000001", at)
            assert not d.mark_finalized(conn, ids[a], "INV-2026-01-000002", at)  # once
            assert [x.customer_id for x in d.open_drafts_on(conn, topic, 2)] == [b]
            assert d.open_draft(conn, a, PERIOD) is None
            done = d.find_draft(conn, ids[a])
            assert done is not None and done.status == "finalized"
            assert (done.invoice_number, done.finalized_at) == ("INV-2026-01-000001", at)
            assert d.find_draft(conn, str(uuid.uuid4())) is None
        # a finalised draft is never re-rated
        assert not self._save(harness, ids[a], _marker(a, topic, offset=99), 99, "5")
