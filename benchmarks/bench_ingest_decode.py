"""``python -m benchmarks.bench_ingest_decode``: the worker's Python work per usage record.

What the invoicing worker does between librdkafka handing it a poll batch and the
batch's ``COPY`` (docs/decisions/0010-batch-first-ingest.md): each message turned
into a :class:`~streams.core.billing.rows.Record` (``record_of``), the partition's
run decoded (``decode_run``: the msgspec fast path, the reference decoder for what
it declines) and every vouched-for record turned into its usage row
(``fast_usage_row``: SHA-256 of the value, coordinates, key id). No service is
needed: the messages are built in memory (``confluent_kafka.Message``) from the
harness's generated load (``benchmarks/load.py``, sampled from the bundled FOCUS
sample), the same records the ``standard`` set produces.

It is timed twice per round: under Python's default garbage-collector thresholds
(``default GC``) and as the worker process runs it (``tuned GC``:
:func:`streams.bootstrap.runtime.tune_gc` with ``worker.gc_threshold``'s default).
Beside it, measured in the same run on the same messages, the **floor**: what the
issue's 150-line limit loop did per record (``msgspec`` decode of the value into
the fast path's typed ``Struct`` with the contract's bounds, the headers read, the
SHA-256 of the value) and nothing else. Rounds alternate worker / floor so that a
noisy box slows all alike; the figure is the median of the rounds. Prints µs per
record and records/s, and the ratios to the floor (1.0 would be the floor).
Nothing is asserted.

    python -m benchmarks.bench_ingest_decode --customers 20 --lines 250 --rounds 9
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import msgspec
from confluent_kafka import Message

from benchmarks.load import customer_ids, usage_for
from streams.adapters.kafka import record_of
from streams.apps.invoicing.decoding import decode_run, fast_usage_row
from streams.bootstrap.runtime import tune_gc
from streams.core.domain.fastcodec import FastUsage, UsageFields
from streams.settings.processes import WorkerSettings

TOPIC = "billing.account-events.v1"


def messages(customers: int, lines: int) -> list[Any]:
    """``customers`` x (one ``customer.upserted`` + ``lines`` usage records), as
    librdkafka messages of partition 0 at consecutive offsets."""
    records = usage_for(customer_ids("bench", customers), "2026-09", lines)
    return [
        Message(
            topic=TOPIC,
            partition=0,
            offset=offset,
            key=key,
            value=value,
            headers=list[tuple[str, str | bytes | None]](headers),
            timestamp=(1, 1_790_000_000_000),
        )
        for offset, (key, value, headers) in enumerate(records)
    ]


def worker_path(msgs: list[Any]) -> int:
    """The worker's per-record work for one poll batch; returns the usage rows built."""
    run = decode_run(0, None, [record_of(msg) for msg in msgs])  # type: ignore[arg-type]
    built = [fast_usage_row(msg, item) for msg, item in run.items if isinstance(item, FastUsage)]
    return len(built)


_DECODER = msgspec.json.Decoder(UsageFields)


def floor_path(msgs: list[Any]) -> int:
    """The limit loop's per-record work: headers read, typed decode, SHA-256."""
    built = 0
    for msg in msgs:
        headers = dict(msg.headers())
        value = msg.value()
        try:
            data = _DECODER.decode(value)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        if headers.get("ce_type") == b"usage.recorded":
            built += bool((data, hashlib.sha256(value).hexdigest()))
    return built


def _time(fn: Callable[[list[Any]], int], msgs: list[Any]) -> float:
    started = time.perf_counter()
    fn(msgs)
    return time.perf_counter() - started


def _default_gc() -> None:
    gc.unfreeze()
    gc.set_threshold(700, *gc.get_threshold()[1:])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--customers", type=int, default=20)
    parser.add_argument("--lines", type=int, default=250, help="usage records per customer")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds after a warm-up")
    args = parser.parse_args(argv)
    threshold = WorkerSettings.model_fields["gc_threshold"].default
    msgs = messages(args.customers, args.lines)
    usage = worker_path(msgs)
    floor_path(msgs)  # warm-up of both
    samples: dict[str, list[float]] = {"default GC": [], "tuned GC": [], "floor": []}
    for _ in range(args.rounds):
        _default_gc()
        samples["default GC"].append(_time(worker_path, msgs))
        samples["floor"].append(_time(floor_path, msgs))
        tune_gc(threshold)
        samples["tuned GC"].append(_time(worker_path, msgs))
    _default_gc()
    load = os.getloadavg()[0]
    print(
        f"{len(msgs):,} records ({usage:,} usage rows), {args.rounds} rounds, load {load:.2f};"
        f" tuned GC = threshold {threshold:,}, start-up frozen"
    )
    median = {name: statistics.median(values) for name, values in samples.items()}
    for name, seconds in median.items():
        per = seconds / len(msgs) * 1e6
        ratio = median["floor"] / seconds
        print(
            f"  {name:10s} {per:6.2f} µs/record  {len(msgs) / seconds:>10,.0f} records/s"
            f"  floor/this {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
