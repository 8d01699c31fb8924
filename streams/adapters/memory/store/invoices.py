"""Twin of :mod:`streams.core.billing.store.invoices`: invoices, lines, numbering, credit notes
and the outbox in memory (the :class:`~streams.core.billing.ports.InvoiceStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`).

Kept as PostgreSQL has it (migration 0001): ``INSERT … ON CONFLICT DO NOTHING`` over
every unique key of ``invoices`` (the id, the number, ``(customer_id,
billing_period, revision)``, at most one ``issued`` revision per ``(customer_id,
billing_period)``) and of ``credit_notes`` (the id, the number, the credited
``invoice_id``); the checks (``total = subtotal + tax_total``, the period, revision
≥ 1) raised before the conflict is looked at and the foreign keys after the row
went in; ``invoice_lines`` unique per ``(invoice_id, event_id)``; outbox ids unique
(no ``ON CONFLICT``: a second row with an id raises); gapless numbers from
``document_counters`` in the caller's transaction; uuids read back in canonical
text form; ``issued_at`` / ``created_at`` defaulting to ``now()``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import psycopg

from streams.adapters.memory import fencing as memory_fencing
from streams.adapters.memory.database import MemoryConnection, Statement
from streams.adapters.memory.store.tables import (
    CREDIT_NOTES,
    DOCUMENT_COUNTERS,
    EMAIL_DELIVERIES,
    INVOICE_LINES,
    INVOICES,
    OUTBOX,
    CreditNoteRow,
    InvoiceLineRow,
    InvoiceRow,
    OutboxRow,
    as_uuid,
    check_period,
)
from streams.core.billing.fencing import FencingToken
from streams.core.billing.rows import (
    CreditNoteDraft,
    InvoiceDraft,
    IssuedInvoice,
    LockedInvoice,
    StoredInvoice,
    StoredInvoiceLine,
)
from streams.core.billing.store.invoices import (
    Document,
    InvoiceNumberTaken,
    OutboxEvent,
    UnsentInvoice,
    credit_note_number,
    invoice_number,
    pending_number,
)
from streams.core.domain.events import EventData
from streams.topics import is_outbox_route

__all__ = [
    "credit_note_number",
    "current_invoice",
    "documents",
    "insert_credit_note",
    "insert_invoice",
    "insert_outbox",
    "insert_outbox_row",
    "invoice_number",
    "invoices_without_email",
    "latest_outbox_event",
    "lock_issued",
    "max_revision",
    "next_number",
    "number_invoice",
    "open_credit",
    "revisions",
    "stored_invoice",
    "stored_invoice_lines",
    "supersede",
]


# --------------------------------------------------------------------------- numbering


def next_number(conn: MemoryConnection, series: str) -> int:
    """The next number of ``series``, gapless (given back by a rollback)."""
    with conn.statement("invoices.next_number") as stmt:
        counters = stmt.table(DOCUMENT_COUNTERS)
        value: int = counters.get(series, 0) + 1
        counters[series] = value
        return value


def number_invoice(conn: MemoryConnection, invoice_id: str, billing_period: str) -> str:
    """Number the invoice this transaction inserted under its provisional number (see
    :func:`streams.core.billing.store.invoices.number_invoice`; the twin does not refuse
    a commit of an unnumbered invoice, PostgreSQL's deferred trigger does).

    Raises:
        InvoiceNumberTaken: the next number is already another invoice's.
        psycopg.errors.InsufficientPrivilege: not a provisional invoice of this transaction.
    """
    with conn.statement("invoices.number_invoice") as stmt:
        key = as_uuid(stmt, invoice_id, "invoice_id")
        table = stmt.table(INVOICES)
        row: InvoiceRow | None = table.get(key)
        if (
            row is None
            or row.billing_period != billing_period
            or row.invoice_number != pending_number(key)
            or not stmt.inserted_here(INVOICES, key)
        ):
            raise stmt.insufficient_privilege(
                f"invoice {key} has no provisional number of period {billing_period} "
                "in this transaction to replace"
            )
        counters = stmt.table(DOCUMENT_COUNTERS)
        series = f"INV-{row.billing_period}"
        value: int = counters.get(series, 0) + 1
        counters[series] = value
        number = invoice_number(row.billing_period, value)
        if any(other.invoice_number == number for other in table.values()):
            stmt.fail(psycopg.errors.UniqueViolation(f"invoice number {number} exists"))
            raise InvoiceNumberTaken(
                f"the next number of the series is already used by another invoice; invoice "
                f"{key} was not written (check document_counters against the invoices issued): "
                f"{number}"
            )
        table[key] = replace(row, invoice_number=number)
        return number


# --------------------------------------------------------------------------- invoices


def _issued(stmt: Statement, customer_id: str, billing_period: str) -> InvoiceRow | None:
    for row in stmt.table(INVOICES).values():
        if (
            row.customer_id == customer_id
            and row.billing_period == billing_period
            and row.status == "issued"
        ):
            found: InvoiceRow = row
            return found
    return None


def current_invoice(
    conn: MemoryConnection, customer_id: str, billing_period: str
) -> IssuedInvoice | None:
    """The issued (current) revision of the customer's invoice for the period, if any."""
    with conn.statement("invoices.current_invoice") as stmt:
        row = _issued(stmt, customer_id, billing_period)
        if row is None:
            return None
        return IssuedInvoice(
            row.invoice_id, row.invoice_number, row.revision, row.status, row.subtotal, row.total
        )


def _check_amounts(
    stmt: Statement, table: str, subtotal: object, tax: object, total: object
) -> None:
    if total != subtotal + tax:  # type: ignore[operator]
        raise stmt.check_violation(f"{table}_check", f"total {total} <> {subtotal} + {tax}")


def insert_invoice(
    conn: MemoryConnection,
    draft: InvoiceDraft,
    *,
    number: str,
    fence: tuple[str, int, str] | None,
    lease_fencing_token: int | None,
    issued_at: datetime,
    checked: FencingToken | None = None,
) -> bool:
    """Insert the invoice and its lines; False when a unique key says it exists (see
    :func:`streams.core.billing.store.invoices.insert_invoice`); with ``checked``, only
    while the partition's fence holds that token (checked first: the twin has no
    concurrent claim to re-read).

    Raises:
        Fenced: ``checked`` is given and the fence holds another token (or none).
        InvoiceNumberTaken: the only conflict was the number.
        psycopg.errors.CheckViolation / ForeignKeyViolation / UniqueViolation: as
            PostgreSQL would.
    """
    if checked is not None:
        memory_fencing.check(conn, checked)
    totals = draft.totals
    with conn.statement("invoices.insert_invoice") as stmt:
        invoice_id = as_uuid(stmt, draft.invoice_id, "invoice_id")
        supersedes = (
            as_uuid(stmt, draft.supersedes_invoice_id, "supersedes_invoice_id")
            if draft.supersedes_invoice_id is not None
            else None
        )
        check_period(stmt, INVOICES, draft.billing_period)
        if draft.revision < 1:
            raise stmt.check_violation("invoices_revision_check", f"revision {draft.revision}")
        if totals.line_count < 0:
            raise stmt.check_violation("invoices_line_count_check", f"{totals.line_count}")
        _check_amounts(stmt, INVOICES, totals.subtotal, totals.tax_total, totals.total)
        table = stmt.table(INVOICES)
        customer_id = draft.customer.customer_id
        conflict = invoice_id in table or any(
            row.invoice_number == number
            or (
                row.customer_id == customer_id
                and row.billing_period == draft.billing_period
                and (row.revision == draft.revision or row.status == "issued")
            )
            for row in table.values()
        )
        if conflict:
            same = invoice_id in table or any(
                row.customer_id == customer_id
                and row.billing_period == draft.billing_period
                and (row.revision == draft.revision or row.status == "issued")
                for row in table.values()
            )
            if not same:
                raise InvoiceNumberTaken(
                    f"invoice number {number} is already used by another invoice; "
                    f"{customer_id} {draft.billing_period} revision {draft.revision} "
                    "was not written (check document_counters against the invoices issued)"
                )
            return False
        taxed = {t.line_id: t for t in draft.taxed}
        lines = [
            InvoiceLineRow(
                invoice_id=invoice_id,
                line_no=n,
                event_id=line.event_id,
                amount=line.amount,
                quantity=line.quantity,
                unit=line.unit,
                description=line.description,
                sku_id=line.sku_id,
                region_id=line.region_id,
                tax_code=taxed[line.event_id].tax_code,
                tax_rate=taxed[line.event_id].rate,
                tax=taxed[line.event_id].tax,
                source_topic=line.source_topic,
                source_partition=line.source_partition,
                source_offset=line.source_offset,
            )
            for n, line in enumerate(draft.lines, start=1)
        ]
        if supersedes is not None and supersedes not in table:
            raise stmt.foreign_key_violation(
                "invoices_supersedes_invoice_id_fkey",
                f"Key (supersedes_invoice_id)=({supersedes}) is not present in table invoices.",
            )
        seen: set[str] = set()
        for line in lines:
            if line.event_id in seen:
                raise stmt.unique_violation(
                    "invoice_lines_invoice_id_event_id_key",
                    f"Key (invoice_id, event_id)=({invoice_id}, {line.event_id}) already exists.",
                )
            seen.add(line.event_id)
        first = min((line.source_offset for line in draft.lines), default=None)
        last = max((line.source_offset for line in draft.lines), default=None)
        table[invoice_id] = InvoiceRow(
            invoice_id=invoice_id,
            invoice_number=number,
            customer_id=customer_id,
            billing_period=draft.billing_period,
            revision=draft.revision,
            status="issued",
            customer_name=draft.customer.name,
            email=draft.customer.email,
            currency=totals.currency,
            line_count=totals.line_count,
            subtotal=totals.subtotal,
            tax_total=totals.tax_total,
            total=totals.total,
            taxes=[t.model_dump(mode="json") for t in totals.taxes],
            close_event_id=draft.marker.event_id,
            source_topic=draft.marker.source.topic,
            source_partition=draft.marker.source.partition,
            first_offset=first,
            last_offset=last,
            close_offset=draft.marker.source.offset,
            fence_group=fence[0] if fence else None,
            fence_generation=fence[1] if fence else None,
            fence_member=fence[2] if fence else None,
            lease_fencing_token=lease_fencing_token,
            supersedes_invoice_id=supersedes,
            issued_at=issued_at,
        )
        invoice_lines = stmt.table(INVOICE_LINES)
        for line in lines:
            invoice_lines[(invoice_id, line.line_no)] = line
        return True


def lock_issued(
    conn: MemoryConnection, customer_id: str, billing_period: str
) -> LockedInvoice | None:
    """The customer's issued revision, "locked ``FOR UPDATE``": the twin's transaction
    holds the whole database until it ends."""
    with conn.statement("invoices.lock_issued") as stmt:
        row = _issued(stmt, customer_id, billing_period)
        return LockedInvoice(row.invoice_id, row.revision) if row is not None else None


def max_revision(conn: MemoryConnection, customer_id: str, billing_period: str) -> int:
    """The customer's highest revision of the period (0: none)."""
    with conn.statement("invoices.max_revision") as stmt:
        return max(
            (
                row.revision
                for row in stmt.table(INVOICES).values()
                if row.customer_id == customer_id and row.billing_period == billing_period
            ),
            default=0,
        )


def revisions(conn: MemoryConnection, billing_period: str, topic: str) -> dict[str, int]:
    """customer → its highest revision of the period built from ``topic``, whatever the status."""
    with conn.statement("invoices.revisions") as stmt:
        found: dict[str, int] = {}
        for row in stmt.table(INVOICES).values():
            if row.billing_period == billing_period and row.source_topic == topic:
                found[row.customer_id] = max(found.get(row.customer_id, 0), row.revision)
        return found


def supersede(conn: MemoryConnection, invoice_id: str) -> bool:
    """``issued`` → ``superseded``; False when the revision was no longer ``issued``."""
    with conn.statement("invoices.supersede") as stmt:
        key = as_uuid(stmt, invoice_id, "invoice_id")
        table = stmt.table(INVOICES)
        row: InvoiceRow | None = table.get(key)
        if row is None or row.status != "issued":
            return False
        table[key] = replace(row, status="superseded")
        return True


def stored_invoice(conn: MemoryConnection, invoice_id: str) -> StoredInvoice | None:
    """The stored head of invoice revision ``invoice_id`` (any status), if it exists."""
    with conn.statement("invoices.stored_invoice") as stmt:
        row: InvoiceRow | None = stmt.table(INVOICES).get(as_uuid(stmt, invoice_id, "invoice_id"))
        if row is None:
            return None
        return StoredInvoice(
            invoice_id=row.invoice_id,
            customer_id=row.customer_id,
            billing_period=row.billing_period,
            revision=row.revision,
            invoice_number=row.invoice_number,
            customer_name=row.customer_name,
            email=row.email,
            currency=row.currency.strip(),
            issued_at=row.issued_at,
            supersedes_invoice_id=row.supersedes_invoice_id,
            close_event_id=row.close_event_id,
            source_topic=row.source_topic,
            source_partition=row.source_partition,
            close_offset=row.close_offset,
        )


def stored_invoice_lines(conn: MemoryConnection, invoice_id: str) -> list[StoredInvoiceLine]:
    """The lines of invoice revision ``invoice_id``, in line order."""
    with conn.statement("invoices.stored_invoice_lines") as stmt:
        key = as_uuid(stmt, invoice_id, "invoice_id")
        rows = sorted(
            (line for line in stmt.table(INVOICE_LINES).values() if line.invoice_id == key),
            key=lambda line: line.line_no,
        )
        return [
            StoredInvoiceLine(
                event_id=r.event_id,
                amount=r.amount,
                quantity=r.quantity,
                unit=r.unit,
                description=r.description,
                sku_id=r.sku_id,
                region_id=r.region_id,
                tax_code=r.tax_code,
                tax_rate=r.tax_rate,
                tax=r.tax,
                source_topic=r.source_topic,
                source_partition=r.source_partition,
                source_offset=r.source_offset,
            )
            for r in rows
        ]


def documents(conn: MemoryConnection) -> list[Document]:
    """Every invoice revision (``invoice.issued``) and credit note (``credit_note.issued``)."""
    with conn.statement("invoices.documents") as stmt:
        found = [
            Document("invoice.issued", row.invoice_id, row.invoice_number, row.customer_id)
            for row in stmt.table(INVOICES).values()
        ]
        found += [
            Document("credit_note.issued", n.credit_note_id, n.credit_note_number, n.customer_id)
            for n in stmt.table(CREDIT_NOTES).values()
        ]
        return found


def invoices_without_email(conn: MemoryConnection, grace: timedelta) -> list[UnsentInvoice]:
    """Invoice revisions with a non-zero total, issued more than ``grace`` before
    ``now()``, whose own email (not its void's) was neither sent nor recorded as skipped."""
    with conn.statement("invoices.invoices_without_email") as stmt:
        settled = {
            d.document_id
            for d in stmt.table(EMAIL_DELIVERIES).values()
            if d.status in ("sent", "skipped") and d.document_type == "invoice"
        }
        return [
            UnsentInvoice(row.invoice_id, row.invoice_number)
            for row in stmt.table(INVOICES).values()
            if row.total != 0 and row.issued_at < stmt.now - grace and row.invoice_id not in settled
        ]


# --------------------------------------------------------------------------- credit notes


def open_credit(conn: MemoryConnection, note: CreditNoteDraft) -> CreditNoteDraft:
    """``note`` unchanged: the memory store has no partial credit notes (they are written
    only by PostgreSQL's ``credit_invoice_lines()``, migration 0021)."""
    with conn.statement("invoices.open_credit"):
        return note


def insert_credit_note(
    conn: MemoryConnection, note: CreditNoteDraft, *, number: str, issued_at: datetime
) -> bool:
    """Insert the credit note of ``note.invoice_id``; False when that revision was already
    credited or the id or number exists."""
    with conn.statement("invoices.insert_credit_note") as stmt:
        note_id = as_uuid(stmt, note.credit_note_id, "credit_note_id")
        invoice_id = as_uuid(stmt, note.invoice_id, "invoice_id")
        check_period(stmt, CREDIT_NOTES, note.billing_period)
        _check_amounts(stmt, CREDIT_NOTES, note.subtotal, note.tax_total, note.total)
        table = stmt.table(CREDIT_NOTES)
        if note_id in table or any(
            n.credit_note_number == number or n.invoice_id == invoice_id for n in table.values()
        ):
            return False
        if invoice_id not in stmt.table(INVOICES):
            raise stmt.foreign_key_violation(
                "credit_notes_invoice_id_fkey",
                f"Key (invoice_id)=({invoice_id}) is not present in table invoices.",
            )
        table[note_id] = CreditNoteRow(
            credit_note_id=note_id,
            credit_note_number=number,
            invoice_id=invoice_id,
            customer_id=note.customer.customer_id,
            billing_period=note.billing_period,
            currency=note.currency,
            subtotal=note.subtotal,
            tax_total=note.tax_total,
            total=note.total,
            reason=note.reason[:2000],
            issued_at=issued_at,
        )
        return True


# --------------------------------------------------------------------------- outbox


def insert_outbox_row(
    conn: MemoryConnection,
    *,
    event_id: str,
    topic: str,
    customer_id: str,
    event_type: str,
    payload: str,
    source: str,
    time: datetime,
    document_id: str,
) -> None:
    """One outbox row from its parts (``payload``: the event data's JSON text).

    Raises:
        psycopg.errors.UniqueViolation: an outbox row with ``event_id`` exists.
        psycopg.errors.InvalidTextRepresentation: ``payload`` is not JSON, or an id not a uuid.
        psycopg.errors.CheckViolation: ``topic`` is not the invoices topic
            (``outbox_routes_to_invoices``, :func:`streams.topics.is_outbox_route`).
    """
    with conn.statement("invoices.insert_outbox_row") as stmt:
        if not is_outbox_route(topic):
            raise stmt.check_violation(
                "outbox_routes_to_invoices", f"aggregatetype {topic!r} is not the invoices topic"
            )
        row_id = as_uuid(stmt, event_id, "id")
        document = as_uuid(stmt, document_id, "document_id")
        try:
            parsed = json.loads(payload)
        except ValueError as exc:
            raise stmt.fail(
                psycopg.errors.InvalidTextRepresentation(
                    f"invalid input syntax for type json: {exc}"
                )
            ) from exc
        table = stmt.table(OUTBOX)
        if row_id in table:
            raise stmt.unique_violation("outbox_pkey", f"Key (id)=({row_id}) already exists.")
        table[row_id] = OutboxRow(
            id=row_id,
            aggregatetype=topic,
            aggregateid=customer_id,
            type=event_type,
            payload=parsed,
            ce_source=source,
            ce_time=time.isoformat().replace("+00:00", "Z"),
            document_id=document,
            created_at=stmt.now,
            seq=stmt.next_value("outbox_seq"),
        )


def insert_outbox(
    conn: MemoryConnection,
    *,
    event_id: str,
    topic: str,
    customer_id: str,
    event: EventData,
    source: str,
    time: datetime,
    document_id: str,
) -> None:
    """One outbox row carrying ``event`` (see :func:`insert_outbox_row`)."""
    insert_outbox_row(
        conn,
        event_id=event_id,
        topic=topic,
        customer_id=customer_id,
        event_type=event.event_type,
        payload=json.dumps(event.model_dump(mode="json")),
        source=source,
        time=time,
        document_id=document_id,
    )


def latest_outbox_event(conn: MemoryConnection, document_id: str) -> OutboxEvent | None:
    """The newest outbox row of ``document_id`` still kept."""
    with conn.statement("invoices.latest_outbox_event") as stmt:
        key = as_uuid(stmt, document_id, "document_id")
        rows = [row for row in stmt.table(OUTBOX).values() if row.document_id == key]
        if not rows:
            return None
        newest = max(rows, key=lambda row: (row.created_at, row.seq))
        return OutboxEvent(newest.aggregateid, newest.type, newest.payload)
