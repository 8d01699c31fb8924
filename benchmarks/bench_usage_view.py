"""Benchmarks of the usage view and the HTTP ingest edge (docs/benchmarks.md). Prints figures;
asserts nothing.

Runs in a sandbox on the local stack, which must be up (``invoicing stack up``); the
view instances and the edge are separate processes, as deployed.

* ``ingest`` — the same N ``usage.recorded`` events produced by a bare producer
  (the project's producer configuration, one ``produce`` per event, one flush) and
  posted to the edge in batches (``application/cloudevents-batch+json``, C
  concurrent clients): events/s of each, and their ratio (the issue asks ≥ 0.5).
* ``freshness`` — an event produced → visible in the view's answer (polled over
  HTTP every 10 ms: a tighter poll takes the CPU the view needs), p50 and p99, idle and while the edge ingests a steady load.
* ``memory`` — RSS of one view instance (``/proc/PID/status`` VmRSS) holding the
  FOCUS demo, then a large scenario (``--customers``, ``--lines``, metered events),
  with the rate it consumed at; ``--store memory|rocksdb`` (both; ``freshness`` defaults
  to ``memory``, ``memory`` to ``rocksdb``).

    .venv/bin/python -m benchmarks.bench_usage_view ingest --events 20000
    .venv/bin/python -m benchmarks.bench_usage_view freshness --samples 200
    .venv/bin/python -m benchmarks.bench_usage_view memory --store rocksdb --customers 2000 --lines 100

A standalone script (the harness of branch ``bench`` can wrap it as a scenario later).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx

from streams.apps.usage_view.app import usage_path
from streams.apps.usage_view.scenario import ScenarioConfig, events
from streams.bootstrap import api_key_store, producer, run_import_focus
from streams.core.domain.codec import encode
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded
from streams.devtools.sandbox.pipeline import Pipeline, isolated_pipeline
from streams.devtools.sandbox.smtp import free_port
from streams.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "focus" / "focus_sample.csv"


def _cloudevent(envelope: Envelope) -> dict[str, Any]:
    data = envelope.data
    return {
        "specversion": "1.0",
        "id": envelope.id,
        "source": envelope.source,
        "type": envelope.type,
        "subject": envelope.subject,
        "time": envelope.time.isoformat().replace("+00:00", "Z"),
        "data": data.model_dump(mode="json"),
    }


def _usage_events(run: str, count: int, customers: int = 200) -> Iterator[Envelope]:
    for n in range(count):
        customer = f"{run}-c{n % customers}"
        yield Envelope.wrap(
            UsageRecorded(
                customer_id=customer,
                billing_period="2024-09",
                amount=Decimal("0.0123") * (n % 17 + 1),
                currency="USD",
                event_time=datetime(2024, 9, 1 + n % 28, 12, tzinfo=UTC),
                description="bench",
            ),
            id=f"{run}-{n}",
            source="/bench",
        )


def _wait(what: str, probe: Any, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def _health(port: int) -> dict[str, Any] | None:
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _start_edge(p: Pipeline, workdir: Path, processes: int = 1) -> tuple[str, str]:
    keys = workdir / "api-keys.json"
    ingest = p.settings.ingest.model_copy(update={"api_keys_file": keys})
    _, token = api_key_store(p.settings.model_copy(update={"ingest": ingest})).create(
        "bench",
        rate_limit="1000000/second",  # measure the edge, not its rate limit
    )
    port = free_port()
    p.workers.start(
        "ingest",
        extra_env={"INVOICING_INGEST__API_KEYS_FILE": str(keys)},
        args=["--port", str(port)],
    )
    _wait("the edge", lambda: _health(port))
    return f"http://127.0.0.1:{port}", token


def _view_read_key(p: Pipeline) -> str:
    """A ``usage:read`` key in the view's key file (the view re-reads it on change)."""
    ingest = p.settings.ingest.model_copy(update={"api_keys_file": p.workdir / "view-keys.json"})
    store = api_key_store(p.settings.model_copy(update={"ingest": ingest}))
    return store.create("bench-reader", scopes=("usage:read",))[1]


def _start_view(p: Pipeline, store: str, price_book: str | None = None) -> tuple[int, int]:
    port = free_port()
    env = {
        "INVOICING_VIEW__GROUP": f"{p.settings.kafka.topic_prefix}usage-view",
        "INVOICING_VIEW__STORE": store,
        "INVOICING_VIEW__DATA_DIR": str(p.workdir / "view-data"),
        "INVOICING_INGEST__API_KEYS_FILE": str(p.workdir / "view-keys.json"),
    }
    if price_book:
        env["INVOICING_VIEW__PRICE_BOOK"] = price_book
    (proc,) = p.workers.start("usage-view", extra_env=env, args=["--port", str(port)])
    _wait(
        "the view's partitions", lambda: (_health(port) or {}).get("partitions") == list(range(12))
    )
    return port, proc.process.pid


async def _post_batches(url: str, token: str, batches: list[bytes], concurrency: int) -> int:
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/cloudevents-batch+json",
    }
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in batches:
        queue.put_nowait(body)
    accepted = 0

    async def client() -> None:
        nonlocal accepted
        async with httpx.AsyncClient(timeout=60) as http:
            while not queue.empty():
                body = queue.get_nowait()
                response = await http.post(f"{url}/v1/events", content=body, headers=headers)
                if response.status_code != 200:
                    raise SystemExit(f"edge answered {response.status_code}: {response.text[:300]}")
                accepted += int(response.json()["accepted"])

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return accepted


def bench_ingest(p: Pipeline, workdir: Path, args: argparse.Namespace) -> None:
    url, token = _start_edge(p, workdir, args.edges)
    time.sleep(2)  # every edge process listening
    run = uuid.uuid4().hex[:6]
    prod = producer(p.settings)

    def produce_all(records: Iterator[Any]) -> None:
        for rec in records:
            while True:
                try:
                    prod.produce(p.topic, key=rec.key, value=rec.value, headers=rec.headers)
                    break
                except BufferError:
                    prod.poll(0.01)
            prod.poll(0)
        assert prod.flush(60) == 0

    # bare producer 1: records encoded beforehand (librdkafka's rate, the physical bound)
    records = [encode(e) for e in _usage_events(f"{run}p", args.events)]
    t0 = time.perf_counter()
    produce_all(iter(records))
    bare = args.events / (time.perf_counter() - t0)
    # bare producer 2: from the event models, encoding each (what the importer does)
    envelopes = list(_usage_events(f"{run}q", args.events))
    t0 = time.perf_counter()
    produce_all(encode(e) for e in envelopes)
    bare_encoding = args.events / (time.perf_counter() - t0)
    # the edge: the same number of events (other ids), in batches
    evs = [_cloudevent(e) for e in _usage_events(f"{run}e", args.events)]
    batches = [json.dumps(evs[i : i + args.batch]).encode() for i in range(0, len(evs), args.batch)]
    t0 = time.perf_counter()
    accepted = asyncio.run(_post_batches(url, token, batches, args.concurrency))
    edge = accepted / (time.perf_counter() - t0)
    print(
        f"ingest: {args.events} usage.recorded events, batches of {args.batch}, {args.concurrency} clients"
    )
    print(f"  bare producer, records pre-encoded    : {bare:10,.0f} events/s")
    print(f"  bare producer, encoding its events     : {bare_encoding:10,.0f} events/s")
    print(
        f"  HTTP edge (parse, validate, encode, claim in Redis, produce, wait for delivery): {edge:,.0f} events/s ({accepted} accepted)"
    )
    print(f"  ratio edge / bare (pre-encoded)        : {edge / bare:10.2f}")
    print(
        f"  ratio edge / bare (encoding)           : {edge / bare_encoding:10.2f}  (target >= 0.5)"
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


#: Longest wait for one freshness sample, in seconds (a view far behind under load
#: shows as p99 at the cap instead of a benchmark that never ends).
SAMPLE_TIMEOUT_S = 30.0


def _freshness(p: Pipeline, port: int, samples: int, tag: str) -> list[float]:
    prod = producer(p.settings, **{"linger.ms": 0})
    customer = f"probe-{tag}"
    rec = encode(
        Envelope.wrap(
            CustomerUpserted(
                customer_id=customer, name=customer, email="p@example.com", currency="USD"
            ),
            id=f"cu-{customer}",
            source="/bench",
        )
    )
    prod.produce(p.topic, key=rec.key, value=rec.value, headers=rec.headers)  # type: ignore[arg-type]
    prod.flush(10)
    path = usage_path(customer, "2024-09")
    delays: list[float] = []
    auth = {"Authorization": f"Bearer {_view_read_key(p)}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10, headers=auth) as http:
        _wait("the probe customer", lambda: http.get(path).status_code == 200)
        for n in range(samples):
            event = next(_usage_events(f"{tag}-{n}", 1, customers=1))
            data = event.data.model_copy(update={"customer_id": customer})
            rec = encode(Envelope.wrap(data, id=f"probe-{tag}-{n}", source="/bench"))
            t0 = time.perf_counter()
            prod.produce(p.topic, key=rec.key, value=rec.value, headers=rec.headers)  # type: ignore[arg-type]
            prod.flush(10)
            while time.perf_counter() - t0 < SAMPLE_TIMEOUT_S:  # a lost sample counts as the cap
                try:
                    body = http.get(path).json()
                except (httpx.HTTPError, ValueError):
                    body = {}
                if body.get("last_event_id") == f"probe-{tag}-{n}":
                    break
                time.sleep(0.01)
            delays.append(time.perf_counter() - t0)
            time.sleep(0.02)
    return delays


def bench_freshness(p: Pipeline, workdir: Path, args: argparse.Namespace) -> None:
    port, _ = _start_view(p, args.store)
    idle = _freshness(p, port, args.samples, "idle")
    print(
        f"freshness: event produced -> visible in the view's answer ({args.samples} samples"
        f" each, store {args.store})"
    )
    _report("idle", idle)
    url, token = _start_edge(p, workdir)
    stop = threading.Event()
    sent = [0]

    def load() -> None:
        n = 0
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/cloudevents-batch+json",
        }
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                evs = [
                    _cloudevent(e) for e in _usage_events(f"load{n}", args.load_batch, customers=50)
                ]
                t0 = time.perf_counter()
                http.post(f"{url}/v1/events", content=json.dumps(evs).encode(), headers=headers)
                sent[0] += len(evs)
                n += 1
                time.sleep(max(0.0, args.load_batch / args.load_rate - (time.perf_counter() - t0)))

    thread = threading.Thread(target=load, daemon=True)
    started = time.perf_counter()
    thread.start()
    time.sleep(2)
    loaded = _freshness(p, port, args.samples, "load")
    stop.set()
    thread.join(30)
    rate = sent[0] / (time.perf_counter() - started)
    _report(f"under ingest load (~{rate:,.0f} events/s through the edge)", loaded)


def _report(name: str, values: list[float]) -> None:
    print(
        f"  {name}: p50 {1000 * statistics.median(values):.1f} ms, "
        f"p99 {1000 * _percentile(values, 0.99):.1f} ms, max {1000 * max(values):.1f} ms",
        flush=True,
    )


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _records_handled(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("invoicing_usage_view_records_total{")
    )


def bench_memory(p: Pipeline, workdir: Path, args: argparse.Namespace) -> None:
    port, pid = _start_view(p, args.store, args.price_book)
    empty = _rss_mb(pid)
    summary = run_import_focus(SAMPLE, p.settings, progress=False)
    expected = summary.produced + summary.customers_produced
    _wait("the FOCUS demo in the view", lambda: _records_handled(port) >= expected)
    time.sleep(2)
    demo = _rss_mb(pid)
    config = ScenarioConfig(
        customers=args.customers,
        pass_through_lines=args.lines,
        metered_events=args.metered,
        seed=7,
        prefix=f"big{uuid.uuid4().hex[:4]}",
    )
    prod = producer(p.settings)
    total = 0
    t0 = time.perf_counter()
    for envelope in events(config):
        rec = encode(envelope)
        while True:
            try:
                prod.produce(p.topic, key=rec.key, value=rec.value, headers=rec.headers)  # type: ignore[arg-type]
                break
            except BufferError:
                prod.poll(0.05)
        total += 1
    prod.flush(120)
    produce_s = time.perf_counter() - t0
    peak = demo
    target = expected + total
    while _records_handled(port) < target:
        peak = max(peak, _rss_mb(pid))
        time.sleep(1)
    consumed_s = time.perf_counter() - t0
    time.sleep(3)
    large = _rss_mb(pid)
    book = Path(args.price_book).name if args.price_book else "published (empty)"
    print(f"memory of one view instance (store {args.store}, standby replicas 0, book {book}):")
    print(f"  started, empty tables      : {empty:8.1f} MB RSS")
    print(f"  + FOCUS demo ({expected} records, 73 customers): {demo:8.1f} MB RSS")
    print(
        f"  + large scenario ({total:,} records: {args.customers} customers, {args.lines} pass-through "
        f"lines each, {args.metered} metered per subscriber): {large:8.1f} MB RSS (peak {peak:.1f})"
    )
    print(
        f"  produced in {produce_s:.1f} s; consumed by the view in {consumed_s:.1f} s ({total / consumed_s:,.0f} records/s)"
    )
    if args.floor:
        # the same run's baseline: faust alone reading the same records (its own group)
        print("  faust floor (the same records, a consumer group of its own):")
        for batch in (1_000, 0):
            floor = _faust_floor(p, target, batch)
            how = f"take_events({batch})" if batch else "one event at a time"
            print(
                f"    faust app counting only, {how}: {floor['records_per_s']:,.0f} records/s "
                f"(view/floor {total / consumed_s / floor['records_per_s']:.3f})",
                flush=True,
            )


def _faust_floor(p: Pipeline, records: int, batch: int) -> dict[str, float]:
    """Run :mod:`benchmarks.faust_floor` on the sandbox's topic; its JSON result."""
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        _run_floor(p, records, batch, result.name)
        parsed: dict[str, float] = json.loads(Path(result.name).read_text(encoding="utf-8"))
        return parsed


def _run_floor(p: Pipeline, records: int, batch: int, out: str) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.faust_floor",
            "--brokers",
            p.settings.kafka.bootstrap_servers,
            "--topic",
            p.topic,
            "--records",
            str(records),
            "--batch",
            str(batch),
            "--out",
            out,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,  # faust's worker draws a spinner there
        timeout=600,
        check=True,
    )


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """Run one benchmark (``argv``: ``ingest|freshness|memory [options]``, default the
    command line's)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    ingest = sub.add_parser("ingest")
    ingest.add_argument("--events", type=int, default=20_000)
    ingest.add_argument("--batch", type=int, default=500)
    ingest.add_argument("--concurrency", type=int, default=4)
    ingest.add_argument(
        "--edges", type=int, default=1, help="edge processes on one port (SO_REUSEPORT)"
    )
    fresh = sub.add_parser("freshness")
    fresh.add_argument("--samples", type=int, default=200)
    fresh.add_argument("--load-rate", type=float, default=500.0, help="events/s through the edge")
    fresh.add_argument("--load-batch", type=int, default=100)
    fresh.add_argument("--store", choices=["memory", "rocksdb"], default="memory")
    memory = sub.add_parser("memory")
    memory.add_argument("--store", choices=["memory", "rocksdb"], default="rocksdb")
    memory.add_argument("--customers", type=int, default=2_000)
    memory.add_argument("--lines", type=int, default=100)
    memory.add_argument("--metered", type=int, default=100)
    memory.add_argument(
        "--price-book",
        default=str(ROOT / "examples" / "pricing" / "price-book.yaml"),
        help="the view's price book file, which defines the scenario's metrics (''"
        ": the published book, empty here, so every metered event names an unknown metric)",
    )
    memory.add_argument(
        "--floor",
        action="store_true",
        help="then the same run's baseline: a faust app that only counts the same records",
    )
    args = parser.parse_args(argv)
    unique = "v" + uuid.uuid4().hex[:8]
    with (
        tempfile.TemporaryDirectory() as tmp,
        isolated_pipeline(Settings(), unique, Path(tmp)) as p,
    ):
        {"ingest": bench_ingest, "freshness": bench_freshness, "memory": bench_memory}[args.what](
            p, Path(tmp), args
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so the sandbox stops its view and
    # edge processes, which run in sessions of their own and would outlive the benchmark
    signal.signal(signal.SIGTERM, _interrupt)
    main()
