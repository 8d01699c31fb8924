"""Where the PDF and the hosted page read a stored document from: the port
:class:`DocumentSource`, on PostgreSQL (:class:`PostgresDocuments`) and in memory
(:class:`InMemoryDocuments`, the twin; one contract suite runs on both,
``tests/contracts/documents.py``).

Errors: a database failure propagates as the driver's error (``psycopg.OperationalError``
or ``psycopg_pool.PoolTimeout`` for a transient one), which the callers classify with the
kernel's failure table (:mod:`streams.core.billing.failures`).
"""

from __future__ import annotations

from typing import Any, Protocol

from psycopg_pool import ConnectionPool

from streams.core.billing.store import documents as store
from streams.core.billing.store.documents import DocumentState, Supersession
from streams.core.domain.documents import Document, DocumentKind

__all__ = ["DocumentSource", "InMemoryDocuments", "PostgresDocuments"]


class DocumentSource(Protocol):
    """Issued documents, read whole (every line)."""

    def load(self, kind: DocumentKind, document_id: str) -> Document | None:
        """The document ``kind``/``document_id`` (a lowercase UUID), None when not stored."""
        ...

    def state(self, kind: DocumentKind, document_id: str) -> DocumentState | None:
        """Its status and the documents that supersede it, None when not stored."""
        ...

    def recipient(self, invoice_id: str) -> str | None:
        """The email address invoice revision ``invoice_id`` was issued to, None when not
        stored (the email of its void goes there; a role that may not read the address,
        the portal's, gets a permission error)."""
        ...


class PostgresDocuments:
    """:class:`DocumentSource` on a pool (each call one read-only transaction)."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self._pool = pool

    def load(self, kind: DocumentKind, document_id: str) -> Document | None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            return store.load_document(conn, kind, document_id)

    def state(self, kind: DocumentKind, document_id: str) -> DocumentState | None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            return store.document_state(conn, kind, document_id)

    def recipient(self, invoice_id: str) -> str | None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            return store.invoice_recipient(conn, invoice_id)


class InMemoryDocuments:
    """The twin: documents put by the test (:meth:`put`), ``issued`` until
    :meth:`set_status`; what supersedes an invoice revision is derived as on PostgreSQL
    (credit notes of it, revisions that name it in ``supersedes_invoice_id``)."""

    def __init__(self) -> None:
        self._docs: dict[tuple[str, str], Document] = {}
        self._status: dict[str, str] = {}
        self._recipients: dict[str, str] = {}

    def put(self, doc: Document, *, recipient: str = "customer@example.invalid") -> None:
        """Store ``doc`` (an issued document: its content never changes afterwards),
        issued to ``recipient``."""
        self._docs[(doc.kind, doc.document_id.lower())] = doc
        if doc.kind == "invoice":
            self._recipients[doc.document_id.lower()] = recipient

    def recipient(self, invoice_id: str) -> str | None:
        return self._recipients.get(invoice_id.lower())

    def set_status(self, invoice_id: str, status: str) -> None:
        """An invoice revision's status moves (``superseded``, ``voided``)."""
        self._status[invoice_id.lower()] = status

    def load(self, kind: DocumentKind, document_id: str) -> Document | None:
        return self._docs.get((kind, document_id.lower()))

    def state(self, kind: DocumentKind, document_id: str) -> DocumentState | None:
        key = document_id.lower()
        if (kind, key) not in self._docs:
            return None
        if kind == "credit_note":
            return DocumentState("issued")
        later = [
            Supersession(d.kind, d.document_id, d.number, d.issued_at)
            for d in self._docs.values()
            if (d.kind == "credit_note" and d.credited_invoice_id == key)
            or (d.kind == "invoice" and d.supersedes_invoice_id == key)
        ]
        later.sort(key=lambda s: (s.issued_at, s.number))
        return DocumentState(self._status.get(key, "issued"), tuple(later))
