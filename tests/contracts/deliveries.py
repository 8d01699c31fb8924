"""Contract of the email sender's delivery store (the :class:`~streams.apps.email.store.Deliveries`
port, ``email_deliveries``): claim before the send, mark after, under the row lock.

Run on the twin (:class:`~streams.apps.email.twin.InMemoryDeliveryStore`) and
on PostgreSQL (:class:`~streams.apps.email.store.DeliveryStore`, a sandbox database).
"""

from __future__ import annotations

import threading
import uuid

import pytest

from streams.apps.email.errors import SmtpPermanentError, SmtpTransientError, StoreUnavailable
from streams.apps.email.render import DocumentRef
from streams.apps.email.store import ClaimKind, DeliverOutcome, NewDelivery
from tests.contracts.stores import StoreHarness, unique


def new(document_id: str | None = None, event_id: str | None = None) -> NewDelivery:
    document_id = document_id or str(uuid.uuid4())
    ref = DocumentRef(
        document_type="invoice",
        document_id=document_id,
        document_key=f"invoice:{document_id}:r1",
        customer_id=unique("c"),
        recipient="ap@customer.example",
        message_id=f"<invoice.{document_id}.r1@invoicing.example>",
    )
    return NewDelivery(event_id or unique("ev"), ref, "invoices", 3, 41)


def nothing() -> None:
    pass


class DeliveriesContract:
    """The delivery store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def test_claim_then_deliver_then_every_duplicate_is_absorbed(
        self, harness: StoreHarness
    ) -> None:
        store = harness.deliveries(5.0)
        d = new()
        claim = store.claim(d)
        assert claim.kind is ClaimKind.NEW
        row = claim.row
        assert (row.status, row.attempts, row.event_id, row.document_key) == (
            "sending",
            1,
            d.event_id,
            d.ref.document_key,
        )
        assert (row.source_topic, row.source_partition, row.source_offset) == ("invoices", 3, 41)
        assert (row.document_id, row.message_id, row.sent_at) == (
            d.ref.document_id,
            d.ref.message_id,
            None,
        )
        sent: list[int] = []
        delivered = store.deliver(d.ref.document_key, lambda: sent.append(1))
        assert (delivered.outcome, delivered.row.status, sent) == (DeliverOutcome.SENT, "sent", [1])
        assert delivered.row.sent_at is not None and delivered.row.sent_at.tzinfo is not None
        again = store.claim(d)
        assert (again.kind, again.matched, again.row.status) == (
            ClaimKind.DUPLICATE,
            "event_id",
            "sent",
        )
        republished = store.claim(new(d.ref.document_id))  # same document, new event id
        assert (republished.kind, republished.matched) == (ClaimKind.DUPLICATE, "document")
        final = store.deliver(d.ref.document_key, lambda: sent.append(2))
        assert (final.outcome, sent) == (DeliverOutcome.ALREADY_FINAL, [1])

    def test_a_row_left_sending_is_resumed(self, harness: StoreHarness) -> None:
        store = harness.deliveries(5.0)
        d = new()
        store.claim(d)
        resumed = store.claim(new(d.ref.document_id))  # a crash between send and mark
        assert (resumed.kind, resumed.row.attempts, resumed.row.event_id) == (
            ClaimKind.RESUMED,
            2,
            d.event_id,  # the row keeps the event that claimed it
        )

    def test_a_transient_send_failure_leaves_the_row_sending(self, harness: StoreHarness) -> None:
        store = harness.deliveries(5.0)
        d = new()
        store.claim(d)

        def fail() -> None:
            raise SmtpTransientError("451 try later", code=451)

        with pytest.raises(SmtpTransientError):
            store.deliver(d.ref.document_key, fail)
        row = store.get(document_key=d.ref.document_key)
        assert row is not None and (row.status, row.attempts, row.sent_at) == ("sending", 1, None)

    def test_a_permanent_refusal_is_recorded_skipped(self, harness: StoreHarness) -> None:
        store = harness.deliveries(5.0)
        d = new()
        store.claim(d)

        def refuse() -> None:
            raise SmtpPermanentError("smtp_rejected: recipient refused: 550 no such user", code=550)

        rejected = store.deliver(d.ref.document_key, refuse)
        assert rejected.outcome is DeliverOutcome.REJECTED
        assert (rejected.row.status, rejected.row.skip_reason) == (
            "skipped",
            "smtp_rejected: recipient refused: 550 no such user",
        )
        assert store.claim(d).kind is ClaimKind.DUPLICATE

    def test_a_document_not_emailed_is_recorded_skipped(self, harness: StoreHarness) -> None:
        store = harness.deliveries(5.0)
        d = new()
        skipped = store.record_skipped(d, "zero_total")
        assert skipped.kind is ClaimKind.NEW
        assert (skipped.row.status, skipped.row.skip_reason, skipped.row.attempts) == (
            "skipped",
            "zero_total",
            0,
        )
        again = store.record_skipped(new(d.ref.document_id), "zero_total")
        assert (again.kind, again.matched) == (ClaimKind.DUPLICATE, "document")
        # a row left sending (a render failure found on redelivery) turns skipped
        sending = new()
        store.claim(sending)
        turned = store.record_skipped(new(sending.ref.document_id), "render_failed: bad")
        assert (turned.kind, turned.row.status, turned.row.event_id) == (
            ClaimKind.NEW,
            "skipped",
            sending.event_id,
        )

    def test_get_by_event_or_document(self, harness: StoreHarness) -> None:
        store = harness.deliveries(5.0)
        d = new()
        store.claim(d)
        by_event = store.get(event_id=d.event_id)
        assert by_event is not None and by_event == store.get(document_key=d.ref.document_key)
        assert store.get(event_id=unique("ev")) is None
        with pytest.raises(ValueError):
            store.get()
        with pytest.raises(ValueError):
            store.get(event_id=d.event_id, document_key=d.ref.document_key)

    def test_delivering_an_unclaimed_document_is_transient(self, harness: StoreHarness) -> None:
        with pytest.raises(StoreUnavailable):
            harness.deliveries(5.0).deliver(f"invoice:{uuid.uuid4()}:r1", nothing)

    def test_a_second_deliverer_waits_and_then_sends_nothing(self, harness: StoreHarness) -> None:
        first, second = harness.deliveries(10.0), harness.deliveries(10.0)
        d = new()
        first.claim(d)
        sending, release = threading.Event(), threading.Event()
        sends: list[str] = []
        outcomes: list[DeliverOutcome] = []

        def slow_send() -> None:
            sends.append("first")
            sending.set()
            release.wait(10)

        def deliver_second() -> None:
            outcomes.append(
                second.deliver(d.ref.document_key, lambda: sends.append("second")).outcome
            )

        thread = threading.Thread(target=lambda: first.deliver(d.ref.document_key, slow_send))
        thread.start()
        assert sending.wait(10)
        other = threading.Thread(target=deliver_second)
        other.start()
        other.join(harness.blocked_s)
        assert other.is_alive(), "the second deliverer did not wait for the row lock"
        release.set()
        thread.join(10)
        other.join(10)
        assert (sends, outcomes) == (["first"], [DeliverOutcome.ALREADY_FINAL])

    def test_a_lock_wait_beyond_the_timeout_is_transient(self, harness: StoreHarness) -> None:
        holder, impatient = harness.deliveries(10.0), harness.deliveries(0.3)
        d = new()
        holder.claim(d)
        sending, release = threading.Event(), threading.Event()

        def slow_send() -> None:
            sending.set()
            release.wait(10)

        thread = threading.Thread(target=lambda: holder.deliver(d.ref.document_key, slow_send))
        thread.start()
        try:
            assert sending.wait(10)
            with pytest.raises(StoreUnavailable) as caught:
                impatient.deliver(d.ref.document_key, nothing)
            assert caught.value.sqlstate == "55P03"  # lock_not_available
        finally:
            release.set()
            thread.join(10)
