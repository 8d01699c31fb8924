"""Least privilege on the real PostgreSQL (streams/adapters/postgres/grants.py, migration 0006).

A fresh database of this module, created by the provisioner and migrated as the owner:

- every table, sequence and function of the migrated schema has an entry in the matrix,
  and the database's privileges are exactly the matrix's (nothing more, nothing less);
- no runtime role owns anything or has CREATEDB / CREATEROLE / SUPERUSER / BYPASSRLS;
- connected as each role, each forbidden statement fails with ``InsufficientPrivilege``;
- the triggers refuse every change of an issued invoice but its status transition, even
  to the owner (every privilege) and to the replay (UPDATE on ``status``);
- outbox retention works through ``prune_outbox()`` alone, never below its floor.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors, sql
from pydantic import SecretStr

from streams.adapters.postgres import grants
from streams.apps.ops.reconcile import prune_outbox
from streams.settings import DatabaseRole, PostgresSettings, RoleName, Settings
from tests.support.roles import migrated_database, superuser

RUNTIME: tuple[RoleName, ...] = (
    "worker",
    "email",
    "close",
    "replay",
    "operator",
    "admin",
    "portal",
    "pricing",
    "replication",
)


@pytest.fixture(scope="module")
def db(settings: Settings) -> Iterator[PostgresSettings]:
    with migrated_database(settings.postgres, f"roles_{uuid.uuid4().hex[:10]}") as pg:
        yield pg


def connect(pg: PostgresSettings, role: RoleName) -> psycopg.Connection[Any]:
    return psycopg.connect(pg.dsn(role), autocommit=True)


def _one_invoice(pg: PostgresSettings, *, lines: int = 1) -> str:
    """Insert an issued invoice with ``lines`` lines as the owner; returns its id."""
    invoice_id = str(uuid.uuid4())
    number = f"INV-T-{invoice_id[:8]}"
    conn = psycopg.connect(pg.dsn("owner"))
    try:
        conn.execute(
            """
            INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period, revision,
                status, customer_name, email, currency, line_count, subtotal, tax_total, total,
                taxes, close_event_id, source_topic, source_partition, close_offset)
            VALUES (%s, %s, %s, '2026-01', 1, 'issued', 'Name', 'n@customers.invalid', 'USD',
                    %s, 10, 1, 11, '[]', 'close', 'events', 0, 9)
            """,
            (
                invoice_id,
                number,
                f"c-{invoice_id[:8]}",
                lines,
            ),
        )
        for n in range(1, lines + 1):
            conn.execute(
                """
                INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, tax_code,
                    tax_rate, tax, source_topic, source_partition, source_offset)
                VALUES (%s, %s, %s, 10, 'std', 0.1, 1, 'events', 0, %s)
                """,
                (invoice_id, n, f"e-{n}", n),
            )
        conn.commit()
    finally:
        conn.close()
    return invoice_id


# --------------------------------------------------------------------------- the matrix


def test_every_table_has_an_entry(db: PostgresSettings) -> None:
    with connect(db, "owner") as conn:
        found = grants.existing(conn)
    assert found["tables"] - set(grants.TABLES) == set(), "tables without a grants entry"
    assert set(grants.TABLES) - found["tables"] == set(), "grants entries without a table"
    assert found["sequences"] - set(grants.SEQUENCES) == set(), "sequences without an entry"
    assert {f.replace(" ", "") for f in found["functions"]} == {
        f.replace(" ", "") for f in grants.FUNCTIONS
    }


def _expected() -> set[tuple[str, str, str, str]]:
    """(object, column or '', grantee, privilege) the matrix grants."""
    names = {role.key: role.name for role in grants.PRIVILEGE_ROLES}
    out: set[tuple[str, str, str, str]] = set()
    for table, entry in grants.TABLES.items():
        for key, privileges in entry.items():
            for privilege, columns in privileges.items():
                if columns == grants.ALL:
                    out.add((table, "", names[key], privilege))
                else:
                    out |= {(table, c, names[key], privilege) for c in columns}
    for sequence, keys in grants.SEQUENCES.items():
        out |= {(sequence, "", names[k], "USAGE") for k in keys}
    for function, keys in grants.FUNCTIONS.items():
        out |= {(function.split("(")[0], "", names[k], "EXECUTE") for k in keys}
    return out


ACTUAL = """
SELECT c.relname, '', coalesce(r.rolname, 'PUBLIC'), a.privilege_type
  FROM pg_class c CROSS JOIN aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
 WHERE c.relnamespace = 'public'::regnamespace AND a.grantee <> c.relowner
UNION ALL
SELECT c.relname, att.attname, coalesce(r.rolname, 'PUBLIC'), a.privilege_type
  FROM pg_attribute att JOIN pg_class c ON c.oid = att.attrelid
 CROSS JOIN aclexplode(att.attacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
 WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT p.proname, '', coalesce(r.rolname, 'PUBLIC'), a.privilege_type
  FROM pg_proc p CROSS JOIN aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
  LEFT JOIN pg_roles r ON r.oid = a.grantee
 WHERE p.pronamespace = 'public'::regnamespace AND a.grantee <> p.proowner
"""


def test_database_privileges_equal_the_matrix(db: PostgresSettings) -> None:
    with connect(db, "owner") as conn:
        actual = {tuple(row) for row in conn.execute(ACTUAL).fetchall()}
        database = conn.execute(
            "SELECT coalesce(r.rolname, 'PUBLIC'), a.privilege_type FROM pg_database d "
            "CROSS JOIN aclexplode(d.datacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE d.datname = current_database() AND a.grantee <> d.datdba"
        ).fetchall()
        schema = conn.execute(
            "SELECT coalesce(r.rolname, 'PUBLIC'), a.privilege_type FROM pg_namespace n "
            "CROSS JOIN aclexplode(n.nspacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee "
            "WHERE n.nspname = 'public' AND a.grantee <> n.nspowner"
        ).fetchall()
    assert actual - _expected() == set(), "privileges the matrix does not grant"
    assert _expected() - actual == set(), "privileges of the matrix missing"
    roles = {role.name for role in grants.PRIVILEGE_ROLES}
    assert set(database) == {(r, "CONNECT") for r in roles}  # PUBLIC: nothing
    assert set(schema) == {(r, "USAGE") for r in roles}


def test_no_runtime_role_owns_anything_or_may_create_databases(
    db: PostgresSettings, settings: Settings
) -> None:
    pg = settings.postgres
    runtime = [role.name for role in grants.PRIVILEGE_ROLES] + [pg.role(r).user for r in RUNTIME]
    with connect(db, "owner") as conn:
        attrs = conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) "
            "AND (rolcreatedb OR rolcreaterole OR rolsuper OR rolbypassrls)",
            (runtime,),
        ).fetchall()
        owners = conn.execute(
            """
            SELECT DISTINCT r.rolname FROM (
                SELECT relowner AS owner FROM pg_class WHERE relnamespace = 'public'::regnamespace
                UNION SELECT proowner FROM pg_proc WHERE pronamespace = 'public'::regnamespace
                UNION SELECT datdba FROM pg_database WHERE datname = current_database()
            ) o JOIN pg_roles r ON r.oid = o.owner
            """
        ).fetchall()
        members = dict(
            conn.execute(
                "SELECT m.rolname, array_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members a "
                "JOIN pg_roles m ON m.oid = a.member JOIN pg_roles g ON g.oid = a.roleid "
                "WHERE m.rolname = ANY(%s) GROUP BY m.rolname",
                (runtime,),
            ).fetchall()
        )
    assert attrs == []
    assert owners == [(pg.owner.user,)]
    # Each runtime login belongs to its privilege role and to nothing else.
    for role in grants.PRIVILEGE_ROLES:
        assert members[pg.role(role.login).user] == [role.name]


# --------------------------------------------------------------------------- forbidden statements

_NEW_OUTBOX = (
    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, ce_time, "
    "document_id) VALUES (gen_random_uuid(), 't.billing.invoices.v1', 'c', 'x', '{}', '/t', 't', "
    "gen_random_uuid())"
)
_NEW_INVOICE = (
    "INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period, revision, "
    "status, customer_name, email, currency, line_count, subtotal, tax_total, total, taxes, "
    "close_event_id, source_topic, source_partition, close_offset) VALUES (gen_random_uuid(), "
    "'INV-X', 'c', '2026-01', 1, 'issued', 'n', 'e', 'USD', 0, 0, 0, 0, '[]', 'x', 't', 0, 0)"
)

#: Statements no runtime role may run, whatever it is.
EVERYONE_REFUSED = (
    "DELETE FROM invoices",
    "DELETE FROM invoice_lines",
    "DELETE FROM credit_notes",
    "DELETE FROM outbox",
    "UPDATE invoices SET total = 0, subtotal = 0, tax_total = 0",
    "UPDATE invoices SET invoice_number = 'INV-FORGED'",
    "UPDATE invoice_lines SET amount = 0",
    "UPDATE credit_notes SET total = 0",
    "UPDATE outbox SET payload = '{}'",
    "TRUNCATE invoice_lines",
    "TRUNCATE outbox",
    "CREATE TABLE intruder (id int)",
    "CREATE TEMP TABLE intruder (id int)",
    "ALTER TABLE invoices DISABLE TRIGGER invoices_immutable",
    "SELECT 1 FROM alembic_version",
)

#: Statements refused to one role (its grants leave them out).
ROLE_REFUSED: tuple[tuple[RoleName, str], ...] = (
    ("worker", "UPDATE invoices SET status = 'superseded'"),
    ("worker", "SELECT payload FROM outbox"),
    ("worker", "SELECT * FROM email_deliveries"),
    ("worker", "UPDATE invoice_holds SET released_at = now()"),
    ("worker", "DELETE FROM partition_fences"),
    ("worker", "INSERT INTO credit_notes (credit_note_id) VALUES (gen_random_uuid())"),
    ("worker", "SELECT prune_outbox(interval '30 days')"),
    ("worker", "UPDATE customers SET customer_id = 'other'"),
    ("email", "SELECT * FROM invoices"),
    ("email", "SELECT * FROM customers"),
    ("email", _NEW_OUTBOX),
    ("email", "DELETE FROM email_deliveries"),
    ("email", "UPDATE email_deliveries SET recipient = 'x@y'"),
    ("close", _NEW_INVOICE),
    ("close", "SELECT amount FROM usage_lines"),
    ("close", "INSERT INTO usage_lines (event_id) VALUES ('x')"),
    ("close", "SELECT * FROM customers"),
    ("close", "DELETE FROM close_requests"),
    ("replay", "UPDATE invoices SET total = 0"),
    # migration 0018: superseding only through supersede_invoice(uuid); voiding not at all
    ("replay", "UPDATE invoices SET status = 'voided'"),
    ("replay", "UPDATE invoices SET status = 'superseded'"),
    ("replay", "UPDATE invoice_holds SET released_at = now()"),
    ("replay", "SELECT * FROM outbox"),
    ("replay", "DELETE FROM lease_fences"),
    ("replay", "SELECT * FROM email_deliveries"),
    ("operator", "SELECT email FROM customers"),
    ("operator", "SELECT name FROM customers"),
    ("operator", "SELECT email, customer_name FROM invoices"),
    ("operator", "SELECT recipient FROM email_deliveries"),
    ("operator", "SELECT payload FROM outbox"),
    ("operator", "UPDATE invoice_holds SET released_at = now()"),
    ("operator", "INSERT INTO invoice_holds (customer_id) VALUES ('c')"),
    ("operator", "DELETE FROM partition_fences"),
    ("operator", _NEW_OUTBOX),
    ("operator", "SELECT prune_outbox(interval '30 days')"),
    # migration 0022: republishing only through republish_document(uuid)
    ("admin", _NEW_OUTBOX),
    ("worker", "SELECT republish_document(gen_random_uuid())"),
    ("replay", "SELECT republish_document(gen_random_uuid())"),
    ("operator", "SELECT republish_document(gen_random_uuid())"),
    ("admin", "UPDATE invoice_holds SET reason = 'edited'"),
    ("admin", "UPDATE invoices SET status = 'voided'"),
    ("admin", "INSERT INTO invoice_holds (customer_id) VALUES ('c')"),
    ("admin", "SELECT recipient FROM email_deliveries"),
    ("admin", "DELETE FROM period_closes"),
    # migration 0018: publishing the price book is the pricing role's
    ("admin", "INSERT INTO billable_metrics (metric_code) VALUES ('m')"),
    ("admin", "INSERT INTO plan_versions (plan_code) VALUES ('p')"),
    ("pricing", "INSERT INTO billable_metrics (metric_code, published_by) VALUES ('m', 'x')"),
    ("pricing", "INSERT INTO plan_versions (plan_code, published_at) VALUES ('p', now())"),
    ("pricing", "UPDATE invoices SET status = 'voided'"),
    ("pricing", "SELECT * FROM customers"),
    ("pricing", "UPDATE invoice_holds SET released_at = now()"),
    ("replication", _NEW_OUTBOX),
    ("replication", "SELECT * FROM invoices"),
    ("replication", "SELECT * FROM customers"),
    # the hosted page reads a document's columns and nothing else
    ("portal", "SELECT email FROM invoices"),
    ("portal", "SELECT * FROM customers"),
    ("portal", "SELECT * FROM usage_lines"),
    ("portal", "SELECT id FROM outbox"),
    ("portal", "SELECT * FROM email_deliveries"),
    ("portal", "SELECT tax_rate FROM invoice_lines"),
)


@pytest.mark.parametrize("role", RUNTIME)
def test_no_runtime_role_may_alter_or_delete_issued_documents(
    db: PostgresSettings, role: RoleName
) -> None:
    with connect(db, role) as conn:
        for statement in EVERYONE_REFUSED:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(statement)


@pytest.mark.parametrize(("role", "statement"), ROLE_REFUSED)
def test_each_role_is_refused_what_its_grants_leave_out(
    db: PostgresSettings, role: RoleName, statement: str
) -> None:
    with connect(db, role) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement)


def test_the_admin_prunes_only_through_the_function_and_never_below_the_floor(
    db: PostgresSettings,
) -> None:
    old, young = str(uuid.uuid4()), str(uuid.uuid4())
    with connect(db, "owner") as conn:
        for row_id, age in ((old, "40 days"), (young, "8 days")):
            conn.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, "
                "ce_time, document_id, created_at) VALUES (%s, 't.billing.invoices.v1', 'c', 'x', "
                "'{}', '/t', 't', "
                "gen_random_uuid(), now() - %s::interval)",
                (row_id, age),
            )
    with connect(db, "admin") as conn:
        with pytest.raises(errors.InsufficientPrivilege, match="floor"):
            prune_outbox(conn, timedelta(days=grants.OUTBOX_PRUNE_FLOOR_DAYS - 1))
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("DELETE FROM outbox WHERE id = %s", (old,))
        assert prune_outbox(conn, timedelta(days=30)) >= 1
    with connect(db, "owner") as conn:
        kept = {
            r[0]
            for r in conn.execute("SELECT id::text FROM outbox WHERE id IN (%s, %s)", (old, young))
        }
    assert kept == {young}


def test_the_admin_republishes_only_a_kept_row_through_the_function(db: PostgresSettings) -> None:
    document = str(uuid.uuid4())
    payload = {"invoice_id": document, "total": "11.00"}
    with connect(db, "owner") as conn:
        for row_id, age, body in (
            (str(uuid.uuid4()), "2 days", {"old": True}),
            (str(uuid.uuid4()), "1 day", payload),
        ):
            conn.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, ce_source, "
                "ce_time, document_id, created_at) VALUES (%s, 't.billing.invoices.v1', 'c-rp', "
                "'invoice.issued', %s, '/t', 't', %s, now() - %s::interval)",
                (row_id, json.dumps(body), document, age),
            )
    with connect(db, "admin") as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(_NEW_OUTBOX)
        new_id = conn.execute("SELECT republish_document(%s)", (document,)).fetchone()
        assert new_id is not None and new_id[0] is not None
        # nothing kept for an unknown (or pruned) document: nothing written
        assert conn.execute("SELECT republish_document(gen_random_uuid())").fetchone() == (None,)
    with connect(db, "owner") as conn:
        copy = conn.execute(
            "SELECT aggregatetype, aggregateid, type, payload, ce_source, document_id::text "
            "FROM outbox WHERE id = %s",
            (new_id[0],),
        ).fetchone()
        rows = conn.execute(
            "SELECT count(*) FROM outbox WHERE document_id = %s", (document,)
        ).fetchone()
    assert copy is not None
    # the newest kept row, under a fresh id, from /ops/reconcile
    assert copy[:3] == ("t.billing.invoices.v1", "c-rp", "invoice.issued")
    assert copy[3] == payload
    assert copy[4:] == ("/ops/reconcile", document)
    assert rows == (3,)


# --------------------------------------------------------------------------- the triggers


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE invoices SET total = total + 1, subtotal = subtotal + 1 WHERE invoice_id = %s",
        "UPDATE invoices SET invoice_number = 'INV-FORGED' WHERE invoice_id = %s",
        "UPDATE invoices SET customer_id = 'someone-else' WHERE invoice_id = %s",
        "UPDATE invoices SET status = 'superseded', total = 0, subtotal = -1, tax_total = 1 "
        "WHERE invoice_id = %s",
        "UPDATE invoices SET status = 'paid-ish' WHERE invoice_id = %s",
        "DELETE FROM invoices WHERE invoice_id = %s",
        "UPDATE invoice_lines SET amount = 0 WHERE invoice_id = %s",
        "DELETE FROM invoice_lines WHERE invoice_id = %s",
        "INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, tax_code, tax_rate, tax, "
        "source_topic, source_partition, source_offset) "
        "VALUES (%s, 2, 'extra', 5, 'std', 0, 0, 'events', 0, 99)",
        "INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, tax_code, tax_rate, tax, "
        "source_topic, source_partition, source_offset) "
        "VALUES (%s, 7, 'far', 5, 'std', 0, 0, 'events', 0, 98)",
    ],
)
def test_the_trigger_refuses_the_owner_any_change_of_an_issued_invoice(
    db: PostgresSettings, statement: str
) -> None:
    invoice_id = _one_invoice(db)
    with connect(db, "owner") as conn:
        with pytest.raises(errors.InsufficientPrivilege, match=r"immutable|refused|never"):
            conn.execute(statement, (invoice_id,))
        row = conn.execute(
            "SELECT status, total, (SELECT count(*) FROM invoice_lines WHERE invoice_id = %s) "
            "FROM invoices WHERE invoice_id = %s",
            (invoice_id, invoice_id),
        ).fetchone()
    assert row == ("issued", 11, 1)


def test_the_trigger_refuses_truncating_documents_even_to_the_owner(db: PostgresSettings) -> None:
    with connect(db, "owner") as conn:
        # CASCADE where a foreign key refers to the table (credit_note_lines, migration
        # 0021): otherwise PostgreSQL refuses before the trigger would
        for table in (
            "invoices CASCADE",
            "invoice_lines CASCADE",
            "credit_notes CASCADE",
            "credit_note_lines",
            "outbox",
        ):
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(f"TRUNCATE {table}")


def test_the_status_trigger_refuses_the_owner_any_other_transition(
    db: PostgresSettings,
) -> None:
    """The replay no longer has UPDATE on invoices (migration 0018: it supersedes through
    ``supersede_invoice``, tests/security/db/test_narrow_roles.py); the trigger of 0006
    still refuses every transition but issued -> superseded / voided, to the owner too."""
    voided = _one_invoice(db)
    with connect(db, "owner") as conn:
        conn.execute("UPDATE invoices SET status = 'voided' WHERE invoice_id = %s", (voided,))
        for back in ("issued", "superseded"):
            with pytest.raises(errors.InsufficientPrivilege, match="status voided -> "):
                conn.execute(
                    "UPDATE invoices SET status = %s WHERE invoice_id = %s", (back, voided)
                )


def test_lines_are_accepted_only_from_the_transaction_that_issues_the_invoice(
    db: PostgresSettings,
) -> None:
    """In the issuing transaction (also inside a savepoint, as nested psycopg
    transactions make) lines go in; once the invoice is committed, none can be added."""
    invoice_id = str(uuid.uuid4())
    line = (
        "INSERT INTO invoice_lines (invoice_id, line_no, event_id, amount, tax_code, tax_rate, "
        "tax, source_topic, source_partition, source_offset) "
        "VALUES (%s, %s, %s, 1, 'std', 0, 0, 'events', 0, %s)"
    )
    with connect(db, "worker") as conn:
        with conn.transaction():
            conn.execute(
                "INSERT INTO invoices (invoice_id, invoice_number, customer_id, billing_period, "
                "revision, status, customer_name, email, currency, line_count, subtotal, tax_total, "
                "total, taxes, close_event_id, source_topic, source_partition, close_offset) "
                "VALUES (%s, %s, %s, '2026-02', 1, 'issued', 'n', 'e', 'USD', 2, 2, 0, 2, '[]', "
                "'x', 'events', 0, 5)",
                (invoice_id, f"INV-L-{invoice_id[:8]}", f"c-{invoice_id[:8]}"),
            )
            conn.execute(line, (invoice_id, 1, "e-1", 1))
            with conn.transaction():  # a savepoint: another (sub)transaction id
                conn.execute(line, (invoice_id, 2, "e-2", 2))
        with pytest.raises(errors.InsufficientPrivilege, match="adding a line"):
            conn.execute(line, (invoice_id, 3, "e-3", 3))
        with pytest.raises(errors.InsufficientPrivilege, match="adding a line"), conn.transaction():
            conn.execute("SELECT 1")  # a new transaction that did not insert the invoice
            conn.execute(line, (invoice_id, 3, "e-3", 3))
    with connect(db, "owner") as conn:
        lines = conn.execute(
            "SELECT count(*) FROM invoice_lines WHERE invoice_id = %s", (invoice_id,)
        ).fetchone()
    assert lines == (2,)


@pytest.mark.parametrize(
    ("statement", "rule"),
    [
        (
            "UPDATE invoices SET total = total + 1 WHERE invoice_id = %s",
            "issued invoices are immutable: invoice .* change of total refused; "
            "only status issued -> superseded/voided is allowed",
        ),
        ("DELETE FROM invoices WHERE invoice_id = %s", "invoices are never deleted: DELETE"),
        ("DELETE FROM invoice_lines WHERE invoice_id = %s", "invoice_lines rows are immutable"),
    ],
)
def test_a_refusal_names_the_rule_and_hints_at_docs_roles(
    db: PostgresSettings, statement: str, rule: str
) -> None:
    """Migration 0023: a trigger's refusal states the rule (not just 42501, which reads
    as a missing grant) and its HINT points at docs/roles.md."""
    invoice_id = _one_invoice(db)
    with (
        connect(db, "owner") as conn,
        pytest.raises(errors.InsufficientPrivilege, match=rule) as err,
    ):
        conn.execute(statement, (invoice_id,))
    assert err.value.sqlstate == "42501"
    assert "docs/roles.md" in (err.value.diag.message_hint or "")


def test_credit_notes_and_outbox_rows_are_immutable_even_to_the_owner(
    db: PostgresSettings,
) -> None:
    invoice_id = _one_invoice(db)
    with connect(db, "owner") as conn:
        conn.execute(
            "INSERT INTO credit_notes (credit_note_id, credit_note_number, invoice_id, customer_id, "
            "billing_period, currency, subtotal, tax_total, total, reason) "
            "VALUES (gen_random_uuid(), %s, %s, 'c', '2026-01', 'USD', -10, -1, -11, 'test')",
            (f"CN-T-{invoice_id[:8]}", invoice_id),
        )
        conn.execute(_NEW_OUTBOX)
        for statement in (
            "UPDATE credit_notes SET total = 0 WHERE invoice_id = %s",
            "DELETE FROM credit_notes WHERE invoice_id = %s",
        ):
            with pytest.raises(errors.InsufficientPrivilege, match="immutable"):
                conn.execute(statement, (invoice_id,))
        with pytest.raises(errors.InsufficientPrivilege, match="immutable"):
            conn.execute("UPDATE outbox SET aggregateid = 'other'")


def test_a_forbidden_statement_names_the_rule_not_a_secret(
    db: PostgresSettings, settings: Settings
) -> None:
    with connect(db, "worker") as conn, pytest.raises(errors.InsufficientPrivilege) as info:
        conn.execute("DELETE FROM invoices")
    message = str(info.value)
    assert "permission denied for table invoices" in message
    for role in RUNTIME:
        assert settings.postgres.role(role).password.get_secret_value() not in message


def test_grants_converge_after_a_manual_change(db: PostgresSettings, settings: Settings) -> None:
    """`invoicing db migrate` puts back what the matrix says (a grant added by hand goes)."""
    from streams.adapters.postgres import migrate

    with superuser(settings, db.database) as conn:
        conn.execute("GRANT DELETE ON invoices TO invoicing_worker")
    with connect(db, "owner") as conn:
        before = conn.execute(
            "SELECT has_table_privilege('invoicing_worker', 'invoices', 'DELETE')"
        ).fetchone()
    assert before == (True,)
    migrate.upgrade(db)
    with connect(db, "owner") as conn:
        granted = conn.execute(
            "SELECT has_table_privilege('invoicing_worker', 'invoices', 'DELETE')"
        ).fetchone()
    assert granted == (False,)


def test_the_trigger_holds_where_a_grant_is_wrong(
    db: PostgresSettings, settings: Settings, unique: str
) -> None:
    """A login of the replay's role (UPDATE on ``status``) that was also granted UPDATE on
    every column by mistake still cannot change an issued invoice's amounts, number or
    lines: the trigger refuses what the grant allowed."""
    user, password = f"t{unique}_misgranted", f"pw-{unique}"
    with superuser(settings, db.database) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE invoicing_replay").format(
                sql.Identifier(user), sql.Literal(password)
            )
        )
        conn.execute(
            sql.SQL("GRANT UPDATE, DELETE ON invoices, invoice_lines TO {}").format(
                sql.Identifier(user)
            )
        )
    invoice_id = _one_invoice(db)
    misgranted = db.model_copy(
        update={"replay": DatabaseRole(user=user, password=SecretStr(password))}
    )
    try:
        with connect(misgranted, "replay") as conn:
            for statement in (
                "UPDATE invoices SET subtotal = 1, total = 2, tax_total = 1 WHERE invoice_id = %s",
                "UPDATE invoices SET invoice_number = 'INV-FORGED' WHERE invoice_id = %s",
                "UPDATE invoices SET status = 'superseded', total = 0, subtotal = 0, tax_total = 0 "
                "WHERE invoice_id = %s",
                "UPDATE invoice_lines SET amount = 0 WHERE invoice_id = %s",
                "DELETE FROM invoice_lines WHERE invoice_id = %s",
                "DELETE FROM invoices WHERE invoice_id = %s",
            ):
                with pytest.raises(errors.InsufficientPrivilege, match=r"immutable|never"):
                    conn.execute(statement, (invoice_id,))
            # the grant lets the status through the trigger of 0006, but not past the
            # commit-time check of 0018: no successor revision
            with pytest.raises(errors.IntegrityConstraintViolation, match="successor"):
                conn.execute(
                    "UPDATE invoices SET status = 'superseded' WHERE invoice_id = %s",
                    (invoice_id,),
                )
    finally:
        with superuser(settings, db.database) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (user,),
            )
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(user)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(user)))
    with connect(db, "owner") as conn:
        row = conn.execute(
            "SELECT status, total, invoice_number LIKE 'INV-T-%%' FROM invoices "
            "WHERE invoice_id = %s",
            (invoice_id,),
        ).fetchone()
    assert row == ("issued", 11, True)


def test_0006_guards_the_rated_charge_lines(settings: Settings, unique: str) -> None:
    """0006 gives the rated charge lines (``invoice_charges``, created by 0005) the same
    guards as ``invoice_lines``: no line added to an issued invoice, no TRUNCATE, even
    for the owner."""
    from tests.support.roles import migrated_database

    with migrated_database(settings.postgres, f"chain_{unique}") as pg:
        invoice_id = _one_invoice(pg)
        with connect(pg, "owner") as conn:
            with pytest.raises(errors.InsufficientPrivilege, match="adding a line"):
                conn.execute(
                    "INSERT INTO invoice_charges (invoice_id, line_no, line_id, plan_code, "
                    "plan_version, charge_code, charge_model, description, amount, detail, "
                    "tax_code, tax_rate, tax) VALUES (%s, 1, gen_random_uuid(), 'p', 1, 'c', "
                    "'per_unit', 'added later', 5, '{}', 'STD', 0, 0)",
                    (invoice_id,),
                )
            with pytest.raises(errors.InsufficientPrivilege, match="immutable"):
                conn.execute("TRUNCATE invoice_charges")
