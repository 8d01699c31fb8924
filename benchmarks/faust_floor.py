"""faust's own floor for the usage view (docs/benchmarks.md): a faust app with the view's
broker settings and no tables, whose agent only counts the source topic's records, a
batch at a time (``take_events``, as the view) or one event at a time.

Run as its own process by ``bench_usage_view memory`` on the topic the view has just
read, in a consumer group of its own, from the beginning; writes one JSON object
``{"records": N, "seconds": S, "records_per_s": R}`` (from its first record to its N-th)
to ``--out`` and exits (a file, because faust's worker redirects stdout into its logger).
Asserts nothing.

    .venv/bin/python -m benchmarks.faust_floor --brokers 127.0.0.1:19092 --topic T --records N --out F
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from typing import Any

import faust


def main(argv: list[str] | None = None) -> None:
    """Count ``--records`` records of ``--topic``, write the rate to ``--out``, exit."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--batch", type=int, default=1_000, help="take_events size (0: per event)")
    parser.add_argument("--wait", type=float, default=0.020)
    parser.add_argument("--out", required=True, help="file the JSON result is written to")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=INT",
        help="a faust setting to try (integer value), e.g. broker_max_poll_records=5000",
    )
    args = parser.parse_args(argv)
    datadir = tempfile.mkdtemp(prefix="faust-floor-")
    tried: dict[str, Any] = {
        name: int(value) for name, value in (s.split("=", 1) for s in args.setting)
    }
    app = faust.App(
        f"floor-{uuid.uuid4().hex[:8]}",
        broker=[f"kafka://{b.strip()}" for b in args.brokers.split(",") if b.strip()],
        store="memory://",
        datadir=datadir,
        autodiscover=False,
        web_enabled=False,
        topic_partitions=args.partitions,
        consumer_auto_offset_reset="earliest",
        key_serializer="raw",
        value_serializer="raw",
        stream_wait_empty=False,
        **tried,
    )
    source = app.topic(
        args.topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=args.partitions,
    )
    seen = 0
    first = 0.0

    def counted(n: int) -> None:
        nonlocal seen, first
        if not seen:
            first = time.perf_counter()
        seen += n
        if seen >= args.records:
            elapsed = time.perf_counter() - first
            result = {"records": seen, "seconds": elapsed, "records_per_s": seen / elapsed}
            with open(args.out, "w", encoding="utf-8") as out:
                json.dump(result, out)
            os._exit(0)

    @app.agent(source, name="count")
    async def count(stream: Any) -> None:
        if args.batch:
            async for events in stream.take_events(args.batch, args.wait):
                counted(len(events))
        else:
            async for _event in stream.events():
                counted(1)

    _ = count
    from faust.worker import Worker

    sys.argv = [sys.argv[0]]
    Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


if __name__ == "__main__":
    main()
