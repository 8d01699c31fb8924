"""The database's privilege roles and its table → role → privileges matrix: the one place
that says who may read and write what (docs/design.md "Database roles", docs/roles.md).

**Roles.** Each process kind connects as its own login (``streams.settings.PostgresSettings``:
``worker``, ``email``, ``close``, ``replay``, ``operator``, ``admin``, ``replication``),
and each login is a member of exactly one **privilege role** below (``NOLOGIN``, fixed
names), which holds the grants. So the migrations never depend on deployment settings
(a deployment names its logins as it likes, and can rotate a login by adding a second
member), and the sandbox databases of the tests get the same grants by running the same
migrations. The **owner** (``postgres.owner``) owns the database, every table and every
function; migrations run as it and no process does. No privilege role owns anything or
has ``CREATEDB``; they are created by provisioning (:mod:`streams.adapters.postgres.provision`).

**Matrix.** :data:`TABLES` lists every table of the schema, with for each privilege
role the columns it may ``SELECT``, ``INSERT`` and ``UPDATE`` (:data:`ALL` or a tuple of
column names) and whether it may ``DELETE``. A role not listed for a table has no
privilege on it; ``PUBLIC`` has none on anything. :data:`SEQUENCES` and
:data:`FUNCTIONS` do the same for sequences (``USAGE``) and functions (``EXECUTE``).
Rules the matrix keeps, checked by ``tests/integration/test_roles.py``:

- no runtime role may ``DELETE`` from ``invoices``, ``invoice_lines``,
  ``credit_notes`` or ``outbox``, nor ``UPDATE`` any column of them; the replay's
  ``issued`` → ``superseded`` goes through ``supersede_invoice(uuid)``, a ``SECURITY
  DEFINER`` function, and the successor revision is checked at commit (migration 0018);
  the triggers of migration 0006 refuse the rest even to the owner;
- a void (``issued`` → ``voided``) goes through ``void_invoice(…)``, a ``SECURITY DEFINER``
  function of the owner that ``invoicing_admin`` alone may call (migration 0020);
- a partial credit note goes through ``credit_invoice_lines(…)``, likewise the admin's
  alone (migration 0021): no runtime role may write ``credit_note_lines``;
- ``reconcile --republish`` copies a document's kept outbox row through
  ``republish_document(uuid)``, likewise the admin's alone (migration 0022): the admin
  role may not insert outbox rows of its own making;
- outbox retention deletes through ``prune_outbox(interval)``, a ``SECURITY DEFINER``
  function of the owner that deletes only rows older than a floor of 7 days;
- the read-only ``invoicing_operator`` sees no customer contact data (names, email
  addresses, the outbox payload that carries them).

**Adding a table** (what a migration that creates one must do): add its entry here,
every role that touches it with the columns it needs and nothing more, reviewed like
code; the migration ends with ``grants.apply(op.get_bind(), tables=("new_table",))``
(or leaves it to ``invoicing db migrate``, which converges every table on this matrix
after upgrading: :func:`streams.adapters.postgres.migrate.upgrade`). The test
``test_every_table_has_an_entry`` fails while a table of the migrated schema has none,
and ``test_database_privileges_equal_the_matrix`` while the database disagrees with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from streams.settings import RoleName

__all__ = [
    "ALL",
    "FUNCTIONS",
    "OUTBOX_PRUNE_FLOOR_DAYS",
    "PRIVILEGE_ROLES",
    "SEQUENCES",
    "TABLES",
    "PrivilegeRole",
    "Privileges",
    "apply",
    "existing",
    "login_role",
    "markdown_matrix",
    "matrix_rows",
    "statements",
]

#: Every column of the table (a table-level privilege).
ALL: Final = "ALL"

Columns = tuple[str, ...] | Literal["ALL"]

#: Youngest outbox rows ``prune_outbox`` deletes, in days (migration 0006): Debezium has
#: long relayed them, and ``invoicing reconcile`` can rebuild an invoice's event from its
#: rows afterwards. A caller asking for less is refused, not clamped.
OUTBOX_PRUNE_FLOOR_DAYS: Final = 7


@dataclass(frozen=True)
class PrivilegeRole:
    """A ``NOLOGIN`` role that holds grants, and the login (settings field) that is its member."""

    #: Short name used in the matrix (``worker``, ``operator``, ...).
    key: str
    #: The PostgreSQL role name.
    name: str
    #: The :class:`streams.settings.PostgresSettings` login that is a member of it.
    login: RoleName
    #: Which processes connect through it.
    runs: str


PRIVILEGE_ROLES: Final[tuple[PrivilegeRole, ...]] = (
    PrivilegeRole("worker", "invoicing_worker", "worker", "`invoicing worker invoicing`"),
    PrivilegeRole("email", "invoicing_email", "email", "`invoicing worker email`"),
    PrivilegeRole("close", "invoicing_close", "close", "`invoicing close-period`"),
    PrivilegeRole("replay", "invoicing_replay", "replay", "`invoicing replay` (dry run, apply)"),
    PrivilegeRole(
        "operator",
        "invoicing_operator",
        "operator",
        "`status`, `holds list`, `fences list`, `reconcile` (report), the demo's checks",
    ),
    PrivilegeRole(
        "admin",
        "invoicing_admin",
        "admin",
        "`holds release`, `fences reset`, `outbox prune`, `reconcile --republish`",
    ),
    PrivilegeRole(
        "portal", "invoicing_portal", "portal", "`invoicing worker portal` (hosted page)"
    ),
    # migration 0018: publishing the price book is no longer the admin's
    PrivilegeRole("pricing", "invoicing_pricing", "pricing", "`invoicing plans publish`"),
    PrivilegeRole("cdc", "invoicing_cdc", "replication", "Debezium (Kafka Connect)"),
)

_BY_KEY: Final = {role.key: role for role in PRIVILEGE_ROLES}


@dataclass(frozen=True)
class Privileges:
    """What one privilege role may do on one table: columns per privilege, and DELETE."""

    select: Columns = ()
    insert: Columns = ()
    update: Columns = ()
    delete: bool = False

    def items(self) -> list[tuple[str, Columns]]:
        """(privilege, columns) for each privilege granted, in SQL order."""
        granted: list[tuple[str, Columns]] = [
            (name, cols)
            for name, cols in (
                ("SELECT", self.select),
                ("INSERT", self.insert),
                ("UPDATE", self.update),
            )
            if cols
        ]
        if self.delete:
            granted.append(("DELETE", ALL))
        return granted


# Columns holding a customer's contact data, which the read-only operator does not see.
_CUSTOMERS_NO_CONTACT = (
    "customer_id",
    "currency",
    "billing_account_id",
    "event_id",
    "source_topic",
    "source_partition",
    "source_offset",
    "updated_at",
    "event_time",
)
_INVOICES_NO_CONTACT = (
    "invoice_id",
    "invoice_number",
    "customer_id",
    "billing_period",
    "revision",
    "status",
    "currency",
    "line_count",
    "subtotal",
    "tax_total",
    "total",
    "taxes",
    "close_event_id",
    "source_topic",
    "source_partition",
    "first_offset",
    "last_offset",
    "close_offset",
    "fence_group",
    "fence_generation",
    "fence_member",
    "lease_fencing_token",
    "supersedes_invoice_id",
    "issued_at",
    "rating",
)
_DELIVERIES_NO_CONTACT = (
    "event_id",
    "document_key",
    "document_type",
    "document_id",
    "customer_id",
    "message_id",
    "status",
    "skip_reason",
    "attempts",
    "source_topic",
    "source_partition",
    "source_offset",
    "claimed_at",
    "sent_at",
)
_OUTBOX_NO_PAYLOAD = (
    "id",
    "aggregatetype",
    "aggregateid",
    "type",
    "ce_specversion",
    "ce_source",
    "ce_time",
    "content_type",
    "document_id",
    "created_at",
)
# What a document (PDF, hosted page) is built from (streams/core/billing/store/documents.py):
# the customer's name is on the document, the email address is not.
_INVOICES_DOCUMENT = (
    "invoice_id",
    "invoice_number",
    "revision",
    "status",
    "customer_id",
    "customer_name",
    "billing_period",
    "currency",
    "issued_at",
    "subtotal",
    "tax_total",
    "total",
    "taxes",
    "line_count",
    "rating",
    "supersedes_invoice_id",
)
_LINES_DOCUMENT = (
    "invoice_id",
    "line_no",
    "event_id",
    "amount",
    "quantity",
    "unit",
    "description",
    "sku_id",
)
_CHARGES_DOCUMENT = ("invoice_id", "line_no", "detail")
_CREDIT_NOTES_DOCUMENT = (
    "credit_note_id",
    "credit_note_number",
    "invoice_id",
    "customer_id",
    "billing_period",
    "currency",
    "subtotal",
    "tax_total",
    "total",
    "reason",
    "issued_at",
)
_LEASE_FENCE_UPDATE = ("fencing_token", "holder", "updated_at")
_COUNTER = Privileges(select=ALL, insert=ALL, update=("last_value",))

#: table → privilege role key → privileges. Every table of the schema has an entry (an
#: empty mapping: the owner only). Migrations 0001-0004 and 0006.
TABLES: Final[Mapping[str, Mapping[str, Privileges]]] = {
    # Alembic's version table: the owner only.
    "alembic_version": {},
    "customers": {
        "worker": Privileges(
            select=ALL,
            insert=ALL,
            update=(
                "name",
                "email",
                "currency",
                "billing_account_id",
                "event_id",
                "source_topic",
                "source_partition",
                "source_offset",
                "updated_at",
                # migration 0016: the upserts are ordered by their event time
                "event_time",
                # migration 0024: the customer's grace period (docs/invoices.md)
                "invoice_grace_hours",
            ),
        ),
        "replay": Privileges(select=("customer_id", "name", "email", "currency")),
        "operator": Privileges(select=_CUSTOMERS_NO_CONTACT),
    },
    "usage_lines": {
        "worker": Privileges(select=ALL, insert=ALL),
        # A replay stores invoiced usage the worker's write lost (replay.apply).
        "replay": Privileges(select=ALL, insert=ALL),
        "close": Privileges(select=("customer_id", "billing_period", "source_topic")),
        "operator": Privileges(select=ALL),
    },
    # The worker's COPY target for a batch's usage (migration 0010): rows live only
    # inside the transaction that copies them in and moves them to usage_lines.
    "usage_staging": {
        "worker": Privileges(select=ALL, insert=ALL, delete=True),
    },
    "period_closes": {
        "worker": Privileges(select=ALL, insert=ALL),
        "replay": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
        "admin": Privileges(select=ALL),
    },
    "document_counters": {
        "worker": _COUNTER,
        "replay": _COUNTER,
        "operator": Privileges(select=ALL),
    },
    "invoices": {
        "worker": Privileges(select=ALL, insert=ALL),
        # The only update an issued invoice sees, issued -> superseded, goes through
        # supersede_invoice(uuid) (FUNCTIONS, migration 0018): no UPDATE grant, so the
        # replay can neither void nor supersede without a successor.
        "replay": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=_INVOICES_NO_CONTACT),
        # reconcile --republish rebuilds an invoice's event from its rows.
        "admin": Privileges(select=ALL),
        # the PDF of every email, and the hosted page, read the stored document
        # the email of a void goes to the address the invoice was issued to
        "email": Privileges(select=(*_INVOICES_DOCUMENT, "email")),
        "portal": Privileges(select=_INVOICES_DOCUMENT),
    },
    # Drafts in their grace period (migration 0024, docs/invoices.md "Drafts and
    # finalisation"): the worker writes them; finalisation only moves status to finalized.
    "invoice_drafts": {
        "worker": Privileges(
            select=ALL,
            insert=ALL,
            update=(
                "status",
                "currency",
                "line_count",
                "subtotal",
                "tax_total",
                "total",
                "rerated",
                "watermark_offset",
                "fence_generation",
                "fence_member",
                "updated_at",
                "finalized_at",
                "invoice_number",
            ),
        ),
        # a replay leaves a customer with an open draft to the worker (replay.apply)
        "replay": Privileges(select=("customer_id", "billing_period", "source_topic", "status")),
        "operator": Privileges(select=ALL),
        "admin": Privileges(select=ALL),
    },
    "invoice_voids": {
        # written only through void_invoice() (FUNCTIONS), which runs as the owner
        "operator": Privileges(select=ALL),
        "admin": Privileges(select=ALL),
    },
    "invoice_lines": {
        "worker": Privileges(select=ALL, insert=ALL),
        "replay": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=ALL),
        "admin": Privileges(select=ALL),
        "email": Privileges(select=_LINES_DOCUMENT),
        "portal": Privileges(select=_LINES_DOCUMENT),
    },
    "invoice_charges": {
        # The rated charge lines of an invoice revision (migration 0005), written with it.
        "worker": Privileges(select=ALL, insert=ALL),
        "replay": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=ALL),
        # reconcile --republish rebuilds a rated invoice's event with its charge lines.
        "admin": Privileges(select=ALL),
        "email": Privileges(select=_CHARGES_DOCUMENT),
        "portal": Privileges(select=_CHARGES_DOCUMENT),
    },
    "metered_usage": {
        "worker": Privileges(select=ALL, insert=ALL),
        "replay": Privileges(select=ALL),
        # close-period finds the customers with metered usage in the period.
        "close": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
    },
    "subscription_events": {
        "worker": Privileges(select=ALL, insert=ALL),
        "replay": Privileges(select=ALL),
        # close-period closes subscribed customers without usage (their fixed fees).
        "close": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
    },
    # The published price book: appended by `plans publish` (pricing, migration 0018) only,
    # never naming published_by / published_at, which a trigger sets (session_user, now());
    # a trigger of migration 0005 refuses UPDATE and DELETE to everyone.
    "billable_metrics": {
        "worker": Privileges(select=ALL),
        "replay": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
        "pricing": Privileges(select=ALL, insert=("metric_code", "definition", "content_sha256")),
    },
    "plan_versions": {
        "worker": Privileges(select=ALL),
        "replay": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
        "pricing": Privileges(
            select=ALL,
            insert=(
                "plan_code",
                "plan_version",
                "plan_name",
                "effective_from",
                "currency",
                "definition",
                "content_sha256",
            ),
        ),
    },
    "credit_notes": {
        "replay": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=ALL),
        "admin": Privileges(select=ALL),
        "email": Privileges(select=_CREDIT_NOTES_DOCUMENT),
        "portal": Privileges(select=_CREDIT_NOTES_DOCUMENT),
    },
    "credit_note_lines": {
        # written only through credit_invoice_lines() (FUNCTIONS), which runs as the owner;
        # the replay reads what partial notes credited before its full note
        "replay": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
        "admin": Privileges(select=ALL),
        "email": Privileges(select=ALL),
        "portal": Privileges(select=ALL),
    },
    "outbox": {
        # Writers append; they never read the outbox back.
        "worker": Privileges(insert=ALL),
        "replay": Privileges(insert=ALL),
        # reconcile reads what was written; --republish copies a kept row into a new one
        # through republish_document() and retention deletes through prune_outbox()
        # (FUNCTIONS): no INSERT or DELETE grant (migration 0022).
        "admin": Privileges(select=ALL),
        "operator": Privileges(select=_OUTBOX_NO_PAYLOAD),
        "cdc": Privileges(select=ALL),
    },
    "partition_fences": {
        "worker": Privileges(
            select=ALL, insert=ALL, update=("generation", "member_id", "updated_at")
        ),
        "operator": Privileges(select=ALL),
        # fences reset (after a group was deleted; every member stopped first).
        "admin": Privileges(select=ALL, delete=True),
    },
    "lease_fences": {
        "close": Privileges(select=ALL, insert=ALL, update=_LEASE_FENCE_UPDATE),
        "replay": Privileges(select=ALL, insert=ALL, update=_LEASE_FENCE_UPDATE),
        "operator": Privileges(select=ALL),
    },
    "invoice_holds": {
        "worker": Privileges(select=ALL, insert=ALL),
        # close-period closes the customers held for a record of the period (migration 0026).
        "close": Privileges(
            select=("customer_id", "billing_period", "source_topic", "released_at")
        ),
        "replay": Privileges(select=ALL),
        "operator": Privileges(select=ALL),
        # holds release marks a hold released, nothing else.
        "admin": Privileges(select=ALL, update=("released_at", "released_by", "release_note")),
    },
    "email_deliveries": {
        "email": Privileges(
            select=ALL, insert=ALL, update=("status", "skip_reason", "attempts", "sent_at")
        ),
        "operator": Privileges(select=_DELIVERIES_NO_CONTACT),
        "admin": Privileges(select=_DELIVERIES_NO_CONTACT),
    },
    "close_requests": {
        "close": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=ALL),
    },
    "replay_runs": {
        "replay": Privileges(
            select=ALL,
            insert=ALL,
            update=(
                "status",
                "attempts",
                "holder",
                "lease_fencing_token",
                "events_read",
                "summary",
                "last_error",
                "updated_at",
                "finished_at",
            ),
        ),
        "operator": Privileges(select=ALL),
    },
    "replay_results": {
        "replay": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=ALL),
    },
    # What a consumer dead-lettered (migration 0007): read on every delivery so a bad
    # record is dead-lettered once; rows are facts, never updated or deleted.
    "dead_letters": {
        "worker": Privileges(select=ALL, insert=ALL),
        "email": Privileges(select=ALL, insert=ALL),
        "operator": Privileges(select=ALL),
    },
}

#: sequence → privilege role keys granted ``USAGE`` (``nextval`` for a serial column).
SEQUENCES: Final[Mapping[str, tuple[str, ...]]] = {
    "invoice_holds_hold_id_seq": ("worker",),
}

#: function (with its argument types) → privilege role keys granted ``EXECUTE``. Trigger
#: functions need none (a trigger runs its function without that check); ``PUBLIC``'s
#: default ``EXECUTE`` is revoked from every function here.
FUNCTIONS: Final[Mapping[str, tuple[str, ...]]] = {
    "prune_outbox(interval)": ("admin",),
    # an operator voids an issued invoice (migration 0020; streams/apps/ops/void.py)
    "void_invoice(uuid, text, uuid, text, text)": ("admin",),
    # an operator credits part of an issued invoice (migration 0021; streams/apps/ops/credit.py)
    "credit_invoice_lines(uuid, uuid, jsonb, text, integer, uuid, text, text)": ("admin",),
    # reconcile --republish copies a document's kept outbox row (migration 0022;
    # streams/apps/ops/reconcile.py)
    "republish_document(uuid)": ("admin",),
    "round_half_even(numeric, integer)": (),
    "issued_invoice_guard()": (),
    "immutable_row_guard()": (),
    "invoice_line_guard()": (),
    "price_book_entry_immutable()": (),
    # migration 0018
    "price_book_published_stamp()": (),
    "supersede_invoice(uuid)": ("replay",),
    "lock_issued_invoice(text, text)": ("replay",),
    "superseded_invoice_has_successor()": (),
    # migration 0024
    "invoice_draft_guard()": (),
    # migration 0025: the issuance transaction numbers its invoice last, before the commit
    "invoice_numbered_at_commit()": (),
    "number_invoice(uuid, text)": ("worker", "replay"),
}


def login_role(key: str) -> RoleName:
    """The settings login (``PostgresSettings`` field) that is a member of privilege role ``key``."""
    return _BY_KEY[key].login


_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")


def _q(name: str) -> str:
    """A fixed identifier of this module, checked (the matrix is code, never input)."""
    if not _IDENT.match(name):
        raise ValueError(f"not a plain identifier: {name!r}")
    return name


def _cols(columns: Columns) -> str:
    return "" if columns == ALL else " (" + ", ".join(_q(c) for c in columns) + ")"


def _function(signature: str) -> str:
    name, _, args = signature.partition("(")
    return f"{_q(name)}({args}"


def statements(
    tables: Iterable[str] | None = None,
    *,
    sequences: Iterable[str] | None = None,
    functions: Iterable[str] | None = None,
    columns: set[str] | None = None,
) -> list[str]:
    """The SQL that makes the database's privileges equal the matrix, run as the owner:
    the database and schema grants, then per table ``REVOKE ALL`` from ``PUBLIC`` and
    every privilege role followed by its grants, then the same for sequences and
    functions. Idempotent (running it again changes nothing); run in one transaction,
    no session ever sees a table without its grants.

    Args:
        tables / sequences / functions: restrict each part to these names (default:
            every entry of :data:`TABLES`, :data:`SEQUENCES`, :data:`FUNCTIONS`).
        columns: ``table.column`` names that exist: column grants name only these (a
            migration in the middle of the chain: a later one adds the others). Default:
            every column of the matrix.

    Raises:
        KeyError: a name without an entry in the matrix.
    """
    roles = ", ".join(role.name for role in PRIVILEGE_ROLES)
    out = [
        # Nobody connects or creates temporary tables unless granted here.
        # (No "%" anywhere: these strings also pass through SQLAlchemy and psycopg unparsed.)
        "DO $$ BEGIN "
        "EXECUTE 'REVOKE ALL ON DATABASE ' || quote_ident(current_database()) || ' FROM PUBLIC'; "
        "EXECUTE 'GRANT CONNECT ON DATABASE ' || quote_ident(current_database()) "
        f"|| ' TO {roles}'; END $$",
        "REVOKE ALL ON SCHEMA public FROM PUBLIC",
        f"GRANT USAGE ON SCHEMA public TO {roles}",
    ]
    for table in TABLES if tables is None else tables:
        entry = TABLES[table]
        out.append(f"REVOKE ALL ON TABLE {_q(table)} FROM PUBLIC, {roles}")
        for key, privileges in entry.items():
            role = _BY_KEY[key].name
            for privilege, cols in privileges.items():
                if columns is not None and cols != ALL:
                    cols = tuple(c for c in cols if f"{table}.{c}" in columns)
                    if not cols:
                        continue
                out.append(f"GRANT {privilege}{_cols(cols)} ON TABLE {_q(table)} TO {role}")
    for sequence in SEQUENCES if sequences is None else sequences:
        out.append(f"REVOKE ALL ON SEQUENCE {_q(sequence)} FROM PUBLIC, {roles}")
        out.extend(
            f"GRANT USAGE ON SEQUENCE {_q(sequence)} TO {_BY_KEY[k].name}"
            for k in SEQUENCES[sequence]
        )
    for function in FUNCTIONS if functions is None else functions:
        out.append(f"REVOKE ALL ON FUNCTION {_function(function)} FROM PUBLIC, {roles}")
        out.extend(
            f"GRANT EXECUTE ON FUNCTION {_function(function)} TO {_BY_KEY[k].name}"
            for k in FUNCTIONS[function]
        )
    return out


#: The objects of the schema the matrix covers: (tables, sequences, functions) of ``public``.
EXISTING_SQL: Final = {
    "tables": "SELECT tablename FROM pg_tables WHERE schemaname = 'public'",
    "sequences": "SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'",
    "functions": (
        "SELECT p.proname || '(' || oidvectortypes(p.proargtypes) || ')' "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
    ),
    "columns": (
        "SELECT table_name || '.' || column_name FROM information_schema.columns "
        "WHERE table_schema = 'public'"
    ),
}


def _run(connection: Any) -> Any:
    return getattr(connection, "exec_driver_sql", None) or connection.execute


def existing(connection: Any) -> dict[str, set[str]]:
    """The tables, sequences, functions and columns (``table.column``) of schema ``public``
    (names as in the matrix)."""
    run = _run(connection)
    return {kind: {row[0] for row in run(query)} for kind, query in EXISTING_SQL.items()}


def apply(connection: Any, *, only_existing: bool = False) -> None:
    """Run :func:`statements` on ``connection`` in the caller's transaction: a psycopg
    connection, or the SQLAlchemy connection of a migration (``op.get_bind()``).

    Args:
        only_existing: grant only on the matrix's objects (and columns) that exist (a
            migration in the middle of the chain: later migrations create the others). Otherwise every
            entry must exist, and a missing one fails (``UndefinedTable`` …).
    """
    if only_existing:
        found = existing(connection)
        chosen = statements(
            [t for t in TABLES if t in found["tables"]],
            sequences=[s for s in SEQUENCES if s in found["sequences"]],
            functions=[f for f in FUNCTIONS if f.replace(" ", "") in _compact(found)],
            columns=found["columns"],
        )
    else:
        chosen = statements()
    run = _run(connection)
    for statement in chosen:
        run(statement)


def _compact(found: dict[str, set[str]]) -> set[str]:
    return {f.replace(" ", "") for f in found["functions"]}


def matrix_rows() -> list[dict[str, str]]:
    """The matrix as rows (table, then one column per privilege role), for docs/roles.md
    and ``invoicing db roles``: ``S`` select, ``I`` insert, ``U`` update, ``D`` delete;
    a column list in parentheses after the letter when not every column."""

    def cell(p: Privileges | None) -> str:
        if p is None:
            return ""
        parts = []
        for privilege, columns in p.items():
            letter = privilege[0]
            parts.append(letter if columns == ALL else f"{letter}({', '.join(columns)})")
        return " ".join(parts)

    return [
        {"table": table, **{role.name: cell(entry.get(role.key)) for role in PRIVILEGE_ROLES}}
        for table, entry in TABLES.items()
    ]


def markdown_matrix() -> str:
    """The matrix as a markdown table (docs/roles.md between its ``matrix`` markers;
    ``invoicing db roles --markdown``), then the sequences and functions."""
    roles = [role.name for role in PRIVILEGE_ROLES]
    lines = [
        "| table | " + " | ".join(f"`{r}`" for r in roles) + " |",
        "|---|" + "---|" * len(roles),
    ]
    for row in matrix_rows():
        cells = [row[r].replace("(", " (") if row[r] else "-" for r in roles]
        lines.append(f"| `{row['table']}` | " + " | ".join(cells) + " |")
    lines.append("")
    for sequence, keys in SEQUENCES.items():
        who = ", ".join(f"`{_BY_KEY[k].name}`" for k in keys)
        lines.append(f"- sequence `{sequence}`: USAGE to {who}")
    for function, keys in FUNCTIONS.items():
        who = ", ".join(f"`{_BY_KEY[k].name}`" for k in keys) or "nobody (trigger function)"
        lines.append(f"- function `{function}`: EXECUTE to {who}")
    return "\n".join(lines) + "\n"
