"""The privilege matrix (streams/adapters/postgres/grants.py) keeps its rules, and docs/roles.md shows it.

The database side (every table has an entry, the privileges equal the matrix, each
forbidden statement refused) is tests/integration/test_roles.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from streams.adapters.postgres import grants
from streams.settings import DatabaseRole, PostgresSettings

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("invoices", "invoice_lines", "credit_notes", "outbox")
CONTACT = {
    "customers": {"name", "email"},
    "invoices": {"customer_name", "email"},
    "email_deliveries": {"recipient"},
    "outbox": {"payload"},
}


def test_no_role_may_delete_or_edit_issued_documents() -> None:
    for table in DOCUMENTS:
        for key, privileges in grants.TABLES[table].items():
            assert not privileges.delete, (table, key)
            # migration 0018: not even the replay's status; it supersedes through a function
            assert not privileges.update, (table, key)
    assert grants.FUNCTIONS["supersede_invoice(uuid)"] == ("replay",)


def test_only_the_pricing_role_publishes_and_never_names_the_stamp() -> None:
    for table in ("billable_metrics", "plan_versions"):
        writers = {k for k, p in grants.TABLES[table].items() if p.insert or p.update}
        assert writers == {"pricing"}, table
        insert = grants.TABLES[table]["pricing"].insert
        assert insert != grants.ALL
        assert not {"published_by", "published_at"} & set(insert), table


def test_only_the_admin_may_prune_the_outbox_and_no_one_may_delete_it() -> None:
    assert grants.FUNCTIONS["prune_outbox(interval)"] == ("admin",)
    assert all(not p.delete for p in grants.TABLES["outbox"].values())


def test_the_operator_reads_and_never_writes_nor_sees_contact_data() -> None:
    for table, entry in grants.TABLES.items():
        privileges = entry.get("operator")
        if privileges is None:
            continue
        assert not (privileges.insert or privileges.update or privileges.delete), table
        if table in CONTACT:
            assert privileges.select != grants.ALL, table
            assert not CONTACT[table] & set(privileges.select), table
    assert not any(key == "operator" for keys in grants.FUNCTIONS.values() for key in keys)


def test_every_matrix_role_is_a_privilege_role() -> None:
    keys = {role.key for role in grants.PRIVILEGE_ROLES}
    for table, entry in grants.TABLES.items():
        assert set(entry) <= keys, table
    for keys_of in (*grants.SEQUENCES.values(), *grants.FUNCTIONS.values()):
        assert set(keys_of) <= keys


def test_statements_revoke_everything_before_granting() -> None:
    statements = grants.statements(["invoices"], sequences=[], functions=[])
    revoke = next(i for i, s in enumerate(statements) if s.startswith("REVOKE ALL ON TABLE"))
    grant_lines = [s for s in statements if s.startswith("GRANT") and "invoices" in s]
    assert all(statements.index(s) > revoke for s in grant_lines)
    # migration 0018: the replay supersedes through supersede_invoice(uuid), no UPDATE grant
    assert not any("UPDATE" in s and "invoicing_replay" in s for s in grant_lines)
    assert all("%" not in s for s in grants.statements())  # they pass through two drivers


def test_logins_are_members_of_distinct_privilege_roles() -> None:
    logins = [role.login for role in grants.PRIVILEGE_ROLES]
    assert len(set(logins)) == len(logins)
    assert "owner" not in logins and "provisioner" not in logins


def test_docs_show_the_current_matrix() -> None:
    """docs/roles.md holds `invoicing db roles --markdown` between its markers."""
    text = (ROOT / "docs" / "roles.md").read_text()
    found = re.search(r"<!-- matrix:begin -->\n(.*?)<!-- matrix:end -->", text, re.S)
    assert found, "docs/roles.md lacks its matrix markers"
    assert found.group(1) == grants.markdown_matrix(), (
        "docs/roles.md is stale: paste `invoicing db roles --markdown` between the markers"
    )


def test_login_names_are_plain_identifiers() -> None:
    import pydantic
    import pytest
    from pydantic import SecretStr

    with pytest.raises(pydantic.ValidationError):
        DatabaseRole(user='worker" LOGIN SUPERUSER --', password=SecretStr("x"))
    assert PostgresSettings().worker.user == "invoicing_worker_login"
