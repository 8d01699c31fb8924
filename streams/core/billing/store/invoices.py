"""Issued documents: ``invoices``, ``invoice_lines``, ``document_counters``,
``credit_notes`` and the transactional ``outbox``.

The constraints that make issuance idempotent are in migration 0001: unique
``(customer_id, billing_period, revision)``, at most one ``issued`` revision per
``(customer_id, billing_period)`` (partial unique index), unique
``invoice_number`` and ``credit_notes.invoice_id``. Writers use ``INSERT … ON
CONFLICT DO NOTHING`` and read "nothing inserted" as "someone wrote it first".
Numbers are gapless per series (``INV-<period>``, ``CN-<period>``): the counter
row is incremented inside the document's own transaction, so a rollback also
returns the number (docs/decisions/0006-gapless-invoice-numbers.md). An invoice is
inserted under a provisional number (:func:`pending_number`) and numbered last, just
before the commit (:func:`number_invoice`), so the period's counter row is locked only
for the end of the transaction.

The only update an issued invoice ever sees is ``issued`` → ``superseded``
(:func:`supersede`); amounts, lines and numbers are never changed (docs/design.md "Database roles").

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
Shapes: money ``Decimal`` in currency units, periods ``YYYY-MM``, times UTC.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.rows import args_row, class_row, scalar_row

from streams.core.billing import fencing
from streams.core.billing.fencing import FencingToken
from streams.core.billing.rows import (
    CreditNoteDraft,
    InvoiceDraft,
    IssuedInvoice,
    LockedInvoice,
    StoredInvoice,
    StoredInvoiceLine,
)
from streams.core.domain.events import ChargeSummary, EventData, RatingSummary
from streams.core.domain.invoice import TaxedLine
from streams.errors import InvoicingError

__all__ = [
    "Document",
    "InvoiceNumberTaken",
    "OutboxEvent",
    "StoredCharge",
    "UnsentInvoice",
    "credit_note_number",
    "current_invoice",
    "documents",
    "insert_charges",
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
    "pending_number",
    "revisions",
    "stored_charges",
    "stored_invoice",
    "stored_invoice_lines",
    "stored_offsets",
    "stored_rating",
    "supersede",
]


class InvoiceNumberTaken(InvoicingError):
    """An invoice number was already used by another document (an integrity error)."""


# --------------------------------------------------------------------------- numbering


def next_number(conn: psycopg.Connection[Any], series: str) -> int:
    """The next number of ``series``, gapless: the counter row is incremented inside the
    caller's transaction, so a rollback also returns the number."""
    with conn.cursor(row_factory=scalar_row) as cur:
        value = cur.execute(
            """
            INSERT INTO document_counters (series, last_value) VALUES (%s, 1)
            ON CONFLICT (series) DO UPDATE SET last_value = document_counters.last_value + 1
            RETURNING last_value
            """,
            (series,),
        ).fetchone()
    assert value is not None  # INSERT … RETURNING always returns the row
    return int(value)


def pending_number(invoice_id: str) -> str:
    """The provisional number ``PENDING-<invoice id>`` an invoice is inserted under until
    :func:`number_invoice` numbers it in the same transaction (unique by construction;
    migration 0025 refuses to commit an invoice still under it).

    Raises:
        ValueError: ``invoice_id`` is not a UUID.
    """
    return f"PENDING-{uuid.UUID(invoice_id)}"


def number_invoice(conn: psycopg.Connection[Any], invoice_id: str, billing_period: str) -> str:
    """Number the invoice of ``billing_period`` (``YYYY-MM``) this transaction inserted under
    :func:`pending_number`: the next number of the period's ``INV-<period>`` series
    (:func:`invoice_number`'s format), in one statement (``number_invoice(uuid, text)``,
    migration 0025). The counter row stays locked until the commit, so call it last,
    just before the commit.

    Returns:
        The number, e.g. ``INV-2024-09-000042``.

    Raises:
        InvoiceNumberTaken: the number is already another invoice's (the counter fell
            out of step with the invoices issued); the transaction is aborted.
        psycopg.errors.InsufficientPrivilege: no provisional invoice of that period is
            this transaction's (another period, numbered already, or committed).
        psycopg.Error: the database failed.
    """
    try:
        with conn.cursor(row_factory=scalar_row) as cur:
            number = cur.execute(
                "SELECT number_invoice(%s, %s)", (invoice_id, billing_period)
            ).fetchone()
    except psycopg.errors.UniqueViolation as exc:
        raise InvoiceNumberTaken(
            f"the next number of the series is already used by another invoice; invoice "
            f"{invoice_id} was not written (check document_counters against the invoices "
            f"issued): {exc.diag.message_detail or exc}"
        ) from exc
    assert number is not None  # the function returns the number or raises
    return str(number)


def invoice_number(billing_period: str, sequence: int) -> str:
    """Readable invoice number: ``INV-2024-09-000042`` (series per billing period)."""
    return f"INV-{billing_period}-{sequence:06d}"


def credit_note_number(billing_period: str, sequence: int) -> str:
    """Readable credit note number: ``CN-2024-09-000001`` (gapless series per period)."""
    return f"CN-{billing_period}-{sequence:06d}"


# --------------------------------------------------------------------------- invoices


def current_invoice(
    conn: psycopg.Connection[Any], customer_id: str, billing_period: str
) -> IssuedInvoice | None:
    """The issued (current) revision of the customer's invoice for the period, if any.

    Raises:
        psycopg.Error: the database failed.
    """
    with conn.cursor(row_factory=class_row(IssuedInvoice)) as cur:
        return cur.execute(
            "SELECT invoice_id::text, invoice_number, revision, status, subtotal, total FROM invoices "
            "WHERE customer_id = %s AND billing_period = %s AND status = 'issued'",
            (customer_id, billing_period),
        ).fetchone()


_INVOICE_COLUMNS = """invoice_id, invoice_number, customer_id, billing_period, revision, status,
    customer_name, email, currency, line_count, subtotal, tax_total, total, taxes, close_event_id,
    source_topic, source_partition, first_offset, last_offset, close_offset,
    fence_group, fence_generation, fence_member, lease_fencing_token, supersedes_invoice_id, issued_at,
    rating"""

_INSERT_INVOICE = f"""
INSERT INTO invoices ({_INVOICE_COLUMNS})
VALUES (%s, %s, %s, %s, %s, 'issued', %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
        %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING
RETURNING invoice_id
"""

# The same row, inserted only while the partition's fence row holds the writer's token; the
# subquery's FOR SHARE locks the row as fencing.check does, and READ COMMITTED re-reads a
# row a concurrent claim updated, so a claim committed first makes the insert write nothing.
# The casts type the parameters, which a SELECT list leaves untyped.
_INSERT_INVOICE_FENCED = f"""
INSERT INTO invoices ({_INVOICE_COLUMNS})
SELECT %s::uuid, %s::text, %s::text, %s::text, %s::integer, 'issued', %s::text, %s::text,
       %s::text, %s::integer, %s::numeric, %s::numeric, %s::numeric, %s::jsonb, %s::text,
       %s::text, %s::integer, %s::bigint, %s::bigint, %s::bigint, %s::text, %s::integer,
       %s::text, %s::bigint, %s::uuid, %s::timestamptz, %s::jsonb
 WHERE EXISTS (SELECT FROM partition_fences
                WHERE group_id = %s AND topic = %s AND partition = %s
                  AND generation = %s AND member_id = %s
                  FOR SHARE)
ON CONFLICT DO NOTHING
RETURNING invoice_id
"""


def insert_invoice(
    conn: psycopg.Connection[Any],
    draft: InvoiceDraft,
    *,
    number: str,
    fence: tuple[str, int, str] | None,
    lease_fencing_token: int | None,
    issued_at: datetime,
    checked: FencingToken | None = None,
) -> bool:
    """Insert the invoice and its lines. Returns False (nothing written) when the same invoice id, a
    row for (customer, period, revision), or a current revision of (customer, period) already
    exists: ``INSERT … ON CONFLICT DO NOTHING`` (docs/design.md "Ownership and fencing"; the
    constraints are in migration 0001).

    Args:
        fence: the partition fence that wrote it, ``(group, generation, member id)``
            (``invoices.fence_*``), None for a lease-fenced writer.
        lease_fencing_token: the lease fencing number recorded with it, if any.
        checked: a partition fence to check in the same statement: the invoice row is
            inserted only while the fence row holds this token, and the row is locked
            ``FOR SHARE`` by the insert itself (the check of
            :func:`streams.core.billing.fencing.check`, folded into the write: one
            statement less per invoice). None: the caller checked its fence before.

    Raises:
        Fenced: ``checked`` is given and the fence row holds another token (or none);
            nothing was written.
        InvoiceNumberTaken: the only conflict was ``invoice_number`` (the number
            series fell out of step with the numbers issued): never read as "already
            invoiced", which would leave the customer silently without an invoice.
        psycopg.Error: the database failed.
    """
    totals = draft.totals
    # The offsets of what the invoice was built from on the marker's partition: its
    # usage lines and (rated invoices) its metered events (totals.source).
    offsets = [line.source_offset for line in draft.lines] + [
        bound
        for span in totals.source
        if span.topic == draft.marker.source.topic
        and span.partition == draft.marker.source.partition
        for bound in (span.first_offset, span.last_offset)
    ]
    first = min(offsets, default=None)
    last = max(offsets, default=None)
    with conn.cursor(row_factory=scalar_row) as cur:
        inserted = cur.execute(
            _INSERT_INVOICE if checked is None else _INSERT_INVOICE_FENCED,
            (
                draft.invoice_id,
                number,
                draft.customer.customer_id,
                draft.billing_period,
                draft.revision,
                draft.customer.name,
                draft.customer.email,
                totals.currency,
                totals.line_count,
                totals.subtotal,
                totals.tax_total,
                totals.total,
                json.dumps([t.model_dump(mode="json") for t in totals.taxes]),
                draft.marker.event_id,
                draft.marker.source.topic,
                draft.marker.source.partition,
                first,
                last,
                draft.marker.source.offset,
                fence[0] if fence else None,
                fence[1] if fence else None,
                fence[2] if fence else None,
                lease_fencing_token,
                draft.supersedes_invoice_id,
                issued_at,
                None if totals.rating is None else totals.rating.model_dump_json(),
                *(
                    ()
                    if checked is None
                    else (
                        checked.group_id,
                        checked.topic,
                        checked.partition,
                        checked.generation,
                        checked.member_id,
                    )
                ),
            ),
        ).fetchone()
        if inserted is None:
            if checked is not None:
                # nothing inserted: the fence (raises Fenced) or a unique key (below)
                fencing.check(conn, checked)
            same = cur.execute(
                """
                SELECT 1 FROM invoices
                 WHERE invoice_id = %s
                    OR (customer_id = %s AND billing_period = %s
                        AND (revision = %s OR status = 'issued'))
                 LIMIT 1
                """,
                (
                    draft.invoice_id,
                    draft.customer.customer_id,
                    draft.billing_period,
                    draft.revision,
                ),
            ).fetchone()
            if same is None:
                raise InvoiceNumberTaken(
                    f"invoice number {number} is already used by another invoice; "
                    f"{draft.customer.customer_id} {draft.billing_period} revision {draft.revision} "
                    "was not written (check document_counters against the invoices issued)"
                )
            return False
    taxed = {t.line_id: t for t in draft.taxed}
    insert_lines(conn, draft, taxed)
    if totals.charges:
        insert_charges(conn, draft.invoice_id, totals.charges, taxed)
    return True


#: The columns of ``invoice_lines`` :func:`insert_lines` writes, in order.
LINE_COLUMNS = (
    "invoice_id",
    "line_no",
    "event_id",
    "amount",
    "quantity",
    "unit",
    "description",
    "sku_id",
    "region_id",
    "tax_code",
    "tax_rate",
    "tax",
    "source_topic",
    "source_partition",
    "source_offset",
)


def insert_lines(
    conn: psycopg.Connection[Any], draft: InvoiceDraft, taxed: Mapping[str, TaxedLine]
) -> None:
    """The usage lines of a new invoice revision (``invoice_lines``, numbered from 1 in
    ``draft.lines`` order, each with its tax from ``taxed`` by event id), in one ``COPY``:
    one statement whatever the number of lines, where ``executemany`` sent one per line
    while the period's number counter is held (docs/benchmarks.md, "Invoice lines by
    COPY"). The insert trigger of migration 0006 still checks every row.

    Raises:
        KeyError: a line without its tax in ``taxed``.
        psycopg.Error: the database failed (a constraint, the trigger).
    """
    columns = ", ".join(LINE_COLUMNS)
    with conn.cursor() as cur, cur.copy(f"COPY invoice_lines ({columns}) FROM STDIN") as copy:
        for n, line in enumerate(draft.lines, start=1):
            tax = taxed[line.event_id]
            copy.write_row(
                (
                    draft.invoice_id,
                    n,
                    line.event_id,
                    line.amount,
                    line.quantity,
                    line.unit,
                    line.description,
                    line.sku_id,
                    line.region_id,
                    tax.tax_code,
                    tax.rate,
                    tax.tax,
                    line.source_topic,
                    line.source_partition,
                    line.source_offset,
                )
            )


def insert_charges(
    conn: psycopg.Connection[Any],
    invoice_id: str,
    charges: Sequence[ChargeSummary],
    taxed: Mapping[str, TaxedLine],
) -> None:
    """The rated charge lines of an invoice revision (``invoice_charges``, migration
    0005), each with its tax (``taxed`` by line id) and, in ``detail``, the line as
    the invoice event states it (so the event can be rebuilt from the rows)."""
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO invoice_charges (invoice_id, line_no, line_id, plan_code, plan_version,
                charge_code, charge_model, description, metric, group_value, unit, quantity,
                unit_price, amount, detail, tax_code, tax_rate, tax)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            """,
            [
                (
                    invoice_id,
                    n,
                    charge.line_id,
                    charge.plan_code,
                    charge.plan_version,
                    charge.charge_code,
                    charge.charge_model,
                    charge.description,
                    charge.metric,
                    charge.group_value,
                    charge.unit,
                    charge.quantity,
                    charge.unit_price,
                    charge.amount,
                    charge.model_dump_json(),
                    taxed[charge.line_id].tax_code,
                    taxed[charge.line_id].rate,
                    taxed[charge.line_id].tax,
                )
                for n, charge in enumerate(charges, start=1)
            ],
        )


@dataclass(frozen=True)
class StoredCharge:
    """One ``invoice_charges`` row: the charge line as invoiced and its tax."""

    detail: ChargeSummary
    tax_code: str
    tax_rate: Decimal
    tax: Decimal


def _stored_charge(detail: Any, tax_code: str, tax_rate: Decimal, tax: Decimal) -> StoredCharge:
    return StoredCharge(ChargeSummary.model_validate(detail), tax_code, tax_rate, tax)


def stored_charges(conn: psycopg.Connection[Any], invoice_id: str) -> list[StoredCharge]:
    """The charge lines of invoice revision ``invoice_id``, in line order."""
    with conn.cursor(row_factory=args_row(_stored_charge)) as cur:
        return cur.execute(
            "SELECT detail, tax_code, tax_rate, tax FROM invoice_charges "
            "WHERE invoice_id = %s ORDER BY line_no",
            (invoice_id,),
        ).fetchall()


def stored_offsets(conn: psycopg.Connection[Any], invoice_id: str) -> tuple[int | None, int | None]:
    """``(first_offset, last_offset)`` of invoice revision ``invoice_id`` (None, None: unknown)."""
    found = conn.execute(
        "SELECT first_offset, last_offset FROM invoices WHERE invoice_id = %s", (invoice_id,)
    ).fetchone()
    return (None, None) if found is None else (found[0], found[1])


def stored_rating(conn: psycopg.Connection[Any], invoice_id: str) -> RatingSummary | None:
    """The rating summary of invoice revision ``invoice_id`` (None: not a rated invoice)."""
    with conn.cursor(row_factory=scalar_row) as cur:
        found = cur.execute(
            "SELECT rating FROM invoices WHERE invoice_id = %s", (invoice_id,)
        ).fetchone()
    return None if found is None else RatingSummary.model_validate(found)


def lock_issued(
    conn: psycopg.Connection[Any], customer_id: str, billing_period: str
) -> LockedInvoice | None:
    """``SELECT … FOR UPDATE`` the customer's issued revision: a concurrent writer of the same
    row (another replay, a void) waits until this transaction ends. Through the definer
    function ``lock_issued_invoice`` (migration 0018): ``FOR UPDATE`` needs an UPDATE grant,
    which the replay role no longer has."""
    with conn.cursor(row_factory=class_row(LockedInvoice)) as cur:
        return cur.execute(
            "SELECT invoice_id, revision FROM lock_issued_invoice(%s, %s)",
            (customer_id, billing_period),
        ).fetchone()


def max_revision(conn: psycopg.Connection[Any], customer_id: str, billing_period: str) -> int:
    """The customer's highest revision of the period (0: none)."""
    with conn.cursor(row_factory=scalar_row) as cur:
        value = cur.execute(
            "SELECT coalesce(max(revision), 0) FROM invoices WHERE customer_id = %s AND billing_period = %s",
            (customer_id, billing_period),
        ).fetchone()
    return int(value) if value is not None else 0


@dataclass(frozen=True)
class _Revision:
    customer_id: str
    revision: int


def revisions(conn: psycopg.Connection[Any], billing_period: str, topic: str) -> dict[str, int]:
    """customer → its highest revision of the period built from ``topic``, whatever the status."""
    with conn.cursor(row_factory=class_row(_Revision)) as cur:
        rows = cur.execute(
            "SELECT customer_id, max(revision) AS revision FROM invoices "
            "WHERE billing_period = %s AND source_topic = %s GROUP BY customer_id",
            (billing_period, topic),
        ).fetchall()
    return {row.customer_id: int(row.revision) for row in rows}


def supersede(conn: psycopg.Connection[Any], invoice_id: str) -> bool:
    """``issued`` → ``superseded`` (the only change an issued invoice ever gets), through
    the definer function ``supersede_invoice`` (migration 0018): the successor revision
    (``supersedes_invoice_id`` = ``invoice_id``) must be inserted by the same transaction,
    else its commit raises ``psycopg.errors.IntegrityConstraintViolation``. False when the
    revision was no longer ``issued``."""
    with conn.cursor(row_factory=scalar_row) as cur:
        found = cur.execute("SELECT supersede_invoice(%s)", (invoice_id,)).fetchone()
    return bool(found)


def stored_invoice(conn: psycopg.Connection[Any], invoice_id: str) -> StoredInvoice | None:
    """The stored head of invoice revision ``invoice_id`` (any status), if it exists."""
    with conn.cursor(row_factory=class_row(StoredInvoice)) as cur:
        return cur.execute(
            """
            SELECT invoice_id::text, customer_id, billing_period, revision, invoice_number,
                   customer_name, email, trim(currency) AS currency, issued_at,
                   supersedes_invoice_id::text, close_event_id, source_topic, source_partition,
                   close_offset
              FROM invoices WHERE invoice_id = %s
            """,
            (invoice_id,),
        ).fetchone()


def stored_invoice_lines(conn: psycopg.Connection[Any], invoice_id: str) -> list[StoredInvoiceLine]:
    """The lines of invoice revision ``invoice_id``, in line order."""
    with conn.cursor(row_factory=class_row(StoredInvoiceLine)) as cur:
        return cur.execute(
            """
            SELECT event_id, amount, quantity, unit, description, sku_id, region_id, tax_code,
                   tax_rate, tax, source_topic, source_partition, source_offset
              FROM invoice_lines WHERE invoice_id = %s ORDER BY line_no
            """,
            (invoice_id,),
        ).fetchall()


@dataclass(frozen=True)
class Document:
    """An issued document (invoice revision or credit note) and the event that announces it."""

    event_type: str
    document_id: str
    number: str
    customer_id: str


def documents(conn: psycopg.Connection[Any]) -> list[Document]:
    """Every invoice revision (``invoice.issued``) and credit note (``credit_note.issued``)."""
    with conn.cursor(row_factory=class_row(Document)) as cur:
        return cur.execute(
            """
            SELECT 'invoice.issued' AS event_type, invoice_id::text AS document_id,
                   invoice_number AS number, customer_id FROM invoices
            UNION ALL
            SELECT 'credit_note.issued', credit_note_id::text, credit_note_number, customer_id
              FROM credit_notes
            """
        ).fetchall()


@dataclass(frozen=True)
class UnsentInvoice:
    """An invoice revision with a non-zero total and no final email delivery."""

    invoice_id: str
    invoice_number: str


def invoices_without_email(conn: psycopg.Connection[Any], grace: timedelta) -> list[UnsentInvoice]:
    """Invoice revisions with a non-zero total, issued more than ``grace`` ago, whose
    own email (not the email of its void) was neither sent nor recorded as skipped
    (``email_deliveries``)."""
    with conn.cursor(row_factory=class_row(UnsentInvoice)) as cur:
        return cur.execute(
            """
            SELECT i.invoice_id::text, i.invoice_number FROM invoices i
             WHERE i.total <> 0 AND i.issued_at < now() - %s
               AND NOT EXISTS (SELECT 1 FROM email_deliveries d
                                WHERE d.document_id = i.invoice_id AND d.document_type = 'invoice'
                                  AND d.status IN ('sent', 'skipped'))
            """,
            (grace,),
        ).fetchall()


# --------------------------------------------------------------------------- credit notes


def open_credit(conn: psycopg.Connection[Any], note: CreditNoteDraft) -> CreditNoteDraft:
    """The full note ``note`` credits only what is still open on its revision: the
    revision's amounts less what its partial credit notes credited (docs/invoices.md
    "Partial credit notes"). Locks the issued revision first (``FOR UPDATE`` through the
    definer function ``lock_issued_invoice``, migration 0018: the replay role has no UPDATE
    grant), so no partial note of ``credit_invoice_lines()`` (migration 0021) can commit
    in between; the replay's later ``issued`` → ``superseded`` then refuses every further
    one."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT invoice_id FROM lock_issued_invoice(%s, %s)",
            (note.customer.customer_id, note.billing_period),
        )
        row = cur.execute(
            """
            SELECT coalesce(sum(subtotal), 0), coalesce(sum(tax_total), 0)
              FROM credit_notes WHERE invoice_id = %s AND kind = 'partial'
            """,
            (note.invoice_id,),
        ).fetchone()
    assert row is not None  # an aggregate returns one row
    subtotal, tax_total = Decimal(row[0]), Decimal(row[1])
    if subtotal == 0 and tax_total == 0:
        return note
    return replace(
        note,
        subtotal=note.subtotal - subtotal,
        tax_total=note.tax_total - tax_total,
        total=note.total - subtotal - tax_total,
    )


def insert_credit_note(
    conn: psycopg.Connection[Any], note: CreditNoteDraft, *, number: str, issued_at: datetime
) -> bool:
    """Insert the credit note of ``note.invoice_id``; False when that revision was already
    credited in full (one ``full`` note per revision: ``credit_notes_one_full`` of
    migration 0021) or the id or number exists."""
    with conn.cursor(row_factory=scalar_row) as cur:
        found = cur.execute(
            """
            INSERT INTO credit_notes (credit_note_id, credit_note_number, invoice_id, customer_id,
                billing_period, currency, subtotal, tax_total, total, reason, issued_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT DO NOTHING
            RETURNING credit_note_id
            """,
            (
                note.credit_note_id,
                number,
                note.invoice_id,
                note.customer.customer_id,
                note.billing_period,
                note.currency,
                note.subtotal,
                note.tax_total,
                note.total,
                note.reason[:2000],
                issued_at,
            ),
        ).fetchone()
    return found is not None


# --------------------------------------------------------------------------- outbox


def insert_outbox_row(
    conn: psycopg.Connection[Any],
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
    Debezium's EventRouter routes it to ``topic`` (aggregatetype), key = customer id
    (aggregateid), CloudEvents headers from the ce_* columns."""
    conn.execute(
        """
        INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, ce_time, document_id)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
        """,
        (
            event_id,
            topic,
            customer_id,
            event_type,
            payload,
            source,
            time.isoformat().replace("+00:00", "Z"),
            document_id,
        ),
    )


def insert_outbox(
    conn: psycopg.Connection[Any],
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


@dataclass(frozen=True)
class OutboxEvent:
    """The newest outbox row of a document: its key, type and payload (JSON)."""

    customer_id: str
    event_type: str
    payload: Any


def latest_outbox_event(conn: psycopg.Connection[Any], document_id: str) -> OutboxEvent | None:
    """The newest outbox row of ``document_id`` still kept (outbox rows are pruned)."""
    with conn.cursor(row_factory=class_row(OutboxEvent)) as cur:
        return cur.execute(
            "SELECT aggregateid AS customer_id, type AS event_type, payload FROM outbox "
            "WHERE document_id = %s ORDER BY created_at DESC LIMIT 1",
            (document_id,),
        ).fetchone()
