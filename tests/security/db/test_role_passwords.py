"""Finding 8, role passwords as literals (docs/security.md "Defaults"): provisioning set each
login's password with ``ALTER ROLE … PASSWORD '<the password>'``, a statement that reaches
the server log under ``log_statement`` (and ``pg_stat_statements``, an error's context).
Provisioning now sends SCRAM-SHA-256 verifiers computed on the client.

The test provisions the stack's cluster again (what ``invoicing stack up`` does: every
statement resets the roles to the settings, idempotent), recording each statement as
sent, then logs in as every role. Before the fix the statements held the passwords.
"""

from __future__ import annotations

from typing import Any, get_args

import psycopg

from streams.adapters.postgres.provision import provision_roles
from streams.settings import RoleName, Settings
from tests.support.roles import superuser


class Recording:
    """A connection that records the text of each statement it runs."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.sent: list[str] = []

    def execute(self, query: Any, params: Any = None) -> Any:
        text = query if isinstance(query, str) else query.as_string(self.conn)
        self.sent.append(text)
        return self.conn.execute(query, params)


def test_provisioning_never_sends_a_password(settings: Settings, stack: str) -> None:
    pg = settings.postgres
    with superuser(settings) as conn:
        recording = Recording(conn)
        provision_roles(recording, pg)  # type: ignore[arg-type]
    passwords = {name: pg.role(name).password.get_secret_value() for name in get_args(RoleName)}
    # what each ALTER ROLE sets as the password (the default passwords equal the user
    # names, so only this part of a statement can tell a password from a role name)
    sent = [
        text.split(" PASSWORD ", 1)[1]
        for text in recording.sent
        if text.startswith("ALTER ROLE") and " PASSWORD " in text
    ]
    assert len(sent) >= len(passwords)
    for value in sent:
        for name, password in passwords.items():
            assert value != f"'{password}'", f"postgres.{name}'s password sent as a literal"
        assert value == "NULL" or value.startswith("'SCRAM-SHA-256$4096:"), value
    for name in get_args(RoleName):  # the verifiers are right: every login still logs in
        with psycopg.connect(pg.dsn(name)) as login:
            assert login.execute("SELECT current_user").fetchone() == (pg.role(name).user,)
