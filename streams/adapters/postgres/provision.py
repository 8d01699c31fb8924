"""Roles, database and the Debezium publication: what a DBA provisions once per cluster.

The local stack runs :func:`provision_cluster` in ``stack up`` as the PostgreSQL
superuser over the cluster's unix socket; in production a DBA runs the same
statements (:func:`cluster_statements`). Every statement is idempotent: running it
again resets each role's attributes and password to the settings.

Roles (docs/roles.md):

- the **privilege roles** of :mod:`streams.adapters.postgres.grants` (``invoicing_worker``, ...,
  ``invoicing_cdc``): ``NOLOGIN``; migration 0006 grants them their tables and columns;
- one **login** per process kind (``settings.postgres.worker``, ``.email``, ``.close``,
  ``.replay``, ``.operator``, ``.admin``): ``LOGIN``, no other attribute, a member of
  its privilege role and of nothing else;
- the **replication** login (Debezium): ``LOGIN REPLICATION``, a member of
  ``invoicing_cdc``;
- the **owner** (``settings.postgres.owner``): ``LOGIN`` only (no ``CREATEDB``), owns
  the database (and, through the migrations it runs, every table and function);
- the **provisioner** (``settings.postgres.provisioner``): ``LOGIN CREATEDB``, a member
  of the owner (so the databases it creates belong to the owner and it may drop them)
  and of ``pg_signal_backend`` (``DROP DATABASE … WITH (FORCE)`` ends other roles'
  sessions): the per-test sandbox databases and the drill's. It exists for the local
  stack and the tests; no process of the pipeline connects as it, and a production
  cluster does not need it.

No runtime role has ``CREATEDB``, ``CREATEROLE``, ``SUPERUSER`` or ``BYPASSRLS``, or
owns anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import psycopg
from psycopg import sql

from streams.adapters.postgres import grants
from streams.errors import InvoicingError
from streams.settings import DatabaseRole, PostgresSettings, RoleName

#: Login attributes each kind of role gets (everything else is explicitly off).
_RUNTIME = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"
_REPLICATION = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE REPLICATION NOBYPASSRLS INHERIT"
_PROVISIONER = "LOGIN NOSUPERUSER CREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"
_PRIVILEGE = "NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS INHERIT"


class ProvisionError(InvoicingError):
    """The settings name roles that cannot be provisioned as given (e.g. a login twice)."""


#: ``(user, password) → the password as the statement carries it``: a SCRAM-SHA-256 verifier
#: (:func:`scram_verifiers`), so that no statement, and so no server log line, holds it.
PasswordForm = Callable[[str, str], str]


def scram_verifiers(conn: psycopg.Connection[Any]) -> PasswordForm:
    """SCRAM-SHA-256 verifiers computed on the client by libpq (``PQencryptPasswordConn``,
    with SASLprep, a random salt, 4096 iterations): PostgreSQL stores a verifier it is given
    as is, and the password itself never travels or reaches ``log_statement``."""

    def verifier(user: str, password: str) -> str:
        return conn.pgconn.encrypt_password(
            password.encode("utf-8"), user.encode("utf-8"), b"scram-sha-256"
        ).decode("ascii")

    return verifier


def _literal(user: str, password: str) -> str:
    return password


def _ensure_role(name: str, attributes: str, password: str | None) -> list[sql.Composed]:
    create = sql.SQL(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {lit}) THEN "
        "CREATE ROLE {ident}; END IF; END $$"
    ).format(lit=sql.Literal(name), ident=sql.Identifier(name))
    alter = sql.SQL("ALTER ROLE {ident} " + attributes).format(ident=sql.Identifier(name))
    if password is not None:
        alter = sql.SQL("{alter} PASSWORD {pw}").format(alter=alter, pw=sql.Literal(password))
    else:
        alter = sql.SQL("{alter} PASSWORD NULL").format(alter=alter)
    return [create, alter]


def _check_names(pg: PostgresSettings) -> None:
    logins: dict[str, RoleName] = {}
    fixed = {role.name for role in grants.PRIVILEGE_ROLES}
    for name in get_args(RoleName):
        user = pg.role(name).user
        if user in fixed:
            raise ProvisionError(f"postgres.{name}.user {user!r} is a privilege role's name")
        if user in logins:
            raise ProvisionError(
                f"postgres.{name}.user and postgres.{logins[user]}.user are both {user!r}: "
                "each process kind needs its own login"
            )
        logins[user] = name


def cluster_statements(
    pg: PostgresSettings, password_form: PasswordForm = _literal
) -> list[sql.Composed]:
    """The role statements of the module docstring, for a superuser (or a DBA), in order.
    ``password_form`` gives each password as the statements carry it: by default the
    literal (run them, never print or log them); :func:`scram_verifiers` gives verifiers,
    which :func:`provision_roles` uses.

    Raises:
        ProvisionError: two settings name the same login, or a login is named like a
            privilege role.
    """
    _check_names(pg)
    out: list[sql.Composed] = []
    for privilege in grants.PRIVILEGE_ROLES:
        out += _ensure_role(privilege.name, _PRIVILEGE, None)

    def password(role: DatabaseRole) -> str:
        return password_form(role.user, role.password.get_secret_value())

    out += _ensure_role(pg.owner.user, _RUNTIME, password(pg.owner))
    for privilege in grants.PRIVILEGE_ROLES:
        login = pg.role(privilege.login)
        attributes = _REPLICATION if privilege.login == "replication" else _RUNTIME
        out += _ensure_role(login.user, attributes, password(login))
        out.append(
            sql.SQL("GRANT {group} TO {login}").format(
                group=sql.Identifier(privilege.name), login=sql.Identifier(login.user)
            )
        )
    out += _ensure_role(pg.provisioner.user, _PROVISIONER, password(pg.provisioner))
    for group in (pg.owner.user, "pg_signal_backend"):
        out.append(
            sql.SQL("GRANT {group} TO {login}").format(
                group=sql.Identifier(group), login=sql.Identifier(pg.provisioner.user)
            )
        )
    return out


def provision_roles(conn: psycopg.Connection[Any], pg: PostgresSettings) -> None:
    """Run :func:`cluster_statements` on ``conn`` (a superuser's autocommit connection), the
    passwords as SCRAM-SHA-256 verifiers (:func:`scram_verifiers`: never a literal that could
    reach the server log), then create the database owned by the owner when it does not
    exist."""
    for stmt in cluster_statements(pg, scram_verifiers(conn)):
        conn.execute(stmt)
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (pg.database,)).fetchone()
    if not exists:
        conn.execute(
            sql.SQL("CREATE DATABASE {db} OWNER {owner}").format(
                db=sql.Identifier(pg.database), owner=sql.Identifier(pg.owner.user)
            )
        )
    else:
        conn.execute(
            sql.SQL("ALTER DATABASE {db} OWNER TO {owner}").format(
                db=sql.Identifier(pg.database), owner=sql.Identifier(pg.owner.user)
            )
        )


def provision_cluster(pg: PostgresSettings, socket_dir: Path) -> None:
    """Create (or reset) every role and the database, as the ``postgres`` superuser over
    the unix socket in ``socket_dir`` (the local stack)."""
    with psycopg.connect(
        host=str(socket_dir), port=pg.port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        provision_roles(conn, pg)


def provision_publication(pg: PostgresSettings) -> None:
    """After migrations: Debezium's publication on the outbox, as the owner (who owns the
    outbox and the database). Created ahead of time so the connector can use
    ``publication.autocreate.mode=disabled`` (the default ``all_tables`` mode needs a
    superuser). Debezium's read grant is the matrix's (``invoicing_cdc``)."""
    with psycopg.connect(pg.dsn("owner"), autocommit=True) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (pg.publication,)
        ).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {p} FOR TABLE outbox").format(
                    p=sql.Identifier(pg.publication)
                )
            )
