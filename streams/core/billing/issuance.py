"""The one issuance transaction: an invoice revision, its lines and its outbox event.

Both writers of invoices call :func:`issue`: the invoicing worker's invoice job
(:mod:`streams.apps.invoicing.jobs`, under the partition fence of the close marker's
partition) and the replay's apply (:mod:`streams.apps.replay.apply`, under its lease
fence, with the credit note of the revision it corrects). One transaction, in
this order:

1. the **fence check** given by the caller (:class:`streams.core.billing.fencing.Fence`:
   a partition fence for the worker, a lease fence for the replay) — the first
   statement, so nothing lands once the caller's ownership ended; a partition fence
   with neither ``before`` nor ``credit`` is checked *by the invoice's insert* instead
   (``INSERT … SELECT … WHERE EXISTS (fence row FOR SHARE)``, the first write of the
   transaction), which saves a statement per invoice and keeps the guarantee: nothing
   is written unless the fence row, locked, holds the caller's token;
2. the caller's ``before`` checks (the replay re-verifies, under its locks, that
   the revision it compared is still the issued one); whatever they raise rolls
   everything back and propagates;
3. with a correction (``credit``): the credited revision's row locked and the
   note reduced to what is still open after partial credit notes (``open_credit``),
   a gapless ``CN-<period>`` number, the full credit note (``ON CONFLICT DO
   NOTHING``; one full note per revision) and the credited revision ``issued`` →
   ``superseded``;
4. ``INSERT … ON CONFLICT DO NOTHING`` of the invoice under its provisional number
   and of its lines (:func:`streams.core.billing.store.invoices.insert_invoice`):
   usage lines in ``invoice_lines``, a rated invoice's charge lines in
   ``invoice_charges`` and its rating summary in ``invoices.rating``; then its gapless
   ``INV-<period>`` number (:func:`streams.core.billing.store.invoices.number_invoice`),
   taken **last**: the period's counter row, which every issuance of the period needs,
   is locked only for this step, the outbox rows, the ``after`` rows and the commit;
5. the outbox rows — ``credit_note.issued`` (with a correction), then
   ``invoice.issued`` — written **only when the invoice row was new**, with
   deterministic ids (``deterministic_id("outbox", <type>, <document id>)``) so
   the email sender and subscribers deduplicate a resend;
6. the caller's ``after`` rows (the worker's close record, the replay's result
   and restored usage), then the commit.

A unique key that says someone else wrote first (the invoice, the credit note,
or the supersede found the revision no longer issued) rolls the whole
transaction back — numbers included, so the series stays gapless — and
:func:`issue` returns :class:`NotIssued` with the reason. No database
transaction is open during the tax call: the caller taxes before it calls this
(the tax idempotency key is :func:`tax_idempotency_key`).

Raises (from :func:`issue`): :class:`~streams.core.billing.fencing.Fenced`,
:class:`~streams.adapters.lease.LeaseFenced` (the fence moved on; nothing
written); :class:`~streams.core.billing.store.invoices.InvoiceNumberTaken`;
``psycopg.Error``; whatever ``before`` / ``after`` raise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from streams.core.billing.fencing import Fence, FencingToken
from streams.core.billing.ports import Connection, Database
from streams.core.billing.rows import CreditNoteDraft, InvoiceDraft
from streams.core.billing.store.invoices import credit_note_number, pending_number
from streams.core.billing.stores import POSTGRES, Stores
from streams.core.domain.events import CreditNoteIssued, InvoiceIssued, deterministic_id

C = TypeVar("C", bound=Connection)

__all__ = [
    "Issued",
    "NotIssued",
    "credit_note_issued",
    "invoice_issued",
    "issue",
    "outbox_event_id",
    "tax_idempotency_key",
]


def tax_idempotency_key(invoice_id: str, revision: int) -> str:
    """The tax document's idempotency key of an invoice revision: ``<invoice id>:r<revision>``.

    The invoice id is deterministic (:func:`streams.core.domain.events.invoice_id_for`),
    so a retry, a crash or a second owner reuses the key and the tax service
    answers the same tax: tax is never applied twice (docs/design.md "Tax service").
    """
    return f"{invoice_id}:r{revision}"


def outbox_event_id(event_type: str, document_id: str) -> str:
    """The outbox event id of a document's event: deterministic, so a resend deduplicates."""
    return deterministic_id("outbox", event_type, document_id)


@dataclass(frozen=True)
class Issued:
    """What :func:`issue` committed: the invoice revision (and the credit note, with a
    correction), their numbers and the issue time (UTC)."""

    invoice_id: str
    invoice_number: str
    issued_at: datetime
    credit_note_id: str | None = None
    credit_note_number: str | None = None


@dataclass(frozen=True)
class NotIssued:
    """Nothing was written: a unique key says someone else wrote first (``reason``)."""

    reason: str


class _Conflict(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def issue(
    pool: Database[C],
    fence: Fence,
    draft: InvoiceDraft,
    *,
    invoices_topic: str,
    source: str,
    lease_fencing_token: int | None,
    credit: CreditNoteDraft | None = None,
    before: Callable[[C], None] | None = None,
    after: Callable[[C, Issued], None] | None = None,
    issued_at: datetime | None = None,
    stores: Stores[C] | None = None,
) -> Issued | NotIssued:
    """Write ``draft`` (and ``credit``) in one fenced transaction (module docstring).

    Args:
        pool: PostgreSQL pool (``autocommit=False`` connections), or another
            :class:`~streams.core.billing.ports.Database` with its ``stores``.
        fence: checked first; a :class:`~streams.core.billing.fencing.FencingToken` is also
            recorded on the invoice (``fence_group`` / ``fence_generation`` / ``fence_member``).
        draft: the revision, computed and taxed outside any transaction.
        invoices_topic: the outbox rows' ``aggregatetype`` (the prefixed invoices topic).
        source: CloudEvents ``source`` of the events.
        lease_fencing_token: recorded on the invoice (``invoices.lease_fencing_token``).
        credit: the credit note of the revision ``draft`` supersedes (a correction).
        before / after: the caller's checks and extra rows, in the same transaction.
        issued_at: the issue time (default: now, UTC).
        stores: the store implementations (default: the PostgreSQL ones,
            :data:`streams.core.billing.stores.POSTGRES`).

    Returns:
        :class:`Issued`, or :class:`NotIssued` when someone else wrote first.
    """
    issued_at = issued_at or datetime.now(UTC)
    db: Stores[Any] = POSTGRES if stores is None else stores
    period = draft.billing_period
    partition_fence = (
        (fence.group_id, fence.generation, fence.member_id)
        if isinstance(fence, FencingToken)
        else None
    )
    try:
        # A partition fence with nothing to write before the invoice is checked by the
        # invoice's own insert (one statement less per invoice); anything else first.
        folded = (
            fence if isinstance(fence, FencingToken) and before is None and credit is None else None
        )
        with pool.connection() as conn, conn.transaction():
            if folded is None:
                db.check(conn, fence)
            if before is not None:
                before(conn)
            credit_number: str | None = None
            if credit is not None:
                # after partial credit notes, the full note credits only what is open
                credit = db.invoices.open_credit(conn, credit)
                credit_number = credit_note_number(
                    period, db.invoices.next_number(conn, f"CN-{period}")
                )
                if not db.invoices.insert_credit_note(
                    conn, credit, number=credit_number, issued_at=issued_at
                ):
                    raise _Conflict("the issued revision was credited meanwhile")
                if not db.invoices.supersede(conn, credit.invoice_id):
                    raise _Conflict("the issued revision was superseded meanwhile")
            if not db.invoices.insert_invoice(
                conn,
                draft,
                number=pending_number(draft.invoice_id),
                fence=partition_fence,
                lease_fencing_token=lease_fencing_token,
                issued_at=issued_at,
                checked=folded,
            ):
                raise _Conflict(f"revision {draft.revision} was written meanwhile")
            # Numbered last: from here to the commit the period's counter row is locked,
            # and every other issuance of the period waits (docs/decisions/0006-gapless-invoice-numbers.md).
            number = db.invoices.number_invoice(conn, draft.invoice_id, period)
            customer_id = draft.customer.customer_id
            if credit is not None and credit_number is not None:
                db.invoices.insert_outbox(
                    conn,
                    event_id=outbox_event_id(CreditNoteIssued.event_type, credit.credit_note_id),
                    topic=invoices_topic,
                    customer_id=customer_id,
                    event=credit_note_issued(credit, credit_number, issued_at),
                    source=source,
                    time=issued_at,
                    document_id=credit.credit_note_id,
                )
            db.invoices.insert_outbox(
                conn,
                event_id=outbox_event_id(InvoiceIssued.event_type, draft.invoice_id),
                topic=invoices_topic,
                customer_id=customer_id,
                event=invoice_issued(draft, number, issued_at),
                source=source,
                time=issued_at,
                document_id=draft.invoice_id,
            )
            issued = Issued(
                invoice_id=draft.invoice_id,
                invoice_number=number,
                issued_at=issued_at,
                credit_note_id=credit.credit_note_id if credit is not None else None,
                credit_note_number=credit_number,
            )
            if after is not None:
                after(conn, issued)
    except _Conflict as conflict:  # rolled back: the numbers are given back
        return NotIssued(conflict.reason)
    return issued


def invoice_issued(draft: InvoiceDraft, number: str, issued_at: datetime) -> InvoiceIssued:
    """The ``invoice.issued`` event of a draft (docs/design.md "Topics"); a rated invoice's
    event also carries its charge lines and rating summary (absent otherwise)."""
    totals = draft.totals
    return InvoiceIssued(
        invoice_id=draft.invoice_id,
        invoice_number=number,
        revision=draft.revision,
        customer_id=draft.customer.customer_id,
        customer_name=draft.customer.name,
        email=draft.customer.email,
        billing_period=draft.billing_period,
        currency=totals.currency,
        line_count=totals.line_count,
        subtotal=totals.subtotal,
        tax_total=totals.tax_total,
        total=totals.total,
        taxes=totals.taxes,
        largest_lines=totals.largest_lines,
        issued_at=issued_at,
        supersedes_invoice_id=draft.supersedes_invoice_id,
        source=totals.source,
        charges=totals.charges if totals.rating is not None else None,
        rating=totals.rating,
    )


def credit_note_issued(note: CreditNoteDraft, number: str, issued_at: datetime) -> CreditNoteIssued:
    """The ``credit_note.issued`` event of a credit note (its reason cut to 500 characters)."""
    return CreditNoteIssued(
        credit_note_id=note.credit_note_id,
        credit_note_number=number,
        invoice_id=note.invoice_id,
        invoice_number=note.invoice_number,
        revision=note.revision,
        customer_id=note.customer.customer_id,
        customer_name=note.customer.name,
        email=note.customer.email,
        billing_period=note.billing_period,
        currency=note.currency,
        subtotal=note.subtotal,
        tax_total=note.tax_total,
        total=note.total,
        reason=note.reason[:500],
        issued_at=issued_at,
    )
