"""Fuzz, with shrinking: Hypothesis draws records and checks the contract against PostgreSQL.

The stack-wide fuzz tests (test_account_events_fuzz.py, test_invoice_events_fuzz.py)
draw their 10,000 records from ``random.Random(seed)`` for speed; this one draws
every choice of the same generator (tests/fuzz/records.py) from Hypothesis
(:class:`~tests.fuzz.records.HypothesisPicker`), so a failure shrinks to a small
record. Seeded with the tier's seed (``--seed N`` / ``$FUZZ_SEED``), no example
database: the same seed draws the same examples.

Properties, for every generated account-events record:

1. the codec either decodes it or raises :class:`~streams.core.domain.errors.InvalidEvent`
   — never anything else (a consumer would not know what it means);
2. a record it decodes can be written by the billing store to the real PostgreSQL
   (inside a transaction rolled back): the contract carries every bound the database
   needs, so no valid record is ever ``unwritable``;
3. the workers' fast path: a record the fast decoder vouches for
   (:func:`~streams.core.domain.fastcodec.decode_usage`) is one the codec decodes, and
   its row is written by the hot path's batch write (``COPY`` into ``usage_staging``,
   :func:`~streams.core.billing.store.usage.insert_usage_rows`) to the same database.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import psycopg
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from streams.apps.invoicing.worker import ACCOUNT_EVENT_TYPES
from streams.core.billing import rows, store
from streams.core.billing.failures import classify
from streams.core.domain.codec import decode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import (
    CustomerUpserted,
    SubscriptionChanged,
    SubscriptionEnded,
    SubscriptionStarted,
    UsageMetered,
    UsageRecorded,
)
from streams.core.domain.fastcodec import decode_usage
from tests.fuzz.records import HypothesisPicker, account_record

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1500"))
SOURCE = rows.SourceCoordinates("fuzz.property", 0, 0)


def test_every_record_is_refused_by_the_codec_or_writable(
    pg: psycopg.Connection[Any], fuzz_seed: int
) -> None:
    accepted: list[str] = []
    vouched: list[str] = []

    @seed(fuzz_seed)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def check(data: st.DataObject) -> None:
        record = account_record(HypothesisPicker(data))
        fast = decode_usage(record.key, record.value, record.headers)
        try:
            envelope = decode(record.key, record.value, record.headers, allowed=ACCOUNT_EVENT_TYPES)
        except InvalidEvent:
            assert fast is None, f"the fast path vouched for a refused record: {record.short()}"
            return
        except Exception as exc:  # property 1
            raise AssertionError(
                f"the codec raised {type(exc).__name__} (not InvalidEvent) for {record.short()}"
            ) from exc
        accepted.append(envelope.type)
        if fast is not None:  # property 3
            vouched.append(fast.event_id)
            assert envelope.type == "usage.recorded" and envelope.id == fast.event_id
            digest = hashlib.sha256(record.value or b"").hexdigest()
            row = rows.UsageRow(fast.event_id, fast.values, fast.event_time, digest, SOURCE)
            with pg.transaction(force_rollback=True):
                assert store.usage.insert_usage_rows(pg, [row]) == []
        payload = envelope.data
        try:
            with pg.transaction(force_rollback=True):
                if isinstance(payload, CustomerUpserted):
                    store.usage.upsert_customer(pg, envelope.id, payload, SOURCE)
                elif isinstance(payload, UsageRecorded):
                    store.usage.insert_usage(pg, [rows.UsageRecord(envelope.id, payload, SOURCE)])
                elif isinstance(payload, UsageMetered):
                    store.metering.insert_metered(
                        pg, [rows.MeteredRecord(envelope.id, payload, SOURCE)]
                    )
                elif isinstance(
                    payload, SubscriptionStarted | SubscriptionChanged | SubscriptionEnded
                ):
                    store.metering.insert_subscriptions(
                        pg, [rows.SubscriptionRecord(envelope.id, payload, SOURCE)]
                    )
        except Exception as exc:  # property 2
            raise AssertionError(
                f"a record the contract accepts was refused by PostgreSQL "
                f"({classify(exc).reason}): {record.short()}"
            ) from exc

    check()
    print(
        f"fuzz(property): {EXAMPLES} examples, {len(accepted)} decoded by the codec, "
        f"{len(vouched)} of them by the fast path"
    )
