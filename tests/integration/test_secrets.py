"""Connection strings and secrets, on the real stack.

- Passwords that look like libpq parameters or URL syntax (spaces, ``@``, ``/``, ``=``,
  quotes, backslashes, ``hostaddr=…``, ``%``, non-ASCII) connect as given, through
  :meth:`PostgresSettings.dsn` (``make_conninfo``), the pools of the composition root,
  and Alembic (``URL.create``): they neither break nor redirect a connection.
- A whole sandbox pipeline (import, workers, close, emails, the operator commands) runs
  with distinctive passwords for every runtime login, Debezium and Redis; no password
  appears in any log, output, error message, ``repr``, or Connect's view of the
  connector (Debezium's password goes through the file config provider).
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from psycopg import sql
from pydantic import SecretStr
from typer.testing import CliRunner

from streams import bootstrap
from streams.adapters.connect import local_secrets_dir
from streams.adapters.postgres import migrate
from streams.entrypoints.app import app
from streams.settings import DatabaseRole, RoleName, Settings
from tests.support.pipeline import Pipeline, isolated_pipeline
from tests.support.roles import superuser, temporary_logins

ROOT = Path(__file__).resolve().parents[2]

#: Passwords that break or redirect a connection string built by formatting.
HOSTILE = [
    "with spaces and 'single' \"double\" quotes",
    "p@ss/w:rd=equals&amp;?#frag",
    "x hostaddr=10.255.255.1 port=1 dbname=postgres user=postgres",
    "' hostaddr='10.255.255.1",
    "back\\slash\\' trailing\\",
    "%41%40%2F percent-encoded",
    "ünïcødé ✓ pässwörd",
    "  leading and trailing spaces  ",
]


@pytest.mark.parametrize("password", HOSTILE)
def test_a_hostile_password_connects_as_given_and_nowhere_else(
    settings: Settings, unique: str, password: str
) -> None:
    with temporary_logins(settings, unique, {"worker": password}) as s:
        pg = s.postgres
        with psycopg.connect(pg.dsn("worker", connect_timeout=5)) as conn:
            where = conn.execute(
                "SELECT current_user, current_database(), inet_server_port()"
            ).fetchone()
        assert where == (pg.worker.user, pg.database, pg.port)
        pool = bootstrap.postgres_pool(s, role="worker", name=f"hostile-{unique}", max_size=1)
        try:
            with pool.connection() as conn:
                assert conn.execute("SELECT current_user").fetchone() == (pg.worker.user,)
        finally:
            pool.close()
        # The wrong password fails on authentication, and the error does not show it.
        wrong = s.postgres.model_copy(
            update={"worker": DatabaseRole(user=pg.worker.user, password=SecretStr(password + "x"))}
        )
        with pytest.raises(psycopg.OperationalError) as info:
            psycopg.connect(wrong.dsn("worker", connect_timeout=5))
        assert "password authentication failed" in str(info.value)
        assert password not in str(info.value) and password.strip() not in str(info.value)


@pytest.fixture
def hostile_owner(settings: Settings, unique: str) -> Iterator[tuple[str, str]]:
    """A login with a hostile password that owns a fresh database (created by the superuser)."""
    user, database = f"t{unique}_owner", f"inv_{unique}"
    password = "own@er/pass word=x hostaddr=10.255.255.1 '%2F\\"
    with superuser(settings) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(user), sql.Literal(password)
            )
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(user)
            )
        )
    try:
        yield user, password
    finally:
        with superuser(settings) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(user)))


def test_migrations_run_as_an_owner_with_a_hostile_password(
    settings: Settings, unique: str, hostile_owner: tuple[str, str]
) -> None:
    user, password = hostile_owner
    pg = settings.postgres.model_copy(
        update={
            "database": f"inv_{unique}",
            "owner": DatabaseRole(user=user, password=SecretStr(password)),
        }
    )
    url = migrate.url(pg)
    assert password not in repr(url) and password not in str(url)
    migrate.upgrade(pg)
    assert migrate.current_revision(pg) == migrate.head_revision(pg)
    with psycopg.connect(pg.dsn("owner")) as conn:
        owners = conn.execute(
            "SELECT DISTINCT relowner::regrole::text FROM pg_class "
            "WHERE relnamespace = 'public'::regnamespace"
        ).fetchall()
    assert owners == [(user,)]


def test_settings_never_show_a_secret() -> None:
    pg_secret, redis_secret = f"pw-{uuid.uuid4().hex}", f"rs-{uuid.uuid4().hex}"
    s = Settings.model_construct()
    s = s.model_copy(
        update={
            "postgres": s.postgres.model_copy(
                update={"worker": DatabaseRole(user="w", password=SecretStr(pg_secret))}
            ),
            "redis": s.redis.model_copy(
                update={"url": SecretStr(f"redis://user:{redis_secret}@h:1/0")}
            ),
        }
    )
    shown = [repr(s), str(s), s.model_dump_json(), repr(s.postgres), s.redis.display_url()]
    for text in shown:
        assert pg_secret not in text and redis_secret not in text
    assert s.redis.display_url() == "redis://***@h:1/0"


# --------------------------------------------------------------------------- a whole run


def _distinctive(unique: str) -> dict[RoleName, str]:
    """One password per runtime login, each unlike anything else in a log."""
    roles: tuple[RoleName, ...] = (
        "worker",
        "email",
        "close",
        "replay",
        "operator",
        "admin",
        "replication",
    )
    return {role: f"Sx{unique}{role}Q !@/=: hostaddr=0'\\%{n}" for n, role in enumerate(roles)}


@contextlib.contextmanager
def _redis_user(settings: Settings, unique: str) -> Iterator[tuple[str, str]]:
    """A Redis ACL user with a distinctive password (the local Redis has no auth)."""
    user, password = f"t{unique}", f"Rx{unique}redisQsecret"  # URL-safe: no quoting question
    admin = redis.Redis.from_url(settings.redis.url.get_secret_value(), socket_timeout=5)
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=["*"],
        categories=["+@all"],
    )
    try:
        yield user, password
    finally:
        admin.acl_deluser(user)
        admin.close()


def _sample(tmp_path: Path, rows: int = 120) -> Path:
    source = ROOT / "examples" / "focus" / "focus_sample.csv"
    with source.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        kept = [row for _, row in zip(range(rows), reader, strict=False)]
    path = tmp_path / "sample.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh, quoting=csv.QUOTE_ALL)
        writer.writerow(header)
        writer.writerows(kept)
    return path


def _cli(p: Pipeline, *args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(app, list(args), env={**p.env, **(env or {})})
    text = result.output  # stdout and stderr (click 8.2+)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += f"\n{result.exception!r}"
    return text


def _settled(p: Pipeline) -> tuple[int, int]:
    with p.connect("operator") as conn:
        row = conn.execute(
            """
            SELECT count(*), count(*) FILTER (WHERE EXISTS (
                       SELECT 1 FROM email_deliveries d
                        WHERE d.document_id = i.invoice_id AND d.status IN ('sent', 'skipped')))
              FROM invoices i WHERE i.status = 'issued'
            """
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_whole_run_shows_no_password_anywhere(
    settings: Settings,
    unique: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    passwords = _distinctive(unique)
    outputs: list[str] = []
    with (
        _redis_user(settings, unique) as (redis_user, redis_password),
        temporary_logins(settings, unique, passwords) as secret,
    ):
        port = secret.redis.url.get_secret_value().rsplit(":", 1)[1]
        secret = secret.model_copy(
            update={
                "redis": secret.redis.model_copy(
                    update={
                        "url": SecretStr(f"redis://{redis_user}:{redis_password}@127.0.0.1:{port}")
                    }
                )
            }
        )
        secrets = [*passwords.values(), redis_password]
        with isolated_pipeline(secret, unique, tmp_path / "sandbox") as p:
            secrets_file = (
                local_secrets_dir(p.settings) / f"{secret.postgres.replication.user}.properties"
            )
            assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
            outputs.append(_cli(p, "import", "focus", str(_sample(tmp_path)), "--no-progress"))
            p.workers.start("invoicing", 1)
            p.workers.start("email", 1)
            outputs.append(_cli(p, "close-period", "2024-09", "--no-progress"))
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                issued, settled = _settled(p)
                if issued and settled == issued:
                    break
                time.sleep(1)
            assert issued >= 30 and settled == issued, (issued, settled, p.worker_logs())
            for command in (
                ["status"],
                ["status", "--json"],
                ["holds", "list"],
                ["fences", "list"],
                ["reconcile", "--email-grace-minutes", "0"],
                ["outbox", "prune", "--older-than-days", "30"],
                ["replay", "2024-09", "--dry-run", "--no-progress"],
                ["connectors", "status"],
            ):
                outputs.append(_cli(p, *command))
            # A refused login: the error names the role, never the password given.
            outputs.append(
                _cli(
                    p,
                    "status",
                    env={
                        "INVOICING_POSTGRES__OPERATOR__PASSWORD": passwords["operator"] + "-wrong"
                    },
                )
            )
            assert "password authentication failed" in outputs[-1]
            connector = _connector_views(p)
            shown = [repr(p), repr(p.settings), str(p.settings), p.settings.model_dump_json()]
            p.workers.stop()
            logs = [w.log.read_text(errors="replace") for w in p.workers.processes]
        assert not secrets_file.exists(), "the sandbox's secrets file outlived it"
    stack_logs = [
        (settings.stack.local_dir / "logs" / f"{name}.log").read_text(errors="replace")
        for name in ("connect", "postgres")
    ]
    texts = {
        "command output": "\n".join(outputs),
        "worker logs": "\n".join(logs),
        "captured log records": caplog.text,
        "connector config, tasks and status (Connect REST)": connector,
        "repr/str/json of the pipeline and settings": "\n".join(shown),
        "Connect's and PostgreSQL's logs": "\n".join(stack_logs),
    }
    for secret_value in secrets:
        for where, text in texts.items():
            assert secret_value not in text, f"a password appears in the {where}"
    # The run did happen, and was seen: the texts are not empty by accident.
    assert "2024-09" in texts["command output"] and logs and all(logs)
    assert "${file:" in connector


def _connector_views(p: Pipeline) -> str:
    name = p.settings.connect.outbox_connector
    with httpx.Client(base_url=p.settings.connect.url, timeout=10) as client:
        parts: list[Any] = [
            client.get(f"/connectors/{name}/config").json(),
            client.get(f"/connectors/{name}/tasks").json(),
            client.get(f"/connectors/{name}/status").json(),
            client.get(f"/connectors/{name}").json(),
        ]
    return json.dumps(parts)


def test_the_stack_connector_references_its_password_through_the_provider(
    settings: Settings,
) -> None:
    name = settings.connect.outbox_connector
    with httpx.Client(base_url=settings.connect.url, timeout=10) as client:
        config = client.get(f"/connectors/{name}/config").json()
        tasks = client.get(f"/connectors/{name}/tasks").json()
    path = local_secrets_dir(settings) / f"{settings.postgres.replication.user}.properties"
    assert config["database.password"] == f"${{file:{path}:password}}"
    assert [t["config"]["database.password"] for t in tasks] == [config["database.password"]]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    worker_config = (
        settings.stack.local_dir / "conf" / "connect-distributed.properties"
    ).read_text()
    assert "config.providers=file" in worker_config
    assert f"config.providers.file.param.allowed.paths={path.parent}" in worker_config
    assert (bootstrap.outbox_connector_status(settings) or {}).get("connector", {}).get(
        "state"
    ) == "RUNNING"
