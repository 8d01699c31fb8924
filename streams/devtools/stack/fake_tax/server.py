"""The fake tax service's HTTP server (aiohttp): the engine behind the API, plus faults,
latency and request records. Run it with ``python -m streams.devtools.stack.fake_tax`` (see
the package docstring for the arguments, the API and the knobs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError

from streams.adapters.memory.tax_engine import TaxLedger
from streams.adapters.tax import wire
from streams.core.billing.ports import TaxRejected
from streams.devtools.stack.fake_tax.config import FakeTaxConfig

__all__ = [
    "FakeTaxConfig",
    "FakeTaxServer",
    "Outcome",
    "RequestRecord",
    "build_parser",
    "main",
    "serve",
]

logger = logging.getLogger("streams.devtools.stack.fake_tax")

Outcome = Literal["ok", "replay", "error", "timeout", "conflict", "invalid"]


class RequestRecord(BaseModel):
    """One request the fake received (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq: int
    kind: Literal["document", "rate"]
    received_at: datetime
    idempotency_key: str | None
    customer_id: str | None
    line_count: int
    commit: bool | None
    outcome: Outcome
    status: int
    latency_s: float
    document_id: str | None = None


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response(wire.error_body(code, message), status=status)


class FakeTaxServer:
    """The fake's state (ledger, knobs, random draws, records) and its aiohttp handlers.

    Single event loop: handlers decide synchronously (no ``await`` between reading
    the knobs and recording), so concurrent requests see a consistent state.
    """

    def __init__(self, config: FakeTaxConfig, *, record_file: Path | None = None) -> None:
        self.config = config
        self.ledger = TaxLedger(max_lines=config.max_lines)
        self.ledger.set_overrides(config.rate_overrides)
        self.records: list[RequestRecord] = []
        self._random = random.Random(config.seed)
        self._record_file: IO[str] | None = None
        if record_file is not None:
            record_file.parent.mkdir(parents=True, exist_ok=True)
            self._record_file = record_file.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._record_file is not None:
            self._record_file.close()
            self._record_file = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes(
            [
                web.post(wire.DOCUMENTS_PATH, self.post_document),
                web.get(wire.RATES_PATH, self.get_rate),
                web.get("/health", self.health),
                web.get("/admin/requests", self.get_requests),
                web.delete("/admin/requests", self.delete_requests),
                web.get("/admin/config", self.get_config),
                web.put("/admin/config", self.put_config),
            ]
        )
        return app

    # ------------------------------------------------------------------ records

    def _record(self, **fields: Any) -> RequestRecord:
        record = RequestRecord(seq=len(self.records) + 1, **fields)
        self.records.append(record)
        if self._record_file is not None:
            self._record_file.write(record.model_dump_json() + "\n")
            self._record_file.flush()
        level = logging.DEBUG if record.outcome in ("ok", "replay") else logging.INFO
        logger.log(
            level,
            "%s %s key=%s lines=%d commit=%s -> %s %d (latency %.3fs)",
            record.kind,
            record.seq,
            record.idempotency_key,
            record.line_count,
            record.commit,
            record.outcome,
            record.status,
            record.latency_s,
        )
        return record

    # ------------------------------------------------------------------ API

    async def post_document(self, request: web.Request) -> web.Response:
        received_at = datetime.now(UTC)
        cfg = self.config
        try:
            doc = wire.parse_document_request(await request.read(), cfg.max_lines)
        except wire.InvalidRequest as exc:
            self._record(
                kind="document",
                received_at=received_at,
                idempotency_key=exc.idempotency_key,
                customer_id=exc.customer_id,
                line_count=exc.line_count,
                commit=None,
                outcome="invalid",
                status=exc.status,
                latency_s=0.0,
            )
            return _error(exc.status, exc.code, exc.message)
        base = {
            "kind": "document",
            "received_at": received_at,
            "idempotency_key": doc.idempotency_key,
            "customer_id": doc.customer_id,
            "line_count": len(doc.lines),
            "commit": doc.commit,
        }
        draw_error, draw_timeout, draw_spike = (self._random.random() for _ in range(3))
        if cfg.fail_next > 0 or draw_error < cfg.error_rate:
            if cfg.fail_next > 0:
                self.config = cfg.model_copy(update={"fail_next": cfg.fail_next - 1})
            self._record(**base, outcome="error", status=cfg.error_status, latency_s=0.0)
            return _error(cfg.error_status, "unavailable", "injected failure, try again")
        timed_out = cfg.timeout_next > 0 or draw_timeout < cfg.timeout_rate
        if cfg.timeout_next > 0:
            self.config = cfg.model_copy(update={"timeout_next": cfg.timeout_next - 1})
        latency = cfg.base_latency_s + cfg.per_line_latency_s * len(doc.lines)
        if draw_spike < cfg.spike_probability:
            latency += cfg.spike_latency_s
        if timed_out:
            latency = cfg.timeout_latency_s
        try:
            answer = self.ledger.process(
                idempotency_key=doc.idempotency_key,
                customer_id=doc.customer_id,
                currency=doc.currency,
                lines=doc.lines,
                commit=doc.commit,
            )
        except TaxRejected as exc:
            status = exc.status or 422
            outcome: Outcome = "conflict" if status == 409 else "invalid"
            self._record(
                **base,
                outcome="timeout" if timed_out else outcome,
                status=status,
                latency_s=latency,
            )
            await self._wait(latency)
            return _error(status, outcome, str(exc))
        self._record(
            **base,
            outcome="timeout" if timed_out else ("replay" if answer.replay else "ok"),
            status=200,
            latency_s=latency,
            document_id=answer.document_id,
        )
        await self._wait(latency)
        body = wire.document_answer_body(answer.document_id, answer.idempotency_key, answer.lines)
        headers = {wire.REPLAYED_HEADER: "true"} if answer.replay else {}
        return web.json_response(body, headers=headers)

    async def _wait(self, latency: float) -> None:
        """A document request's latency, then as long as ``hold`` is set."""
        await asyncio.sleep(latency)
        while self.config.hold:
            await asyncio.sleep(0.05)

    async def get_rate(self, request: web.Request) -> web.Response:
        received_at = datetime.now(UTC)
        region_id = request.query.get("region_id") or None
        tax_code = request.query.get("tax_code") or None
        latency = self.config.base_latency_s
        base = {
            "kind": "rate",
            "received_at": received_at,
            "idempotency_key": None,
            "customer_id": None,
            "line_count": 0,
            "commit": None,
        }
        try:
            rate = self.ledger.rate(region_id, tax_code)
        except TaxRejected as exc:
            self._record(**base, outcome="invalid", status=422, latency_s=0.0)
            return _error(422, "invalid_tax_code", str(exc))
        self._record(**base, outcome="ok", status=200, latency_s=latency)
        await asyncio.sleep(latency)
        return web.json_response(wire.rate_answer_body(region_id, rate))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok", "documents": len(self.ledger), "requests": len(self.records)}
        )

    async def get_requests(self, request: web.Request) -> web.Response:
        kind = request.query.get("kind")
        prefix = request.query.get("key_prefix")
        selected = [
            r
            for r in self.records
            if (kind is None or r.kind == kind)
            and (prefix is None or (r.idempotency_key or "").startswith(prefix))
        ]
        return web.json_response({"requests": [r.model_dump(mode="json") for r in selected]})

    async def delete_requests(self, request: web.Request) -> web.Response:
        cleared = len(self.records)
        self.records.clear()
        return web.json_response({"cleared": cleared})

    async def get_config(self, request: web.Request) -> web.Response:
        return web.json_response(self.config.model_dump(mode="json"))

    async def put_config(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
        except ValueError as exc:
            return _error(422, "invalid_json", f"body is not JSON: {exc}")
        if not isinstance(changes, dict):
            return _error(422, "invalid_request", "body must be a JSON object")
        try:
            new = FakeTaxConfig.model_validate({**self.config.model_dump(), **changes})
        except ValidationError as exc:
            return _error(422, "invalid_config", str(exc))
        if "seed" in changes:
            self._random.seed(new.seed)
        self.ledger.max_lines = new.max_lines
        try:
            self.ledger.set_overrides(new.rate_overrides)
        except ValueError as exc:
            return _error(422, "invalid_config", str(exc))
        self.config = new
        logger.info("configuration changed: %s", changes)
        return web.json_response(new.model_dump(mode="json"))


async def serve(server: FakeTaxServer, host: str, port: int, port_file: Path | None) -> None:
    """Serve until SIGTERM or SIGINT; write the bound port to ``port_file`` if given."""
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = int(runner.addresses[0][1])
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{bound}\n")
        tmp.replace(port_file)
    logger.info("fake tax service listening on http://%s:%d (%s)", host, bound, server.config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    logger.info("stopping fake tax service")
    await runner.cleanup()
    server.close()


def build_parser() -> argparse.ArgumentParser:
    defaults = FakeTaxConfig()
    parser = argparse.ArgumentParser(
        prog="python -m streams.devtools.stack.fake_tax",
        description="Fake third-party tax service (see the module docstring for the API).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18090, help="0 = a free port")
    parser.add_argument("--record-file", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--port-file", type=Path, help="write the bound port here when ready")
    for name, info in FakeTaxConfig.model_fields.items():
        if name == "seed":
            continue
        if name == "rate_overrides":  # a JSON object on the command line
            parser.add_argument(
                "--rate-overrides", type=json.loads, default={}, help=info.description
            )
            continue
        if info.annotation is bool:  # --hold / --no-hold
            parser.add_argument(
                "--" + name.replace("_", "-"),
                action=argparse.BooleanOptionalAction,
                default=getattr(defaults, name),
                help=info.description,
            )
            continue
        kind = int if info.annotation is int else float
        parser.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            default=getattr(defaults, name),
            help=info.description,
        )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--log-level", default="INFO")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m streams.devtools.stack.fake_tax``; returns the exit status."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    logging.Formatter.converter = time.gmtime
    knobs = {name: getattr(args, name) for name in FakeTaxConfig.model_fields}
    try:
        config = FakeTaxConfig.model_validate(knobs)
    except ValidationError as exc:
        logger.error("invalid configuration: %s", exc)
        return 2
    server = FakeTaxServer(config, record_file=args.record_file)
    try:
        asyncio.run(serve(server, args.host, args.port, args.port_file))
    finally:
        server.close()
    return 0
