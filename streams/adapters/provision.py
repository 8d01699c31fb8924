"""Roles, database, grants and the Debezium publication, as the PostgreSQL superuser.

In production a DBA runs the same statements (``invoicing db provision --print``
prints them). The local stack runs them in ``stack up`` over the cluster's unix
socket. Every statement is idempotent.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql

from streams.settings import PostgresSettings


def _role_sql(
    name: str, password: str, *, replication: bool, createdb: bool = False
) -> list[sql.Composed]:
    words = (
        ["LOGIN"] + (["REPLICATION"] if replication else []) + (["CREATEDB"] if createdb else [])
    )
    attrs = sql.SQL(" ".join(words))
    return [
        sql.SQL(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = {lit}) THEN "
            "CREATE ROLE {ident} {attrs}; END IF; END $$"
        ).format(lit=sql.Literal(name), ident=sql.Identifier(name), attrs=attrs),
        sql.SQL("ALTER ROLE {ident} {attrs} PASSWORD {pw}").format(
            ident=sql.Identifier(name), attrs=attrs, pw=sql.Literal(password)
        ),
    ]


def provision_cluster(pg: PostgresSettings, socket_dir: Path) -> None:
    """Create (or update) the application and replication roles and the database.

    On the local stack the application role also gets ``CREATEDB``, so that
    integration tests can give each test its own database; a production role
    does not need it.
    """
    with psycopg.connect(
        host=str(socket_dir), port=pg.port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        for stmt in _role_sql(
            pg.user, pg.password.get_secret_value(), replication=False, createdb=True
        ):
            conn.execute(stmt)
        for stmt in _role_sql(
            pg.replication_user, pg.replication_password.get_secret_value(), replication=True
        ):
            conn.execute(stmt)
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (pg.database,)
        ).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE DATABASE {db} OWNER {owner}").format(
                    db=sql.Identifier(pg.database), owner=sql.Identifier(pg.user)
                )
            )


def provision_publication(pg: PostgresSettings) -> None:
    """After migrations: Debezium's publication on the outbox and its read grant.

    Run as the application role, which owns the outbox table (so it may grant
    on it and publish it) and the database (so it may create publications).
    Created ahead of time so the connector can use
    ``publication.autocreate.mode=disabled`` (the default ``all_tables`` mode
    needs a superuser).
    """
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("GRANT SELECT ON outbox TO {r}").format(r=sql.Identifier(pg.replication_user))
        )
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA public TO {r}").format(
                r=sql.Identifier(pg.replication_user)
            )
        )
        exists = conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (pg.publication,)
        ).fetchone()
        if not exists:
            conn.execute(
                sql.SQL("CREATE PUBLICATION {p} FOR TABLE outbox").format(
                    p=sql.Identifier(pg.publication)
                )
            )
