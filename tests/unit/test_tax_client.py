"""HttpTaxService against the real fake server (subprocess on a free port) and against
httpx.MockTransport: retries reuse the idempotency key, what is and is not retried,
the concurrency bound, the latency model, invalid answers, Redis down."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import REGISTRY
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams.adapters.tax.cache import RedisTaxCache
from streams.adapters.tax.client import HttpTaxService
from streams.core.billing.ports import TaxRejected, TaxUnavailable
from streams.core.domain.invoice import TaxedLine, TaxLine
from streams.devtools.stack.fake_tax import (
    FakeTaxConfig,
    FakeTaxProcess,
    RequestRecord,
    running_fake_tax,
)
from streams.settings import TaxSettings

DEFAULTS = FakeTaxConfig(base_latency_s=0.0, timeout_latency_s=5.0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeTaxProcess]:
    with running_fake_tax(tmp_path_factory.mktemp("fake_tax"), config=DEFAULTS) as proc:
        yield proc


@pytest.fixture(autouse=True)
def reset_server(request: pytest.FixtureRequest) -> None:
    if "server" in request.fixturenames:
        proc: FakeTaxProcess = request.getfixturevalue("server")
        proc.admin.configure(**DEFAULTS.model_dump(exclude={"seed"}))


def settings_for(url: str, **changes: Any) -> TaxSettings:
    values: dict[str, Any] = {
        "url": url,
        "max_attempts": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        "read_timeout_s": 3.0,
        "connect_timeout_s": 1.0,
    }
    values.update(changes)
    return TaxSettings(**values)


def new_key() -> str:
    return f"inv-{uuid.uuid4().hex}"


def lines(
    count: int = 1, region: str | None = "us-west-2", code: str | None = None
) -> list[TaxLine]:
    return [TaxLine(f"l{i}", Decimal(f"{i + 1}.50"), region, code) for i in range(count)]


def records(server: FakeTaxProcess, key: str) -> list[RequestRecord]:
    return server.admin.requests(key_prefix=f"{key}:")


def metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --------------------------------------------------------------------------- retries


def test_retries_after_503_reuse_the_idempotency_key(server: FakeTaxProcess) -> None:
    server.admin.configure(fail_next=2)
    key = new_key()
    retries_before = metric("invoicing_tax_retries_total")
    with HttpTaxService(settings_for(server.url)) as tax:
        got = tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(2))
    seen = records(server, key)
    assert [r.outcome for r in seen] == ["error", "error", "ok"]
    assert {r.idempotency_key for r in seen} == {f"{key}:0"}
    assert [t.tax for t in got] == [
        Decimal("1.50") * Decimal("0.065"),
        Decimal("2.50") * Decimal("0.065"),
    ]
    assert metric("invoicing_tax_retries_total") - retries_before == 2


def test_503_on_every_attempt_raises_unavailable(server: FakeTaxProcess) -> None:
    server.admin.configure(error_rate=1.0)
    key = new_key()
    with HttpTaxService(settings_for(server.url)) as tax, pytest.raises(TaxUnavailable) as caught:
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    assert caught.value.status == 503
    assert caught.value.attempts == 3
    assert caught.value.idempotency_key == f"{key}:0"
    assert [r.outcome for r in records(server, key)] == ["error"] * 3


def test_timeouts_are_retried_then_unavailable(server: FakeTaxProcess) -> None:
    server.admin.configure(timeout_rate=1.0, timeout_latency_s=5.0)
    key = new_key()
    started = time.monotonic()
    with (
        HttpTaxService(settings_for(server.url, read_timeout_s=0.3, max_attempts=2)) as tax,
        pytest.raises(TaxUnavailable) as caught,
    ):
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    assert time.monotonic() - started < 3.0  # gave up on the client side, not after 2 x 5 s
    assert caught.value.status is None
    assert isinstance(caught.value.__cause__, TaxUnavailable)
    assert isinstance(caught.value.__cause__.__cause__, httpx.ReadTimeout)
    seen = records(server, key)
    assert [r.outcome for r in seen] == ["timeout", "timeout"]
    assert {r.idempotency_key for r in seen} == {f"{key}:0"}


def test_retry_after_a_timeout_is_a_replay_not_a_second_tax(server: FakeTaxProcess) -> None:
    server.admin.configure(timeout_next=1, timeout_latency_s=5.0)
    key = new_key()
    with HttpTaxService(settings_for(server.url, read_timeout_s=0.3)) as tax:
        got = tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    seen = records(server, key)
    assert [r.outcome for r in seen] == ["timeout", "replay"]
    assert seen[0].document_id == seen[1].document_id
    assert got[0].tax == Decimal("1.50") * Decimal("0.065")


def test_connection_refused_is_retried_then_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with (
        HttpTaxService(settings_for(url, max_attempts=2)) as tax,
        pytest.raises(TaxUnavailable) as caught,
    ):
        tax.calculate(idempotency_key=new_key(), customer_id="c1", currency="USD", lines=lines())
    assert caught.value.attempts == 2
    assert isinstance(caught.value.__cause__, TaxUnavailable)
    assert isinstance(caught.value.__cause__.__cause__, httpx.ConnectError)


def test_unknown_tax_code_422_is_not_retried(server: FakeTaxProcess) -> None:
    key = new_key()
    with (
        HttpTaxService(settings_for(server.url)) as tax,
        pytest.raises(TaxRejected) as caught,
    ):
        tax.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=lines(code="NOPE")
        )
    assert caught.value.status == 422
    assert caught.value.attempts == 1
    assert "NOPE" in str(caught.value)
    assert [r.outcome for r in records(server, key)] == ["invalid"]


def test_conflict_409_is_not_retried(server: FakeTaxProcess) -> None:
    key = new_key()
    with HttpTaxService(settings_for(server.url)) as tax:
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(1))
        with pytest.raises(TaxRejected) as caught:
            tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(2))
    assert caught.value.status == 409
    assert [r.outcome for r in records(server, key)] == ["ok", "conflict"]


def test_413_when_the_service_allows_fewer_lines_is_not_retried(server: FakeTaxProcess) -> None:
    server.admin.configure(max_lines=5)
    key = new_key()
    with (
        HttpTaxService(settings_for(server.url)) as tax,
        pytest.raises(TaxRejected) as caught,
    ):
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(6))
    assert caught.value.status == 413
    assert [(r.outcome, r.status) for r in records(server, key)] == [("invalid", 413)]


def test_numeric_json_amount_is_refused_by_the_service(server: FakeTaxProcess) -> None:
    body = {
        "idempotency_key": new_key(),
        "customer_id": "c1",
        "currency": "USD",
        "commit": True,
        "lines": [{"line_id": "a", "amount": 1.5, "region_id": None, "tax_code": None}],
    }
    response = httpx.post(f"{server.url}/v1/documents", json=body, trust_env=False)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_amount"


# --------------------------------------------------------------------------- concurrency and latency


def max_overlap(seen: list[RequestRecord]) -> int:
    """Most requests the server held at once: [received, received + latency) intervals,
    shrunk by 20 ms so that back-to-back requests never count as overlapping."""
    events: list[tuple[float, int]] = []
    for record in seen:
        start = record.received_at.timestamp()
        events.append((start, 1))
        events.append((start + record.latency_s - 0.02, -1))
    events.sort()
    current = best = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


@pytest.mark.parametrize("bound", [2, 6])
def test_concurrency_is_bounded_across_threads(server: FakeTaxProcess, bound: int) -> None:
    server.admin.configure(base_latency_s=0.25)
    run = new_key()
    errors: list[BaseException] = []
    with HttpTaxService(settings_for(server.url, max_concurrency=bound)) as tax:

        def work(i: int) -> None:
            try:
                tax.calculate(
                    idempotency_key=f"{run}-{i}", customer_id=f"c{i}", currency="USD", lines=lines()
                )
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    seen = server.admin.requests(key_prefix=run)
    assert len(seen) == 6
    assert max_overlap(seen) == bound


def test_latency_is_base_plus_per_line(server: FakeTaxProcess) -> None:
    server.admin.configure(base_latency_s=0.3, per_line_latency_s=0.05)
    key = new_key()
    with HttpTaxService(settings_for(server.url)) as tax:
        tax.calculate(  # warm the connection
            idempotency_key=new_key(), customer_id="c1", currency="USD", lines=lines(1)
        )
        started = time.perf_counter()
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(3))
        elapsed = time.perf_counter() - started
    expected = 0.3 + 3 * 0.05
    # The client waited for the fake's answer (a lower bound: wall time only grows on a
    # loaded machine); one request, so the wait was not a retry's.
    assert elapsed >= expected
    (record,) = records(server, key)
    assert record.latency_s == pytest.approx(expected)


def test_a_held_request_is_answered_only_once_released(server: FakeTaxProcess) -> None:
    server.admin.configure(hold=True)
    key = new_key()
    answered = threading.Event()

    def call() -> None:
        with HttpTaxService(settings_for(server.url, read_timeout_s=30.0)) as tax:
            tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(1))
        answered.set()

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    deadline = time.monotonic() + 10
    while not records(server, key):  # received and recorded ...
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not answered.wait(1.0)  # ... and not answered while held
    server.admin.configure(hold=False)
    assert answered.wait(10.0)
    caller.join(5)
    assert len(records(server, key)) == 1  # one request, answered on release (no retry)


def test_latency_spike(server: FakeTaxProcess) -> None:
    server.admin.configure(spike_probability=1.0, spike_latency_s=0.4)
    key = new_key()
    with HttpTaxService(settings_for(server.url)) as tax:
        started = time.perf_counter()
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(1))
        elapsed = time.perf_counter() - started
    assert elapsed >= 0.4  # the spike was waited for (a lower bound, see above)
    (record,) = records(server, key)  # one request: no retry
    assert record.latency_s == pytest.approx(0.4)
    assert record.received_at.utcoffset() == timedelta(0)


# --------------------------------------------------------------------------- answers (MockTransport)


def good_answer(request: httpx.Request) -> dict[str, Any]:
    body = json.loads(request.content)
    return {
        "document_id": "doc_1",
        "idempotency_key": body["idempotency_key"],
        "lines": [
            {"line_id": ln["line_id"], "tax_code": "X-STD", "rate": "0.1", "tax": "0.15"}
            for ln in body["lines"]
        ],
    }


def mock_service(handler: Any, **changes: Any) -> tuple[HttpTaxService, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        response: httpx.Response = handler(request)
        return response

    client = httpx.Client(base_url="http://tax.test", transport=httpx.MockTransport(record))
    return HttpTaxService(settings_for("http://tax.test", **changes), client=client), seen


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda a: a["lines"].pop(), id="line-missing"),
        pytest.param(lambda a: a["lines"].append(dict(a["lines"][0])), id="line-twice"),
        pytest.param(lambda a: a["lines"][0].update(line_id="zz"), id="unknown-line"),
        pytest.param(lambda a: a["lines"][0].update(tax=0.15), id="tax-as-number"),
        pytest.param(lambda a: a["lines"][0].update(rate="NaN"), id="rate-nan"),
        pytest.param(lambda a: a["lines"][0].update(tax="abc"), id="tax-garbage"),
        pytest.param(lambda a: a.update(idempotency_key="other:0"), id="other-key"),
        pytest.param(lambda a: a.pop("lines"), id="no-lines"),
    ],
)
def test_invalid_answer_is_permanent_and_not_retried(corrupt: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        answer = good_answer(request)
        corrupt(answer)
        return httpx.Response(200, content=json.dumps(answer).encode())

    tax, seen = mock_service(handler)
    with pytest.raises(TaxRejected) as caught:
        tax.calculate(idempotency_key=new_key(), customer_id="c1", currency="USD", lines=lines(2))
    assert caught.value.status == 200
    assert len(seen) == 1


def test_non_json_answer_is_permanent() -> None:
    tax, seen = mock_service(lambda request: httpx.Response(200, content=b"<html>"))
    with pytest.raises(TaxRejected):
        tax.calculate(idempotency_key=new_key(), customer_id="c1", currency="USD", lines=lines())
    assert len(seen) == 1


def test_429_is_retried_after_retry_after() -> None:
    answers = iter(
        [httpx.Response(429, headers={"Retry-After": "0.04"}), httpx.Response(500), None]
    )
    waits: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        response = next(answers)
        return response if response is not None else httpx.Response(200, json=good_answer(request))

    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    client = httpx.Client(base_url="http://tax.test", transport=httpx.MockTransport(record))
    settings = settings_for("http://tax.test", backoff_initial_s=0.001, backoff_max_s=1.0)
    tax = HttpTaxService(settings, client=client, sleep=waits.append)
    got = tax.calculate(idempotency_key="inv-1", customer_id="c1", currency="USD", lines=lines())
    assert got == [TaxedLine("l0", "X-STD", Decimal("0.1"), Decimal("0.15"))]
    assert len(seen) == 3
    assert {r.headers["idempotency-key"] for r in seen} == {"inv-1:0"}
    assert {json.loads(r.content)["idempotency_key"] for r in seen} == {"inv-1:0"}
    assert waits[0] >= 0.04  # Retry-After honoured
    assert waits[1] < 0.04  # then our own (short) backoff


def test_backoff_grows_and_is_capped() -> None:
    waits: list[float] = []
    client = httpx.Client(
        base_url="http://tax.test", transport=httpx.MockTransport(lambda r: httpx.Response(503))
    )
    settings = settings_for(
        "http://tax.test", max_attempts=6, backoff_initial_s=0.1, backoff_max_s=0.5
    )
    tax = HttpTaxService(settings, client=client, sleep=waits.append)
    with pytest.raises(TaxUnavailable) as caught:
        tax.calculate(idempotency_key="inv-2", customer_id="c1", currency="USD", lines=lines())
    assert caught.value.attempts == 6
    assert len(waits) == 5
    assert 0.1 <= waits[0] <= 0.2  # 0.1 * 2**0 + jitter up to 0.1
    assert 0.2 <= waits[1] <= 0.3
    assert waits[3:] == [0.5, 0.5]  # capped


def test_amounts_are_sent_as_decimal_strings() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=good_answer(request))

    tax, _ = mock_service(handler)
    tax.calculate(
        idempotency_key="inv-3",
        customer_id="c1",
        currency="USD",
        lines=[TaxLine("a", Decimal("1E-12"), None, None)],
        commit=False,
    )
    assert bodies[0]["lines"][0]["amount"] == "0.000000000001"
    assert bodies[0]["commit"] is False


# --------------------------------------------------------------------------- Redis down


def test_redis_down_slows_down_but_stays_correct(server: FakeTaxProcess) -> None:
    dead = redis.Redis(
        host="127.0.0.1",
        port=free_port(),
        socket_connect_timeout=0.2,
        socket_timeout=0.2,
        retry=Retry(NoBackoff(), 0),
    )
    cache = RedisTaxCache(dead, ttl_s=60)
    errors_before = {
        op: metric("invoicing_tax_cache_errors_total", {"operation": op})
        for op in ("get_document", "put_document", "get_rates", "put_rates")
    }
    key = new_key()
    with HttpTaxService(settings_for(server.url), cache=cache) as tax:
        first = tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines(2))
        second = tax.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=lines(2)
        )
        quote = tax.calculate(
            idempotency_key=new_key(),
            customer_id="c1",
            currency="USD",
            lines=lines(2),
            commit=False,
        )
    assert first == second == quote
    assert first[1].tax == Decimal("2.50") * Decimal("0.065")
    # no cache: both commits reached the service, the second as a replay
    assert [r.outcome for r in records(server, key)] == ["ok", "replay"]
    for op, before in errors_before.items():
        assert metric("invoicing_tax_cache_errors_total", {"operation": op}) > before, op
    dead.close()


# --------------------------------------------------------------------------- metrics


def test_requests_are_counted_by_outcome(server: FakeTaxProcess) -> None:
    def count(outcome: str) -> float:
        return metric("invoicing_tax_requests_total", {"outcome": outcome})

    before = {o: count(o) for o in ("ok", "replay", "retryable_status")}
    server.admin.configure(fail_next=1)
    key = new_key()
    with HttpTaxService(settings_for(server.url)) as tax:
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
        tax.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    assert {o: count(o) - before[o] for o in before} == {
        "ok": 1,
        "replay": 1,
        "retryable_status": 1,
    }


# --------------------------------------------------------------------------- rates learned


def _quote(tax: HttpTaxService, key: str, doc: list[TaxLine]) -> list[TaxedLine]:
    return tax.calculate(
        idempotency_key=key, customer_id="c1", currency="USD", lines=doc, commit=False
    )


def test_quotes_from_learned_rates_equal_the_services_and_skip_the_call(
    server: FakeTaxProcess,
) -> None:
    """A quote whose every (region, tax code) this object has seen answered is computed
    locally, equal to what the service answers for it; a quote with a new region, and
    every committed document, still go to the service."""
    first, second, other_region, committed = new_key(), new_key(), new_key(), new_key()
    doc = [
        TaxLine("a", Decimal("12.34"), "us-west-2", None),
        TaxLine("b", Decimal("0.07"), "eu-west-1", None),
    ]
    later = [TaxLine("z", Decimal("1234.5678"), "eu-west-1", None), *doc]
    with (
        HttpTaxService(settings_for(server.url), quotes_from_learned_rates=True) as learned,
        HttpTaxService(settings_for(server.url)) as plain,
    ):
        _quote(learned, first, doc)
        local = _quote(learned, second, later)
        assert records(server, second) == []  # computed locally
        assert local == _quote(plain, new_key(), later)  # the service's answer
        _quote(learned, other_region, [TaxLine("c", Decimal("5"), "ap-south-1", None)])
        assert len(records(server, other_region)) == 1
        learned.calculate(idempotency_key=committed, customer_id="c1", currency="USD", lines=doc)
        assert [r.outcome for r in records(server, committed)] == ["ok"]


def test_rates_are_learned_per_client_object_so_a_new_run_sees_a_changed_rate(
    server: FakeTaxProcess,
) -> None:
    """The table lives in the object: a rate changed after it learned is not seen by it,
    and is seen by the next object (a replay makes one per run). Without the option a
    quote always asks the service."""
    doc = [TaxLine("a", Decimal("100"), "us-west-2", None)]
    with HttpTaxService(settings_for(server.url), quotes_from_learned_rates=True) as run1:
        before = _quote(run1, new_key(), doc)
        server.admin.configure(rate_overrides={"US-WA": "0.2"})
        assert _quote(run1, new_key(), doc) == before
    with HttpTaxService(settings_for(server.url), quotes_from_learned_rates=True) as run2:
        after = _quote(run2, new_key(), doc)
    assert after[0].rate == Decimal("0.2") and after[0].tax == Decimal("20.0")
    assert after != before
    with HttpTaxService(settings_for(server.url)) as plain:
        key = new_key()
        _quote(plain, key, doc)
        assert len(records(server, key)) == 1
