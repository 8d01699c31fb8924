"""The invoice job rates metered usage, against a real (own, migrated) PostgreSQL database.

What is checked here, on the kernel's stores and the real invoice job (the tax
service is the in-memory twin; Kafka is not involved):

1. a subscriber's metered events become an invoice of charge lines (metric,
   quantity, unit price or tiers, plan code and version), one tax line per
   invoice line, the subtotal the exact sum rounded once; its ``invoice.issued``
   carries the charges and the rating; a pure pass-through customer's event is
   what it always was (no ``charges``, no ``rating`` key);
2. a gap in the book or the data holds the invoice with the reason (never billed
   as zero), before any tax call, and a fixed book plus a release invoices it;
3. metered events are deduplicated by event id with canonical decimals
   (``"12.5"`` and ``"12.50"`` are one payload), another payload is a conflict;
4. how many metered events per second the invoice job rates (printed).
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from prometheus_client import REGISTRY
from psycopg_pool import ConnectionPool

from streams.adapters.memory.tax import InMemoryTaxService
from streams.apps.invoicing.jobs import JobContext, Outcome, run_invoice_job
from streams.apps.ops.holds import list_holds
from streams.core.billing import fencing, rows, store
from streams.core.domain.events import UsageMetered, UsageRecorded
from streams.core.domain.rating import load_price_book
from streams.core.domain.rating.published import entries_of
from streams.settings import PostgresSettings, Settings
from tests.support import rating as scenario
from tests.support.roles import migrated_database

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

TOPIC = "events"
PERIOD = scenario.PERIOD


@pytest.fixture
def database(settings: Settings, unique: str) -> Iterator[PostgresSettings]:
    """A fresh database of this test (created by the provisioner, owned by the owner),
    migrated to head with its grants."""
    with migrated_database(settings.postgres, f"inv_{unique}") as pg:
        yield pg


@pytest.fixture
def pool(database: PostgresSettings) -> Iterator[ConnectionPool[Any]]:
    """The owner's pool: the test's own writes (events as the worker stores them, the
    published book) and reads (the outbox)."""
    with ConnectionPool(
        database.dsn("owner"), min_size=1, max_size=4, kwargs={"autocommit": False}
    ) as p:
        yield p


@pytest.fixture
def worker_pool(database: PostgresSettings) -> Iterator[ConnectionPool[Any]]:
    """The invoicing worker's pool: the job runs under the worker's grants."""
    with ConnectionPool(
        database.dsn("worker"), min_size=1, max_size=4, kwargs={"autocommit": False}
    ) as p:
        yield p


class Partition:
    """Writes a customer's events as the worker does, at increasing offsets of partition 0."""

    def __init__(self, pool: ConnectionPool[Any]) -> None:
        self.pool = pool
        self.offset = 0

    def at(self) -> rows.SourceCoordinates:
        self.offset += 1
        return rows.SourceCoordinates(TOPIC, 0, self.offset)

    def customer(self, customer_id: str) -> None:
        with self.pool.connection() as conn, conn.transaction():
            store.usage.upsert_customer(
                conn, f"cu-{customer_id}", scenario.customer(customer_id), self.at()
            )

    def subscribe(self, customer_id: str, version: int = 1) -> None:
        with self.pool.connection() as conn, conn.transaction():
            store.metering.insert_subscriptions(
                conn,
                [
                    rows.SubscriptionRecord(
                        f"sub-{customer_id}-{version}",
                        scenario.started(customer_id, version),
                        self.at(),
                    )
                ],
            )

    def metered(
        self, customer_id: str, events: list[tuple[str, UsageMetered]]
    ) -> list[rows.RecordConflict]:
        with self.pool.connection() as conn, conn.transaction():
            return store.metering.insert_metered(
                conn, [rows.MeteredRecord(eid, data, self.at()) for eid, data in events]
            )

    def usage(self, customer_id: str, amounts: list[str]) -> None:
        with self.pool.connection() as conn, conn.transaction():
            store.usage.insert_usage(
                conn,
                [
                    rows.UsageRecord(
                        f"u-{customer_id}-{n}",
                        UsageRecorded(
                            customer_id=customer_id,
                            billing_period=PERIOD,
                            amount=Decimal(amount),
                            currency="USD",
                            description=f"line {n}",
                            event_time=scenario.utc(2),
                        ),
                        self.at(),
                    )
                    for n, amount in enumerate(amounts)
                ],
            )

    def marker(self, customer_id: str, reason: str = "period_closed") -> rows.CloseMarker:
        return rows.CloseMarker(
            f"close-{customer_id}-{self.offset}", customer_id, PERIOD, reason, self.at()
        )


def publish(pool: ConnectionPool[Any], text: str) -> None:
    book = load_price_book(text)
    with pool.connection() as conn, conn.transaction():
        published = {e.record_key() for e in store.pricing.published_entries(conn)}
        new = [
            e
            for e in entries_of(book, published_at=datetime(2024, 8, 1, tzinfo=UTC))
            if e.record_key() not in published
        ]
        store.pricing.insert_entries(conn, new, published_by="tests")


def job(
    pool: ConnectionPool[Any], unique: str
) -> tuple[JobContext, InMemoryTaxService, fencing.FencingToken]:
    token = fencing.FencingToken(f"g-{unique}", TOPIC, 0, 1, "member-1")
    with pool.connection() as conn:
        fencing.claim(conn, token)
    tax = InMemoryTaxService()
    return JobContext(pool=pool, tax=tax, invoices_topic="test.billing.invoices.v1"), tax, token


def outbox_payload(pool: ConnectionPool[Any], invoice_id: str) -> dict[str, Any]:
    with pool.connection() as conn:
        found = store.invoices.latest_outbox_event(conn, invoice_id)
    assert found is not None
    payload = found.payload if isinstance(found.payload, dict) else json.loads(found.payload)
    return dict(payload)


def test_a_subscriber_is_rated_taxed_and_issued_with_its_charge_lines(
    pool: ConnectionPool[Any], worker_pool: ConnectionPool[Any], unique: str
) -> None:
    publish(pool, scenario.book_text())
    ctx, tax, token = job(worker_pool, unique)
    part = Partition(pool)
    for who in ("metered", "focus"):
        part.customer(who)
    part.subscribe("metered")
    assert part.metered("metered", list(scenario.metered("metered"))) == []
    part.usage("focus", ["1.005", "2.50", "-0.50"])

    result = run_invoice_job(ctx, part.marker("metered"), token, threading.Event())
    assert result.outcome is Outcome.INVOICED, result.detail
    with pool.connection() as conn:
        issued = store.invoices.current_invoice(conn, "metered", PERIOD)
        assert issued is not None and issued.subtotal == scenario.SUBTOTAL_V1
        charges = conn.execute(
            "SELECT charge_code, metric, quantity, unit_price, amount, plan_code, plan_version, "
            "detail FROM invoice_charges WHERE invoice_id = %s ORDER BY line_no",
            (issued.invoice_id,),
        ).fetchall()
        line_count = conn.execute(
            "SELECT line_count, rating->>'exact_total' FROM invoices WHERE invoice_id = %s",
            (issued.invoice_id,),
        ).fetchone()
    assert [(c[0], c[1], c[2], c[3], c[4], c[5], c[6]) for c in charges] == [
        ("platform", None, None, None, Decimal("30"), "pro", 1),
        ("api", "api_calls", Decimal("350"), None, Decimal("12.50"), "pro", 1),
        ("storage", "storage_gb", Decimal("12.5"), Decimal("0.25"), Decimal("3.125"), "pro", 1),
    ]
    tiers = charges[1][7]["tiers"]
    assert [(t["tier"], t["units"], t["unit_price"], t["amount"]) for t in tiers] == [
        (1, "100", "0", "0"),
        (2, "250", "0.05", "12.50"),
    ]
    assert line_count == (3, str(scenario.EXACT_V1))
    # One tax line per invoice line, under the charges' deterministic line ids.
    assert [(c.outcome, c.line_count) for c in tax.calls] == [("ok", 3)]

    event = outbox_payload(pool, issued.invoice_id)
    assert event["subtotal"] == "45.62" and event["line_count"] == 3
    assert [c["charge_code"] for c in event["charges"]] == ["platform", "api", "storage"]
    assert event["charges"][1]["tiers"][1]["unit_price"] == "0.05"
    assert event["rating"]["exact_total"] == "45.625"
    assert event["rating"]["metered_events"] == 352
    assert event["rating"]["segments"] == [
        {
            "plan_code": "pro",
            "plan_version": 1,
            "days": [{"first": "2024-09-01", "last": "2024-09-30"}],
            "day_count": 30,
            "days_in_period": 30,
        }
    ]

    # A pure pass-through customer: its invoice and event are what they were before rating.
    plain = run_invoice_job(ctx, part.marker("focus"), token, threading.Event())
    assert plain.outcome is Outcome.INVOICED, plain.detail
    with pool.connection() as conn:
        focus = store.invoices.current_invoice(conn, "focus", PERIOD)
        assert focus is not None and focus.subtotal == Decimal("3.00")  # 3.005 half-even
        assert conn.execute(
            "SELECT count(*), (SELECT rating FROM invoices WHERE invoice_id = %s) "
            "FROM invoice_charges WHERE invoice_id = %s",
            (focus.invoice_id, focus.invoice_id),
        ).fetchone() == (0, None)
    event = outbox_payload(pool, focus.invoice_id)
    assert "charges" not in event and "rating" not in event
    assert event["line_count"] == 3 and event["subtotal"] == "3.00"


def test_gaps_in_the_book_hold_the_invoice_with_the_reason_never_billed_as_zero(
    pool: ConnectionPool[Any], worker_pool: ConnectionPool[Any], unique: str
) -> None:
    publish(pool, scenario.book_text())
    ctx, tax, token = job(worker_pool, unique)
    part = Partition(pool)
    for who in ("nosub", "unknown", "unpriced"):
        part.customer(who)
    # Metered usage, no subscription at all.
    part.metered("nosub", list(scenario.metered("nosub"))[:5])
    # A subscription to a version the book does not have (yet).
    part.subscribe("unknown", version=2)
    part.metered("unknown", list(scenario.metered("unknown"))[:5])
    # Usage of a metric the book does not define.
    part.subscribe("unpriced")
    part.metered(
        "unpriced",
        [
            (
                "gpu-1",
                UsageMetered(
                    customer_id="unpriced", metric="gpu_hours", event_time=scenario.utc(4)
                ),
            )
        ],
    )

    expected = {
        "nosub": "no_subscription: 5 metered event(s) on 1 day(s) without a subscription",
        "unknown": "unknown_plan: the subscription on 2024-09-01..2024-09-30 names version 2 of "
        "plan 'pro'",
        "unpriced": "unknown_metric: 1 event(s) of metric 'gpu_hours'",
    }
    markers = {who: part.marker(who) for who in expected}
    for who, marker in markers.items():
        result = run_invoice_job(ctx, marker, token, threading.Event())
        assert result.outcome is Outcome.HELD, (who, result.detail)
        assert expected[who] in result.detail
    assert tax.calls == []  # held before any tax document was committed
    with pool.connection() as conn:
        holds = {h.customer_id: h for h in list_holds(conn)}
        closes = conn.execute(
            "SELECT customer_id, outcome FROM period_closes ORDER BY 1"
        ).fetchall()
        invoices = conn.execute("SELECT count(*) FROM invoices").fetchone()
    assert sorted(holds) == sorted(expected)
    for who, text in expected.items():
        assert holds[who].reason.startswith("rating: ") and text in holds[who].reason
        assert holds[who].held_closes == 1
    assert closes == [(who, "held") for who in sorted(expected)]
    assert invoices == (0,)
    # A redelivered marker holds once (one hold per source record and customer).
    again = run_invoice_job(ctx, markers["unknown"], token, threading.Event())
    assert again.outcome is Outcome.HELD
    with pool.connection() as conn:
        assert len(list_holds(conn)) == 3

    # The fix: publish version 2, release the hold; the new marker invoices.
    publish(pool, scenario.book_text(with_v2=True))
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            "UPDATE invoice_holds SET released_at = now(), released_by = 'tests' "
            "WHERE customer_id = 'unknown'"
        )
    released = run_invoice_job(
        ctx, part.marker("unknown", "hold_released"), token, threading.Event()
    )
    assert released.outcome is Outcome.INVOICED, released.detail
    with pool.connection() as conn:
        issued = store.invoices.current_invoice(conn, "unknown", PERIOD)
    # v2 all month: the 45.00 fee; its 5 calls are in the free tier, no storage used.
    assert issued is not None and issued.subtotal == Decimal("45.00")


def test_metered_events_deduplicate_by_id_with_canonical_decimals(
    pool: ConnectionPool[Any],
) -> None:
    part = Partition(pool)

    def storage(gb: str) -> UsageMetered:
        return UsageMetered(
            customer_id="c",
            metric="storage_gb",
            event_time=scenario.utc(3),
            values={"gb": Decimal(gb)},
        )

    assert part.metered("c", [("m-1", storage("12.5"))]) == []
    assert part.metered("c", [("m-1", storage("12.50")), ("m-1", storage("1.25E+1"))]) == []
    [conflict] = part.metered("c", [("m-1", storage("12.6"))])
    assert conflict.record.event_id == "m-1" and conflict.billing_period == PERIOD
    assert conflict.stored_source.offset == 1
    with pool.connection() as conn:
        stored = conn.execute("SELECT decimals, billing_period FROM metered_usage").fetchall()
    assert stored == [({"gb": "12.5"}, PERIOD)]


def _copy_metered(
    pool: ConnectionPool[Any], customer_id: str, count: int, first_offset: int
) -> None:
    """``count`` api_calls events (COPY: the fast way to load a big month)."""
    buffer = io.StringIO()
    for n in range(count):
        day = 1 + n % 30
        buffer.write(
            f"{customer_id}-bulk-{n}\t{customer_id}\t{PERIOD}\tapi_calls\t"
            f"2024-09-{day:02d}T{n % 24:02d}:00:00Z\t{{}}\t{{}}\tsha-{n}\t{TOPIC}\t0\t{first_offset + n}\n"
        )
    with (
        pool.connection() as conn,
        conn.transaction(),
        conn.cursor() as cur,
        cur.copy(
            "COPY metered_usage (event_id, customer_id, billing_period, metric, event_time, "
            "properties, decimals, payload_sha256, source_topic, source_partition, source_offset) "
            "FROM STDIN"
        ) as copy,
    ):
        copy.write(buffer.getvalue())


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_events_rated_per_second_inside_the_invoice_job(
    pool: ConnectionPool[Any], worker_pool: ConnectionPool[Any], unique: str
) -> None:
    """A customer with N metered events (``RATING_EVENTS``, default 50,000): the time of
    the job's rating step (aggregation, segments, rate(), pricing) and of the whole job."""
    events = int(os.environ.get("RATING_EVENTS", "50000"))
    publish(pool, scenario.book_text())
    ctx, _tax, token = job(worker_pool, unique)
    part = Partition(pool)
    part.customer("big")
    part.subscribe("big")
    _copy_metered(pool, "big", events, first_offset=100)
    part.offset = 100 + events
    before = (_sample("invoicing_rating_seconds_sum"), _sample("invoicing_rating_seconds_count"))
    started = time.perf_counter()
    result = run_invoice_job(ctx, part.marker("big"), token, threading.Event())
    elapsed = time.perf_counter() - started
    assert result.outcome is Outcome.INVOICED, result.detail
    rating_s = _sample("invoicing_rating_seconds_sum") - before[0]
    assert _sample("invoicing_rating_seconds_count") - before[1] == 1
    with pool.connection() as conn:
        issued = store.invoices.current_invoice(conn, "big", PERIOD)
    # 30 + graduated: 100 free, 900 x 0.05 = 45, the rest at 0.01.
    calls = Decimal(events)
    expected = Decimal(30) + min(max(calls - 100, Decimal(0)), Decimal(900)) * Decimal("0.05")
    expected += max(calls - 1000, Decimal(0)) * Decimal("0.01")
    assert issued is not None and issued.subtotal == expected.quantize(Decimal("0.01"))
    print(
        f"\nrating inside the invoice job: {events:,} metered events, rating step "
        f"{rating_s:.3f}s ({events / rating_s:,.0f} events/s); whole job (read, rate, tax, "
        f"write) {elapsed:.3f}s ({events / elapsed:,.0f} events/s)"
    )
