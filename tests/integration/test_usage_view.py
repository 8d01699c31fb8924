"""The usage view on the real stack (docs/usage-api.md): agreement with the issued invoices, routing
across two instances, failover, recovery from the changelog, poison records.

Each test runs in its own sandbox (topics, groups, database); the view instances are
separate processes (``invoicing worker usage-view --port N``) whose consumer group
and changelog topics live under the sandbox's topic prefix.
"""

from __future__ import annotations

import functools
import random
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import Producer

from streams.apps.ops.focus_expected import expected_from_file
from streams.apps.usage_view.access import HOP_HEADER
from streams.bootstrap import producer, run_close_period, run_import_events, run_import_focus
from streams.core.domain.codec import encode
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded
from streams.devtools.demo.pricing.generator import PROFILES, generate
from streams.devtools.demo.pricing.generator import ScenarioConfig as PricingConfig
from streams.devtools.demo.pricing.run import publish_with_cli
from streams.settings import Settings
from tests.support.kafka import wait_for_no_lag
from tests.support.pipeline import Pipeline, isolated_pipeline
from tests.support.usage_view import (
    get_usage,
    start_view,
    usage_ok,
    view_env,
    view_key,
    wait_assigned,
    wait_until,
)

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
BOOK = Path(__file__).resolve().parents[2] / "examples" / "pricing" / "price-book.yaml"


@pytest.fixture
def pipeline(settings: Settings, unique: str, tmp_path: Path) -> Iterator[Pipeline]:
    """No connector or SMTP sink: the view reads account events, and no test here needs an
    invoice event or an email."""
    with isolated_pipeline(settings, unique, tmp_path, connector=False, smtp=False) as p:
        yield p


@dataclass(frozen=True)
class Scenario:
    """A demo whose events the test feeds to the pipeline, and the (customer, period)
    pairs it invoices."""

    name: str
    load: Callable[[Pipeline], tuple[list[tuple[str, str]], list[str]]]
    price_book: str | None = None


def _load_focus(p: Pipeline) -> tuple[list[tuple[str, str]], list[str]]:
    summary = run_import_focus(SAMPLE, p.settings, progress=False)
    assert summary.produced == 1000 and not summary.skipped
    expected = expected_from_file(SAMPLE)
    return sorted(expected.sums), expected.periods


def _load_pricing(p: Pipeline) -> tuple[list[tuple[str, str]], list[str]]:
    """The pricing demo's month (every profile: metered usage, subscriptions changing
    plan mid-period, pass-through re-billing, resent duplicates) under the published
    example book (``invoicing plans publish``, the operator's command, as a process)."""
    config = PricingConfig(customers=len(PROFILES), seed=3)
    scenario = generate(config)
    events_file = p.workdir / "pricing.jsonl"
    scenario.write(events_file)
    publish_with_cli(BOOK, p.env)
    summary = run_import_events(events_file, p.settings, progress=False)
    assert summary.ok and not summary.skipped
    return sorted((c.customer_id, config.period) for c in scenario.customers), [config.period]


SCENARIOS = [Scenario("focus", _load_focus), Scenario("pricing", _load_pricing)]


def invoices(p: Pipeline) -> dict[tuple[str, str], tuple[Decimal, int]]:
    with p.connect() as conn:
        rows = conn.execute(
            "SELECT customer_id, billing_period, subtotal, line_count FROM invoices WHERE status = 'issued'"
        ).fetchall()
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_view_agrees_with_invoices_across_two_instances_and_after_failover(
    pipeline: Pipeline, scenario: Scenario
) -> None:
    p = pipeline
    pairs, periods = scenario.load(p)
    (_, port_a), (view_b, port_b) = start_view(p), start_view(p)
    owned = wait_assigned(p, [port_a, port_b])
    p.workers.start("invoicing", 2)

    # Every customer answers on both instances, the same answer (one routed to the owner).
    customers = sorted({c for c, _ in pairs})
    served: dict[str, str] = {}

    def same_on_both(customer: str, period: str) -> dict[str, Any] | None:
        a, b = usage_ok(port_a, customer, period), usage_ok(port_b, customer, period)
        return a if a is not None and a == b else None

    for customer, period in pairs:
        a = wait_until(
            f"{customer} {period} alike on A and B",
            functools.partial(same_on_both, customer, period),
            p,
        )
        served[customer] = a["served_by"]
        assert a["upcoming_invoice"]["provisional"] is True
    assert {f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"} == set(served.values()), (
        owned
    )

    for period in periods:
        run_close_period(period, p.settings, progress=False)
    issued = wait_until(
        "every invoice issued",
        lambda: (lambda got: got if len(got) == len(pairs) else None)(invoices(p)),
        p,
        180,
    )

    def agreed(port: int) -> dict[tuple[str, str], str] | None:
        answers = {}
        for customer, period in pairs:
            body = usage_ok(port, customer, period)
            if body is None or body["closed"] is None:
                return None
            answers[(customer, period)] = body["upcoming_invoice"]["subtotal"]
        return answers

    after_close = wait_until(
        "the close seen by the view", lambda: agreed(random.choice([port_a, port_b])), p
    )
    assert after_close == {key: str(subtotal) for key, (subtotal, _) in issued.items()}
    for customer, period in pairs[:5]:
        body = usage_ok(port_a, customer, period)
        assert (
            body is not None
            and body["upcoming_invoice"]["line_count"] == issued[(customer, period)][1]
        )

    # Kill B: A owns every partition after the rebalance, recovers B's tables from the
    # changelog, and answers for every customer with the same subtotals.
    view_b.process.send_signal(signal.SIGKILL)
    view_b.process.wait(10)
    wait_assigned(p, [port_a], timeout_s=120)
    after_failover = wait_until("every customer on A after B died", lambda: agreed(port_a), p, 120)
    assert after_failover == after_close
    assert len(customers) == len({c for c, _ in after_failover})


def _record(envelope: Envelope) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    rec = encode(envelope)
    return rec.key, rec.value, rec.headers


def _produce(
    prod: Producer, topic: str, *records: tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
) -> None:
    for key, value, headers in records:
        prod.produce(topic, key=key, value=value, headers=headers)  # type: ignore[arg-type]
    assert prod.flush(30) == 0


def _usage(customer: str, event_id: str, amount: str, at: datetime | None = None) -> Envelope:
    """Usage of 2024-09, or of ``at``'s month at ``at``."""
    return Envelope.wrap(
        UsageRecorded(
            customer_id=customer,
            billing_period="2024-09" if at is None else f"{at:%Y-%m}",
            amount=Decimal(amount),
            currency="USD",
            event_time="2024-09-05T10:00:00Z" if at is None else at,
        ),
        id=event_id,
        source="test",
    )


def _customer(customer: str) -> Envelope:
    return Envelope.wrap(
        CustomerUpserted(
            customer_id=customer, name=customer, email=f"{customer}@example.com", currency="USD"
        ),
        id=f"cust-{customer}",
        source="test",
    )


def three_lines(port: int, customer: str) -> dict[str, Any] | None:
    body = usage_ok(port, customer, "2024-09")
    return body if body and body["usage"]["pass_through"]["lines"] == 3 else None


def test_view_recovers_its_tables_from_the_changelog_after_a_restart(pipeline: Pipeline) -> None:
    p = pipeline
    prod = producer(p.settings)
    customers = [f"c{i}" for i in range(8)] + ["/subscriptions/0000-x"]
    records = [_record(_customer(c)) for c in customers]
    for i, c in enumerate(customers):
        records += [_record(_usage(c, f"u-{c}-{n}", f"{i}.{n}5")) for n in range(3)]
    records.append(_record(_usage(customers[0], f"u-{customers[0]}-0", "0.05")))  # exact duplicate
    _produce(prod, p.topic, *records)

    view, port = start_view(p, store="memory")
    wait_assigned(p, [port])
    before = {c: wait_until(c, functools.partial(three_lines, port, c), p) for c in customers}
    assert before[customers[0]]["usage"]["pass_through"] == {"lines": 3, "amounts": {"USD": "0.45"}}
    # The view commits its source offsets after flushing its changelogs: once its group has
    # no lag, a restart reads its state from the changelog only (asserted below).
    wait_for_no_lag(p.settings.kafka, view_env(p)["INVOICING_VIEW__GROUP"], p.topic)
    view.process.send_signal(signal.SIGTERM)
    assert view.process.wait(60) == 0, p.worker_logs()

    view, port = start_view(p, port=port, store="memory")
    wait_assigned(p, [port])
    after = {c: wait_until(c, functools.partial(three_lines, port, c), p) for c in customers}
    for c in customers:
        assert after[c]["usage"] == before[c]["usage"], c
        assert after[c]["upcoming_invoice"]["subtotal"] == before[c]["upcoming_invoice"]["subtotal"]
    # The restarted instance read its state from the changelog, not the source again:
    metrics = get_usage(port, customers[0], "2024-09")  # warm
    assert metrics.status_code == 200
    assert _metric(port, "invoicing_usage_view_records_total", 'outcome="applied"') == 0


def test_a_poison_record_on_the_topic_never_stops_the_view(pipeline: Pipeline) -> None:
    p = pipeline
    prod = producer(p.settings)
    good = _usage("acme", "u-1", "1.50")
    key, value, headers = _record(good)
    _produce(
        prod,
        p.topic,
        _record(_customer("acme")),
        (b"acme", b"{not json", headers),  # poison for acme
        (None, b"no key at all", []),  # poison without a customer
        (
            b"acme",
            value.replace(b'"1.50"', b'"one"'),
            [(k, v) for k, v in headers if k != "ce_id"] + [("ce_id", b"u-bad")],
        ),
        (key, value, headers),
    )
    view, port = start_view(p, store="memory")
    wait_assigned(p, [port])
    body = wait_until(
        "the good record after the poison",
        lambda: (lambda b: b if b and b["usage"]["pass_through"]["lines"] == 1 else None)(
            usage_ok(port, "acme", "2024-09")
        ),
        p,
    )
    assert body["upcoming_invoice"]["subtotal"] is None  # the workers would hold it
    assert body["upcoming_invoice"]["rounded_total"] == "1.50"
    codes = [h["code"] for h in body["upcoming_invoice"]["holds"]]
    assert codes == ["refused_records"], codes
    assert "2 record(s)" in body["upcoming_invoice"]["holds"][0]["message"]
    assert view.process.poll() is None
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    refused = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("invoicing_usage_view_records_total{") and 'outcome="refused"' in line
    )
    assert refused == 3


def test_bad_period_unknown_customer_and_percent_encoded_ids(pipeline: Pipeline) -> None:
    p = pipeline
    _produce(
        producer(p.settings),
        p.topic,
        _record(_customer("/subscriptions/a/b")),
        _record(_usage("/subscriptions/a/b", "u-x", "2")),
    )
    _, port = start_view(p, store="memory")
    wait_assigned(p, [port])
    body = wait_until("slashed id", lambda: usage_ok(port, "/subscriptions/a/b", "2024-09"), p)
    assert (
        body["customer_id"] == "/subscriptions/a/b"
        and body["upcoming_invoice"]["subtotal"] == "2.00"
    )
    bad = get_usage(port, "/subscriptions/a/b", "2024-13")
    assert bad.status_code == 400 and bad.headers["content-type"].startswith(
        "application/problem+json"
    )
    assert bad.json()["status"] == 400
    unknown = get_usage(port, "nobody", "2024-09")
    assert unknown.status_code == 404 and unknown.json()["title"] == "Unknown customer"
    empty = get_usage(port, "/subscriptions/a/b", "2024-10")
    assert empty.status_code == 200 and empty.json()["upcoming_invoice"]["subtotal"] == "0.00"


def test_the_api_needs_a_read_key_and_forwards_one_hop_within_the_group(
    pipeline: Pipeline,
) -> None:
    """On the real group: faust's /table and /router are 404; 401 without a key, 403 for an
    ingest key; a customer the other instance owns is answered through this one (one hop),
    and a request that already made its hop is refused 508 by a non-owner."""
    p = pipeline
    customers = [f"k{i}" for i in range(12)]
    _produce(producer(p.settings), p.topic, *(_record(_customer(c)) for c in customers))
    (_, port_a), (_, port_b) = start_view(p, store="memory"), start_view(p, store="memory")
    wait_assigned(p, [port_a, port_b])
    served = {
        c: wait_until(c, functools.partial(usage_ok, port_a, c, "2024-09"), p) for c in customers
    }
    remote = [c for c, body in served.items() if body["served_by"] != f"http://127.0.0.1:{port_a}"]
    assert remote, f"every customer is on {port_a}: {served}"  # 12 ids over 2 instances
    customer = remote[0]
    assert served[customer]["served_by"] == f"http://127.0.0.1:{port_b}"
    reader = {"Authorization": f"Bearer {view_key(p)}"}
    # the hop header makes the receiving instance answer itself or refuse
    looped = get_usage(port_a, customer, "2024-09", headers={**reader, HOP_HEADER: "1"})
    assert looped.status_code == 508, looped.text
    assert looped.headers["content-type"].startswith("application/problem+json")
    owned = get_usage(port_b, customer, "2024-09", headers={**reader, HOP_HEADER: "1"})
    assert owned.status_code == 200 and owned.json()["served_by"].endswith(f":{port_b}")
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer ik_00000000.wrong"}, 401),
        ({"Authorization": f"Bearer {view_key(p, 'ingest')}"}, 403),
    ):
        refused = get_usage(port_a, customer, "2024-09", headers=headers)
        assert refused.status_code == status, (headers, refused.text)
        assert refused.json()["status"] == status
    unknown = get_usage(port_a, "nobody-at-all", "2024-09", headers=reader)
    assert unknown.status_code == 404 and unknown.json()["title"] == "Unknown customer"
    for path in ("/table/", "/table/customers/", f"/table/customers/{customer}/", "/router/"):
        assert httpx.get(f"http://127.0.0.1:{port_a}{path}", timeout=5).status_code == 404, path


def _metric(port: int, name: str, label: str) -> float:
    """The sum of ``name``'s samples with ``label`` on the instance's ``/metrics``."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(f"{name}{{") and label in line
    )


def test_retention_on_the_rocksdb_store_drops_old_periods_and_the_view_keeps_serving(
    pipeline: Pipeline,
) -> None:
    """The retention runs from a timer, where no event is being processed; on the RocksDB
    store (production's) a table write then has no partition to go to unless the view
    names it. Periods past retention are dropped, the customer's list of periods with
    them, the current period is kept, and a new instance that rebuilds from the
    changelog into an empty store does not bring the dropped period back."""
    p = pipeline
    prod = producer(p.settings)
    now = datetime.now(UTC)
    current = f"{now:%Y-%m}"
    customers = [f"ret{i}" for i in range(4)]
    records = [_record(_customer(c)) for c in customers]
    for c in customers:
        records += [_record(_usage(c, f"old-{c}-{n}", "1.25")) for n in range(2)]
        records.append(_record(_usage(c, f"now-{c}", "2.50", now)))
    _produce(prod, p.topic, *records)
    retention = {"INVOICING_VIEW__RETAIN_OPEN_DAYS": "0", "INVOICING_VIEW__CLEANUP_INTERVAL_S": "1"}

    def dropped(port: int) -> bool:
        try:
            expired = _metric(port, "invoicing_usage_view_expired_total", 'table="periods"')
        except httpx.HTTPError:  # not answering (yet, or died: wait_until says which)
            return False
        return expired >= len(customers)

    def current_period(port: int, c: str) -> dict[str, Any] | None:
        body = usage_ok(port, c, current)
        return body if body and body["usage"]["pass_through"]["lines"] == 1 else None

    view, port = start_view(p, store="rocksdb", settings=retention)
    wait_assigned(p, [port])
    wait_until("the old periods dropped", lambda: dropped(port), p)
    for c in customers:
        body = wait_until(c, functools.partial(current_period, port, c), p)
        assert body["upcoming_invoice"]["subtotal"] == "2.50", body
        old = usage_ok(port, c, "2024-09")
        assert old is not None and old["usage"]["pass_through"]["lines"] == 0, old
    assert view.process.poll() is None, p.worker_logs()
    wait_for_no_lag(p.settings.kafka, view_env(p)["INVOICING_VIEW__GROUP"], p.topic)
    view.process.send_signal(signal.SIGTERM)
    assert view.process.wait(60) == 0, p.worker_logs()

    # an empty local store, rebuilt from the changelog only; no retention this time
    shutil.rmtree(p.workdir / "view-data")
    view, port = start_view(p, store="rocksdb")
    wait_assigned(p, [port])
    for c in customers:
        wait_until(c, functools.partial(current_period, port, c), p)
        old = usage_ok(port, c, "2024-09")
        assert old is not None and old["usage"]["pass_through"]["lines"] == 0, old
    assert _metric(port, "invoicing_usage_view_records_total", 'outcome="applied"') == 0
