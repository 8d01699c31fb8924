"""Contract of the :class:`~streams.core.billing.ports.InvoiceStore` port: invoices and their
lines, gapless numbering, credit notes and the outbox.

Run on the twin (:mod:`streams.adapters.memory.store.invoices`) and on PostgreSQL
(:mod:`streams.core.billing.store.invoices`, a sandbox database). Folded in from
``tests/integration/test_store.py``: the invoice-number clash.
"""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from streams.apps.email.render import DocumentRef
from streams.apps.email.store import NewDelivery
from streams.core.billing.fencing import Fenced, FencingToken
from streams.core.billing.rows import CreditNoteDraft, Customer
from streams.core.billing.store.invoices import (
    InvoiceNumberTaken,
    invoice_number,
    pending_number,
)
from streams.core.domain.events import InvoiceVoided
from tests.contracts.stores import NO_FENCE, PERIOD, StoreHarness, draft, line, unique, usage


class Boom(Exception):
    pass


def now() -> datetime:
    return datetime.now(UTC)


def credit_for(invoice_id: str, customer: str, number: str = "INV-1") -> CreditNoteDraft:
    return CreditNoteDraft(
        credit_note_id=str(uuid.uuid4()),
        invoice_id=invoice_id,
        invoice_number=number,
        revision=1,
        customer=Customer(customer, "Name", "billing@example.invalid", "USD"),
        billing_period=PERIOD,
        currency="USD",
        subtotal=Decimal("1.00"),
        tax_total=Decimal("0.10"),
        total=Decimal("1.10"),
        reason="replay: " + "r" * 3000,
    )


def delivery(invoice_id: str, customer: str) -> NewDelivery:
    ref = DocumentRef(
        document_type="invoice",
        document_id=invoice_id,
        document_key=f"invoice:{invoice_id}:r1",
        customer_id=customer,
        recipient="ap@customer.example",
        message_id=f"<invoice.{invoice_id}.r1@invoicing.example>",
    )
    return NewDelivery(unique("ev"), ref, "invoices", 0, 1)


class InvoiceStoreContract:
    """The invoice store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def insert(self, harness: StoreHarness, conn: Any, d: Any, number: str | None = None) -> bool:
        return bool(
            harness.stores.invoices.insert_invoice(
                conn, d, number=number or unique("INV"), issued_at=now(), **NO_FENCE
            )
        )

    # ------------------------------------------------------------------ numbering

    def test_numbers_are_gapless_per_series(self, harness: StoreHarness) -> None:
        series, other = unique("INV"), unique("CN")
        inv = harness.stores.invoices
        with harness.tx() as conn:
            assert [inv.next_number(conn, series) for _ in range(3)] == [1, 2, 3]
            assert inv.next_number(conn, other) == 1
        with pytest.raises(Boom), harness.tx() as conn:
            assert inv.next_number(conn, series) == 4
            raise Boom  # the document was not written: its number is given back
        with harness.tx() as conn:
            assert inv.next_number(conn, series) == 4

    def test_an_invoice_is_numbered_last_from_its_period_s_series(
        self, harness: StoreHarness
    ) -> None:
        """Inserted under its provisional number, numbered in the same transaction from the
        period's ``INV-`` series (migration 0025); the series goes on from there."""
        inv = harness.stores.invoices
        period = f"{2200 + uuid.uuid4().int % 700:04d}-{1 + uuid.uuid4().int % 12:02d}"
        first, second = draft(unique("c"), period=period), draft(unique("c"), period=period)
        with harness.tx() as conn:
            assert self.insert(harness, conn, first, pending_number(first.invoice_id))
            assert inv.number_invoice(conn, first.invoice_id, period) == invoice_number(period, 1)
        with harness.tx() as conn:
            assert self.insert(harness, conn, second, pending_number(second.invoice_id))
            assert inv.number_invoice(conn, second.invoice_id, period) == invoice_number(period, 2)
            stored = inv.stored_invoice(conn, first.invoice_id)
        assert stored is not None and stored.invoice_number == invoice_number(period, 1)

    def test_numbering_refuses_another_period_or_a_numbered_invoice(
        self, harness: StoreHarness
    ) -> None:
        inv = harness.stores.invoices
        d = draft(unique("c"))
        with pytest.raises(psycopg.errors.InsufficientPrivilege), harness.tx() as conn:
            assert self.insert(harness, conn, d, pending_number(d.invoice_id))
            inv.number_invoice(conn, d.invoice_id, "2031-07")  # not the invoice's period
        numbered = draft(unique("c"))
        with harness.tx() as conn:
            self.insert(harness, conn, numbered, pending_number(numbered.invoice_id))
            inv.number_invoice(conn, numbered.invoice_id, PERIOD)
        with pytest.raises(psycopg.errors.InsufficientPrivilege), harness.tx() as conn:
            inv.number_invoice(conn, numbered.invoice_id, PERIOD)  # numbered and committed
        with harness.tx() as conn:
            assert inv.stored_invoice(conn, d.invoice_id) is None  # rolled back

    # ------------------------------------------------------------------ fence folded in

    def owners(self, harness: StoreHarness) -> tuple[FencingToken, FencingToken]:
        """An old and a new owner of one partition of a fresh group; the old one claimed."""
        g = unique("g")
        old = FencingToken(g, "billing.account-events.v1", 3, 5, "member-a")
        new = FencingToken(g, "billing.account-events.v1", 3, 6, "member-b")
        with harness.tx() as conn:
            harness.stores.fences.claim(conn, old)
        return old, new

    def test_an_insert_with_its_fence_writes_only_under_the_current_token(
        self, harness: StoreHarness
    ) -> None:
        """``checked``: the fence check folded into the invoice's insert; a stale token
        is refused (Fenced) and nothing is written, a current one writes."""
        inv, fences = harness.stores.invoices, harness.stores.fences
        old, new = self.owners(harness)
        first, second = draft(unique("c")), draft(unique("c"))
        with harness.tx() as conn:
            assert inv.insert_invoice(
                conn, first, number=unique("INV"), issued_at=now(), checked=old, **NO_FENCE
            )
        with harness.tx() as conn:
            fences.claim(conn, new)
        with pytest.raises(Fenced) as refused, harness.tx() as conn:
            inv.insert_invoice(
                conn, second, number=unique("INV"), issued_at=now(), checked=old, **NO_FENCE
            )
        assert refused.value.stored == (6, "member-b")
        with harness.tx() as conn:
            assert inv.stored_invoice(conn, second.invoice_id) is None
            # the same invoice again under the current token: a unique key, not a fence
            assert not inv.insert_invoice(
                conn, first, number=unique("INV"), issued_at=now(), checked=new, **NO_FENCE
            )
            assert inv.insert_invoice(
                conn, second, number=unique("INV"), issued_at=now(), checked=new, **NO_FENCE
            )

    def test_a_claim_waits_for_an_insert_with_its_fence_in_flight(
        self, harness: StoreHarness
    ) -> None:
        """The folded check locks the fence row as the separate check does: a new owner's
        claim waits until the writer's transaction ends."""
        inv, fences = harness.stores.invoices, harness.stores.fences
        old, new = self.owners(harness)
        claimed = threading.Event()
        errors: list[BaseException] = []

        def new_owner() -> None:
            try:
                with harness.tx() as conn:
                    fences.claim(conn, new)
                claimed.set()
            except BaseException as exc:  # reported below
                errors.append(exc)

        with harness.db.connection() as writer:
            with writer.transaction():
                assert inv.insert_invoice(
                    writer,
                    draft(unique("c")),
                    number=unique("INV"),
                    issued_at=now(),
                    checked=old,
                    **NO_FENCE,
                )
                thread = threading.Thread(target=new_owner, daemon=True)
                thread.start()
                assert not claimed.wait(harness.blocked_s), "the claim did not wait"
            assert claimed.wait(10.0), f"the claim never completed: {errors}"
            thread.join(5)
        assert not errors

    # ------------------------------------------------------------------ invoices

    def test_an_invoice_is_stored_with_its_lines_and_read_back(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        lines = (
            line(usage(customer, unique("e"), "10.00", 3, topic=topic, description="B")),
            line(usage(customer, unique("e"), "0.333", 1, topic=topic, description="A")),
        )
        d = draft(customer, lines=lines, topic=topic, close_offset=4)
        issued_at = datetime(2026, 2, 1, 0, 5, tzinfo=UTC)
        inv = harness.stores.invoices
        with harness.tx() as conn:
            assert inv.insert_invoice(
                conn,
                d,
                number="INV-X-" + customer,
                fence=("g", 7, "member-a"),
                lease_fencing_token=3,
                issued_at=issued_at,
            )
        with harness.tx() as conn:
            current = inv.current_invoice(conn, customer, PERIOD)
            head = inv.stored_invoice(conn, d.invoice_id)
            stored_lines = inv.stored_invoice_lines(conn, d.invoice_id)
            assert inv.lock_issued(conn, customer, PERIOD) is not None
        assert current is not None
        assert (current.invoice_id, current.invoice_number, current.revision, current.status) == (
            d.invoice_id,
            "INV-X-" + customer,
            1,
            "issued",
        )
        assert (current.subtotal, current.total) == (Decimal("10.333"), Decimal("11.3663"))
        assert head is not None
        assert (head.customer_id, head.billing_period, head.currency, head.issued_at) == (
            customer,
            PERIOD,
            "USD",
            issued_at,
        )
        assert (head.source_topic, head.source_partition, head.close_offset) == (topic, 0, 4)
        assert head.close_event_id == d.marker.event_id and head.supersedes_invoice_id is None
        assert [
            (s.event_id, s.amount, s.tax, s.tax_code, s.source_offset) for s in stored_lines
        ] == [
            (lines[0].event_id, Decimal("10.00"), Decimal("1.000"), "T-STD", 3),
            (lines[1].event_id, Decimal("0.333"), Decimal("0.0333"), "T-STD", 1),
        ]  # in line order, as given

    def test_nothing_for_an_unknown_invoice(self, harness: StoreHarness) -> None:
        missing = str(uuid.uuid4())
        inv = harness.stores.invoices
        with harness.tx() as conn:
            assert inv.current_invoice(conn, unique("c"), PERIOD) is None
            assert inv.lock_issued(conn, unique("c"), PERIOD) is None
            assert inv.stored_invoice(conn, missing) is None
            assert inv.stored_invoice_lines(conn, missing) == []
            assert inv.max_revision(conn, unique("c"), PERIOD) == 0
            assert inv.latest_outbox_event(conn, missing) is None

    def test_an_invoice_number_clash_is_an_error_not_already_invoiced(
        self, harness: StoreHarness
    ) -> None:
        # from tests/integration/test_store.py
        number = unique("INV-TEST")
        kw: dict[str, Any] = {**NO_FENCE, "issued_at": now()}
        customer = unique("a")
        inv = harness.stores.invoices
        with pytest.raises(Boom), harness.tx() as conn:
            first = draft(customer, str(uuid.uuid4()))
            assert inv.insert_invoice(conn, first, number=number, **kw) is True
            # the same invoice again (a redelivery): nothing written, not an error
            again = draft(customer, str(uuid.uuid4()))
            assert inv.insert_invoice(conn, again, number=f"{number}-2", **kw) is False
            # another customer's invoice under a number already used: refused loudly
            other = draft(unique("b"), str(uuid.uuid4()))
            with pytest.raises(InvoiceNumberTaken, match=number):
                inv.insert_invoice(conn, other, number=number, **kw)
            raise Boom  # rolled back, as the original test did

    def test_every_unique_key_makes_an_insert_a_no_op(self, harness: StoreHarness) -> None:
        customer = unique("c")
        d = draft(customer)
        with harness.tx() as conn:
            assert self.insert(harness, conn, d)
            assert not self.insert(harness, conn, d)  # the same id
            assert not self.insert(harness, conn, draft(customer))  # (customer, period, revision)
            assert not self.insert(
                harness, conn, draft(customer, revision=2)
            )  # one issued revision
            assert self.insert(harness, conn, draft(customer, period="2026-02"))
            assert harness.stores.invoices.max_revision(conn, customer, PERIOD) == 1

    def test_a_superseded_revision_makes_room_for_the_next(self, harness: StoreHarness) -> None:
        customer, topic = unique("c"), unique("t")
        first = draft(customer, topic=topic)
        inv = harness.stores.invoices
        with harness.tx() as conn:
            self.insert(harness, conn, first)
            assert inv.supersede(conn, first.invoice_id) is True
            assert inv.supersede(conn, first.invoice_id) is False  # no longer issued
            assert inv.current_invoice(conn, customer, PERIOD) is None
            second = draft(customer, revision=2, topic=topic, supersedes=first.invoice_id)
            assert self.insert(harness, conn, second)
            assert inv.max_revision(conn, customer, PERIOD) == 2
            assert inv.revisions(conn, PERIOD, topic) == {customer: 2}
            current = inv.current_invoice(conn, customer, PERIOD)
            assert current is not None and current.invoice_id == second.invoice_id
            head = inv.stored_invoice(conn, second.invoice_id)
            assert head is not None and head.supersedes_invoice_id == first.invoice_id
            locked = inv.lock_issued(conn, customer, PERIOD)
            assert locked is not None and (locked.invoice_id, locked.revision) == (
                second.invoice_id,
                2,
            )

    def test_revisions_are_per_period_and_topic(self, harness: StoreHarness) -> None:
        topic, a, b = unique("t"), unique("c"), unique("c")
        with harness.tx() as conn:
            self.insert(harness, conn, draft(a, topic=topic))
            self.insert(harness, conn, draft(b, topic=topic))
            self.insert(harness, conn, draft(b, topic=unique("t"), period="2026-02"))
            assert harness.stores.invoices.revisions(conn, PERIOD, topic) == {a: 1, b: 1}
            assert harness.stores.invoices.revisions(conn, "2026-02", topic) == {}

    def test_refused_by_the_checks(self, harness: StoreHarness) -> None:
        customer = unique("c")
        with pytest.raises(psycopg.errors.CheckViolation), harness.tx() as conn:
            self.insert(harness, conn, draft(customer, total=Decimal("1")))  # total <> sub + tax
        with pytest.raises(psycopg.errors.CheckViolation), harness.tx() as conn:
            self.insert(harness, conn, draft(customer, period="2026-13"))
        with pytest.raises(psycopg.errors.ForeignKeyViolation), harness.tx() as conn:
            self.insert(harness, conn, draft(customer, supersedes=str(uuid.uuid4())))
        with harness.tx() as conn:  # nothing of the refused ones was kept
            assert harness.stores.invoices.current_invoice(conn, customer, PERIOD) is None

    def test_an_error_aborts_the_transaction(self, harness: StoreHarness) -> None:
        customer = unique("c")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction), harness.tx() as conn:
            with pytest.raises(psycopg.errors.CheckViolation):
                self.insert(harness, conn, draft(customer, total=Decimal("1")))
            harness.stores.invoices.current_invoice(conn, customer, PERIOD)

    # ------------------------------------------------------------------ credit notes, documents

    def test_a_revision_is_credited_once(self, harness: StoreHarness) -> None:
        customer = unique("c")
        d = draft(customer)
        inv = harness.stores.invoices
        with harness.tx() as conn:
            self.insert(harness, conn, d, number="INV-" + customer)
            note = credit_for(d.invoice_id, customer)
            assert inv.insert_credit_note(conn, note, number="CN-" + customer, issued_at=now())
            assert not inv.insert_credit_note(conn, note, number="CN2-" + customer, issued_at=now())
            again = credit_for(d.invoice_id, customer)  # another note for the same revision
            assert not inv.insert_credit_note(
                conn, again, number="CN3-" + customer, issued_at=now()
            )
            docs = [doc for doc in inv.documents(conn) if doc.customer_id == customer]
        assert sorted((doc.event_type, doc.document_id, doc.number) for doc in docs) == [
            ("credit_note.issued", note.credit_note_id, "CN-" + customer),
            ("invoice.issued", d.invoice_id, "INV-" + customer),
        ]

    def test_a_credit_note_of_an_unknown_invoice_is_refused(self, harness: StoreHarness) -> None:
        with pytest.raises(psycopg.errors.ForeignKeyViolation), harness.tx() as conn:
            harness.stores.invoices.insert_credit_note(
                conn,
                credit_for(str(uuid.uuid4()), unique("c")),
                number=unique("CN"),
                issued_at=now(),
            )

    # ------------------------------------------------------------------ outbox

    def test_the_outbox_keeps_each_event_once_and_serves_the_newest(
        self, harness: StoreHarness
    ) -> None:
        document, customer = str(uuid.uuid4()), unique("c")
        event = InvoiceVoided(
            invoice_id=document,
            invoice_number="INV-1",
            revision=1,
            customer_id=customer,
            billing_period=PERIOD,
            reason="test",
            voided_at=datetime(2026, 2, 1, tzinfo=UTC),
        )
        first_id, second_id = str(uuid.uuid4()), str(uuid.uuid4())
        inv = harness.stores.invoices
        common: dict[str, Any] = {
            "topic": "test.billing.invoices.v1",
            "customer_id": customer,
            "source": "/test",
            "time": datetime(2026, 2, 1, tzinfo=UTC),
            "document_id": document,
        }
        with harness.tx() as conn:
            inv.insert_outbox(conn, event_id=first_id, event=event, **common)
        with harness.tx() as conn:
            inv.insert_outbox_row(
                conn,
                event_id=second_id,
                event_type="invoice.issued",
                payload=json.dumps({"n": 2, "amount": "1.10"}),
                **common,
            )
            newest = inv.latest_outbox_event(conn, document)
        assert newest is not None
        assert (newest.customer_id, newest.event_type, newest.payload) == (
            customer,
            "invoice.issued",
            {"n": 2, "amount": "1.10"},
        )
        with pytest.raises(psycopg.errors.UniqueViolation), harness.tx() as conn:
            inv.insert_outbox(conn, event_id=first_id, event=event, **common)
        with harness.tx() as conn:  # the first row kept its payload
            inv.insert_outbox_row(
                conn,
                event_id=str(uuid.uuid4()),
                event_type="x",
                payload="{}",
                **{**common, "document_id": str(uuid.uuid4())},
            )
            assert inv.latest_outbox_event(conn, document) == newest

    # ------------------------------------------------------------------ reconciliation

    def test_invoices_without_email(self, harness: StoreHarness) -> None:
        customer = unique("c")
        lines = (line(usage(customer, unique("e"), "5.00", 1)),)
        emailed, unsent, recent = (
            draft(customer, lines=lines),
            draft(customer, period="2026-02", lines=lines),
            draft(customer, period="2026-03", lines=lines),
        )
        zero = draft(customer, period="2026-04")
        long_ago = now() - timedelta(hours=2)
        inv = harness.stores.invoices
        with harness.tx() as conn:
            for d, at in (
                (emailed, long_ago),
                (unsent, long_ago),
                (recent, now()),
                (zero, long_ago),
            ):
                inv.insert_invoice(conn, d, number=unique("INV"), issued_at=at, **NO_FENCE)
        deliveries = harness.deliveries(5.0)
        deliveries.claim(delivery(emailed.invoice_id, customer))
        deliveries.deliver(f"invoice:{emailed.invoice_id}:r1", lambda: None)
        deliveries.claim(delivery(unsent.invoice_id, customer))  # claimed, never sent
        with harness.tx() as conn:
            found = {u.invoice_id for u in inv.invoices_without_email(conn, timedelta(hours=1))}
        ours = {d.invoice_id for d in (emailed, unsent, recent, zero)}
        assert found & ours == {unsent.invoice_id}
