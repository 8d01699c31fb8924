"""Test helpers around PostgreSQL roles: the superuser, fresh migrated databases, and
temporary logins with chosen passwords (members of the real privilege roles).

Creating logins needs ``CREATEROLE`` (and ``REPLICATION`` a superuser), which no role of
the project has: tests use the cluster's superuser, the way provisioning does — over
the local stack's unix socket, or (``INVOICING_TEST_STACK=docker``) compose's
``POSTGRES_USER`` over TCP.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg
from psycopg import sql
from pydantic import SecretStr

from streams.adapters.postgres import grants, migrate
from streams.adapters.postgres.provision import provision_publication
from streams.devtools.sandbox.pipeline import _drop_database
from streams.settings import DatabaseRole, PostgresSettings, RoleName, Settings
from tests.support import stack as providers

#: compose's superuser (docker-compose.yml, service postgres).
COMPOSE_SUPERUSER = ("postgres", "compose-superuser")


def superuser(settings: Settings, dbname: str = "postgres") -> psycopg.Connection[Any]:
    """An autocommit connection as the cluster's superuser (the caller closes it)."""
    if providers.provider_name() == "docker":
        user, password = COMPOSE_SUPERUSER
        return psycopg.connect(
            host=settings.postgres.host,
            port=settings.postgres.port,
            user=user,
            password=password,
            dbname=dbname,
            autocommit=True,
        )
    from streams.devtools.stack.manager import Stack

    return psycopg.connect(
        host=str(Stack(settings).postgres_socket_dir()),
        port=settings.postgres.port,
        user="postgres",
        dbname=dbname,
        autocommit=True,
    )


@contextlib.contextmanager
def migrated_database(
    pg: PostgresSettings, name: str, *, publication: bool = False
) -> Iterator[PostgresSettings]:
    """A fresh database ``name`` created by the provisioner, owned by ``pg.owner``, migrated
    to head (with its grants); dropped afterwards. Yields ``pg`` pointing at it."""
    with psycopg.connect(pg.dsn("provisioner"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(name), sql.Identifier(pg.owner.user)
            )
        )
    own = pg.model_copy(update={"database": name})
    try:
        migrate.upgrade(own)
        if publication:
            provision_publication(own)
        yield own
    finally:
        _drop_database(pg, name)


@contextlib.contextmanager
def temporary_logins(
    settings: Settings, unique: str, passwords: Mapping[RoleName, str]
) -> Iterator[Settings]:
    """Logins ``t<unique>_<role>`` with the given passwords, each a member of the privilege
    role of ``role`` (the replication one with ``REPLICATION``); yields ``settings`` using
    them. The logins are dropped afterwards (their sessions ended first)."""
    by_login = {role.login: role for role in grants.PRIVILEGE_ROLES}
    logins = {
        role: DatabaseRole(user=f"t{unique}_{role}", password=SecretStr(pw))
        for role, pw in passwords.items()
    }
    with superuser(settings) as conn:
        for role, login in logins.items():
            attributes = "LOGIN REPLICATION" if role == "replication" else "LOGIN"
            conn.execute(
                sql.SQL("CREATE ROLE {} " + attributes + " PASSWORD {}").format(
                    sql.Identifier(login.user), sql.Literal(login.password.get_secret_value())
                )
            )
            conn.execute(
                sql.SQL("GRANT {} TO {}").format(
                    sql.Identifier(by_login[role].name), sql.Identifier(login.user)
                )
            )
    try:
        yield settings.model_copy(
            update={
                "postgres": settings.postgres.model_copy(
                    update={str(role): login for role, login in logins.items()}
                )
            }
        )
    finally:
        with superuser(settings) as conn:
            for login in logins.values():
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                    (login.user,),
                )
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(login.user)))
