"""Void an issued invoice revision (docs/invoices.md "Void").

:func:`void_invoice` calls ``void_invoice(…)`` of migration 0020, a ``SECURITY DEFINER``
function of the owner that only the admin role may execute. In one transaction it locks
the invoice row, refuses unless the revision is ``issued`` (the current one), records the
reason, who (``session_user``) and when (``now()``) in ``invoice_voids``, moves the status
``issued`` → ``voided`` and writes the ``invoice.voided`` outbox row (id
:func:`streams.core.billing.issuance.outbox_event_id` of the invoice, so a retried call
can never write a second event: the row, the void and the status are one transaction).
Debezium routes that row to ``billing.invoices.v1``; the email sender sends one email
saying the invoice was voided. A void is never undone: no status leaves ``voided``
(migration 0006's trigger), and a replay skips a period whose revisions are all voided
(docs/replay.md).

The invoice is named by its id (a UUID) or its number (``INV-2026-10-000042``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import errors
from psycopg.rows import class_row, scalar_row
from pydantic import ValidationError

from streams.core.billing.issuance import outbox_event_id
from streams.core.domain.events import InvoiceVoided
from streams.errors import InvoicingError

__all__ = [
    "SOURCE",
    "InvalidVoidReason",
    "InvoiceNotFound",
    "InvoiceNotVoidable",
    "VoidError",
    "Voided",
    "void_invoice",
]

#: CloudEvents ``source`` of the ``invoice.voided`` events the operators write.
SOURCE = "/ops/void"


class VoidError(InvoicingError):
    """A void was refused; nothing was written."""


class InvoiceNotFound(VoidError):
    """No invoice revision has that id or number."""


class InvoiceNotVoidable(VoidError):
    """The revision is not ``issued``: voided already, or superseded by a newer revision."""


class InvalidVoidReason(VoidError):
    """The reason is empty, longer than 2000 characters, or holds control characters."""


@dataclass(frozen=True)
class Voided:
    """A committed void: the revision, who voided it (the login) and when (UTC), and the
    id of its outbox row (the event's ``ce_id``)."""

    invoice_id: str
    invoice_number: str
    revision: int
    customer_id: str
    billing_period: str
    reason: str
    voided_by: str
    voided_at: datetime
    outbox_id: str


@dataclass(frozen=True)
class _Head:
    invoice_id: str
    invoice_number: str
    revision: int
    customer_id: str
    billing_period: str


def _check_reason(reason: str) -> None:
    """The event's own rule for ``reason`` (schemas/billing.invoices.v1/invoice.voided)."""
    if not reason.strip():
        raise InvalidVoidReason("a void needs a reason (--reason TEXT)")
    try:
        InvoiceVoided.model_validate(
            {
                "invoice_id": "x",
                "invoice_number": "x",
                "revision": 1,
                "customer_id": "x",
                "billing_period": "2026-01",
                "reason": reason,
                "voided_at": "2026-01-01T00:00:00Z",
            }
        )
    except ValidationError as exc:
        raise InvalidVoidReason(
            f"invalid reason: {exc.errors()[0]['msg']} (at most 2000 characters, "
            "no control or bidi characters)"
        ) from None


def _resolve(conn: psycopg.Connection[Any], invoice: str) -> str:
    """The invoice id of ``invoice`` (an id or a number)."""
    try:
        return str(uuid.UUID(invoice))
    except ValueError:
        pass
    with conn.cursor(row_factory=scalar_row) as cur:
        found = cur.execute(
            "SELECT invoice_id::text FROM invoices WHERE invoice_number = %s", (invoice,)
        ).fetchone()
    if found is None:
        raise InvoiceNotFound(f"no invoice has the id or number {invoice!r}")
    return str(found)


def void_invoice(
    conn: psycopg.Connection[Any], invoice: str, reason: str, *, topic: str, source: str = SOURCE
) -> Voided:
    """Void the issued invoice revision ``invoice`` (id or number) for ``reason``, in one
    transaction on ``conn`` (a connection of the admin role), committed on return.

    Args:
        topic: the outbox row's ``aggregatetype``: the prefixed invoices topic.
        source: CloudEvents ``source`` of the event.

    Raises:
        InvalidVoidReason: the reason breaks the event's rule (checked before any write).
        InvoiceNotFound: no such invoice.
        InvoiceNotVoidable: the revision is voided already or superseded.
        psycopg.errors.InsufficientPrivilege: the role may not void (only the admin may).
        psycopg.Error: the database failed.
    """
    _check_reason(reason)
    with conn.transaction():
        invoice_id = _resolve(conn, invoice)
        outbox_id = outbox_event_id(InvoiceVoided.event_type, invoice_id)
        try:
            with conn.transaction(), conn.cursor() as cur:
                row = cur.execute(
                    "SELECT voided_at, voided_by FROM void_invoice(%s, %s, %s, %s, %s)",
                    (invoice_id, reason, outbox_id, topic, source),
                ).fetchone()
        except errors.NoDataFound as exc:
            raise InvoiceNotFound(f"no invoice has the id {invoice_id}") from exc
        except errors.ObjectNotInPrerequisiteState as exc:
            raise InvoiceNotVoidable(exc.diag.message_primary or str(exc)) from exc
        except errors.InvalidParameterValue as exc:
            raise InvalidVoidReason(exc.diag.message_primary or str(exc)) from exc
        assert row is not None  # the function returns one row or raises
        voided_at, voided_by = row
        with conn.cursor(row_factory=class_row(_Head)) as heads:
            head = heads.execute(
                "SELECT invoice_id::text, invoice_number, revision, customer_id, billing_period "
                "FROM invoices WHERE invoice_id = %s",
                (invoice_id,),
            ).fetchone()
        assert head is not None  # locked and voided in this transaction
    return Voided(
        head.invoice_id,
        head.invoice_number,
        head.revision,
        head.customer_id,
        head.billing_period,
        reason,
        str(voided_by),
        voided_at,
        outbox_id,
    )
