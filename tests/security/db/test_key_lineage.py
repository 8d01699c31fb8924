"""Finding 1, the trace, on PostgreSQL (docs/security.md "API keys"): the worker's hot path
(``COPY`` into ``usage_staging``, moved into ``usage_lines``) and the metered insert store
the key id of the record header as ``key_id`` (migration 0017), as the worker's login.

Before the fix the tables had no ``key_id`` column.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

import psycopg

from streams.apps.invoicing.batch import usage_row
from streams.core.billing import rows
from streams.core.billing.stores import POSTGRES
from streams.core.domain.events import UsageMetered, UsageRecorded
from streams.settings import PostgresSettings


def test_usage_and_metered_rows_keep_the_key_id(db: PostgresSettings) -> None:
    suffix = uuid.uuid4().hex[:8]
    source = rows.SourceCoordinates("t.sec.lineage", 0, 7)
    usage = UsageRecorded.model_validate(
        {
            "customer_id": f"sec-{suffix}",
            "billing_period": "2024-09",
            "amount": "1.25",
            "currency": "USD",
            "event_time": "2024-09-03T10:00:00Z",
        }
    )
    metered = UsageMetered.model_validate(
        {
            "customer_id": f"sec-{suffix}",
            "metric": "api_calls",
            "event_time": datetime(2024, 9, 3, tzinfo=UTC),
            "values": {"calls": "3"},
        }
    )
    with psycopg.connect(db.dsn("worker")) as conn:
        digest = hashlib.sha256(usage.model_dump_json().encode()).hexdigest()
        sent = usage_row(f"u-{suffix}", usage, digest, source, "k1a2b3c4")
        other = usage_row(f"v-{suffix}", usage, digest, source)
        assert POSTGRES.usage.insert_usage_rows(conn, [sent, other]) == []
        assert (
            POSTGRES.metering.insert_metered(
                conn, [rows.MeteredRecord(f"m-{suffix}", metered, source, "k1a2b3c4")]
            )
            == []
        )
        conn.commit()
        found: dict[str, str | None] = dict(
            conn.execute(
                "SELECT event_id, key_id FROM usage_lines WHERE event_id = ANY(%s)",
                ([sent.event_id, other.event_id],),
            ).fetchall()
        )
        assert found == {sent.event_id: "k1a2b3c4", other.event_id: None}
        (metered_key,) = conn.execute(
            "SELECT key_id FROM metered_usage WHERE event_id = %s", (f"m-{suffix}",)
        ).fetchone() or (None,)
        assert metered_key == "k1a2b3c4"
