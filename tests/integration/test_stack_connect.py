"""Kafka Connect with the Debezium PostgreSQL connector, for real."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from confluent_kafka import Message
from psycopg import sql

from streams import bootstrap
from streams.adapters.connect import wait_running
from streams.devtools.stack.health import POSTGRES_CONNECTOR_CLASS
from streams.settings import Settings
from tests.support.kafka import drain, make_topic

# The stack's own database and outbox connector (no sandbox): never beside another module
# that uses them (pytest-xdist --dist loadgroup keeps a group on one worker).
pytestmark = pytest.mark.xdist_group("stack-database")


def test_connect_lists_the_debezium_postgres_connector(settings: Settings) -> None:
    plugins = httpx.get(settings.connect.url + "/connector-plugins", timeout=10).json()
    assert POSTGRES_CONNECTOR_CLASS in {p["class"] for p in plugins}
    transforms = httpx.get(
        settings.connect.url + "/connector-plugins?connectorsOnly=false", timeout=10
    ).json()
    assert "io.debezium.transforms.outbox.EventRouter" in {p["class"] for p in transforms}


def test_outbox_connector_is_registered_and_running(settings: Settings) -> None:
    status = bootstrap.outbox_connector_status(settings)
    assert status is not None, "the outbox connector is not registered"
    assert status["connector"]["state"] == "RUNNING"
    assert [t["state"] for t in status["tasks"]] == ["RUNNING"]


def _outbox_template() -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    template: dict[str, str] = json.loads(
        (root / "connectors" / "outbox-connector.json").read_text()
    )
    return template


def test_throwaway_debezium_connector_streams_an_inserted_row(
    settings: Settings, unique: str
) -> None:
    table = f"dbz_probe_{unique}"
    prefix = f"probe{unique}"
    topic = make_topic(settings.kafka, f"{prefix}.public.{table}", 1)
    name = f"probe-{unique}"
    pg = settings.postgres
    with psycopg.connect(pg.dsn("owner"), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (id serial PRIMARY KEY, note text NOT NULL)").format(
                sql.Identifier(table)
            )
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(table), sql.Identifier(pg.replication.user)
            )
        )
        conn.execute(
            sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(f"pub_{unique}"), sql.Identifier(table)
            )
        )
    config = {
        "connector.class": POSTGRES_CONNECTOR_CLASS,
        "plugin.name": "pgoutput",
        "database.hostname": pg.host,
        "database.port": str(pg.port),
        "database.user": pg.replication.user,
        "database.password": pg.replication.password.get_secret_value(),
        "database.dbname": pg.database,
        "topic.prefix": prefix,
        "table.include.list": f"public.{table}",
        "publication.name": f"pub_{unique}",
        "publication.autocreate.mode": "disabled",
        "slot.name": f"slot_{unique}",
        "snapshot.mode": "no_data",
        # the outbox connector's heartbeats are logical decoding messages of this
        # database: another connector must leave them out, or it blocks producing them
        # (docs/operations.md "The replication slot between closes")
        "message.prefix.exclude.list": _outbox_template()["message.prefix.exclude.list"],
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "false",
    }
    client = httpx.Client(base_url=settings.connect.url, timeout=30)
    try:
        response = client.put(f"/connectors/{name}/config", json=config)
        assert response.status_code in (200, 201), response.text
        wait_running(client, name, 90)
        # The slot exists once the task streams; insert until the change arrives.
        note = f"hello from {unique}"
        deadline = time.monotonic() + 60
        records: list[Message] = []
        with psycopg.connect(pg.dsn("owner"), autocommit=True) as conn:
            while not records and time.monotonic() < deadline:
                conn.execute(
                    sql.SQL("INSERT INTO {} (note) VALUES (%s)").format(sql.Identifier(table)),
                    (note,),
                )
                records = drain(settings.kafka, topic, timeout_s=5, idle_s=1)
        assert records, f"no change event reached {topic}"
        raw = records[0].value()
        assert raw is not None
        value = json.loads(raw)
        assert value["op"] == "c"
        assert value["after"]["note"] == note
    finally:
        client.delete(f"/connectors/{name}")
        client.close()
        with psycopg.connect(pg.dsn("owner"), autocommit=True) as conn:
            for _ in range(30):
                active = conn.execute(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                    (f"slot_{unique}",),
                ).fetchone()
                if active is None or not active[0]:
                    break
                time.sleep(1)
        repl_dsn = (
            f"host={pg.host} port={pg.port} dbname={pg.database} user={pg.replication.user} "
            f"password={pg.replication.password.get_secret_value()}"
        )
        with psycopg.connect(repl_dsn, autocommit=True) as repl:
            repl.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s AND NOT active",
                (f"slot_{unique}",),
            )
        with psycopg.connect(pg.dsn("owner"), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP PUBLICATION IF EXISTS {}").format(sql.Identifier(f"pub_{unique}"))
            )
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
