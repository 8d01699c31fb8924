"""Fake third-party tax service: a real HTTP server for development, tests, drills, benchmarks.

Run::

    python -m streams.stack.fake_tax --host 127.0.0.1 --port 18090 \\
        --record-file .local/data/tax/requests.jsonl \\
        [--base-latency-s 0.02] [--per-line-latency-s 0] [--spike-probability 0] \\
        [--spike-latency-s 0] [--error-rate 0] [--error-status 503] [--timeout-rate 0] \\
        [--timeout-latency-s 60] [--max-lines 1000] [--seed N] [--port-file PATH] \\
        [--log-level INFO]

``--port 0`` binds a free port; ``--port-file`` then receives the port number
once the server listens. SIGTERM or SIGINT stop it (requests still sleeping are
cancelled after one second). Logs go to stderr, one line per fault or refusal
and per configuration change; successful requests log at DEBUG.

API (JSON bodies; money and rates are decimal **strings**, JSON numbers are refused):

``POST /v1/documents`` — tax a document::

    request  {"idempotency_key": str, "customer_id": str, "currency": "USD", "commit": bool,
              "lines": [{"line_id": str, "amount": "12.50", "region_id": str|null,
                         "tax_code": str|null}]}            (1..max_lines lines)
    200      {"document_id": str, "idempotency_key": str,
              "lines": [{"line_id", "tax_code": "US-WA-STD", "rate": "0.065", "tax": "0.8125"}]}
             header "Idempotent-Replayed: true" when it is a stored answer
    413      more than max_lines lines       422  invalid request (bad JSON, a numeric
    409      key committed with other lines       amount, unknown product tax_code, …)
    503      injected error (error_rate / fail_next)
    errors   {"error": {"code": str, "message": str}}

  ``tax = amount * rate`` exactly (no rounding; negative amounts give negative
  tax); the rate table and the idempotency rules are
  :class:`streams.adapters.tax.TaxLedger`'s (region id → jurisdiction, unknown
  ``us-*``/``eu-*``/``ap-*`` by prefix, ``null``/``global``/others → ``GLOBAL``;
  product codes ``STD`` (default) and ``EXEMPT``). ``commit=true`` stores the
  answer under the key: the same key and content answer the stored result (a
  *replay*), other content → 409. ``commit=false`` is a quote, nothing stored.

``GET /v1/rates?region_id=..&tax_code=..`` — ``{"region_id", "tax_code", "rate"}``: the
  code and rate a line of that region (and product code) gets. Base latency only,
  no injected faults.

Admin (for tests and drills):

``GET /health``                  ``{"status": "ok", "documents": n, "requests": n}``
``GET /admin/requests``          ``{"requests": [record, …]}``; filters ``kind=document|rate``,
                                 ``key_prefix=…``
``DELETE /admin/requests``       forget the records in memory (the file keeps them)
``GET /admin/config``            the knobs (:class:`FakeTaxConfig`)
``PUT /admin/config``            change some knobs: ``{"error_rate": 0.2, "seed": 7}``;
                                 422 on an unknown knob or a value out of range

Latency model, per document request: ``base_latency_s + per_line_latency_s *
lines``, plus ``spike_latency_s`` with probability ``spike_probability``. Before
any work, a share ``error_rate`` of requests (and the next ``fail_next``) answer
``error_status`` (503). A share ``timeout_rate`` (and the next ``timeout_next``)
are processed (so committed), then held for ``timeout_latency_s`` — far past a
client's read timeout — before answering: the client's retry with the same key
then gets the stored answer. Every draw comes from one ``random.Random(seed)``,
three draws per valid document request, so a seeded run repeats.

Records (:class:`RequestRecord`), one per request, kept in memory and appended as
JSON lines to ``--record-file``; written when the request is decided, before its
delay, so a timed-out request is visible at once::

    {"seq": 1, "kind": "document", "received_at": "2025-01-31T12:00:00.123456Z",
     "idempotency_key": "inv-1:0", "customer_id": "c1", "line_count": 3, "commit": true,
     "outcome": "ok", "status": 200, "latency_s": 0.02, "document_id": "doc_…"}

``outcome``: ``ok``, ``replay``, ``error`` (injected), ``timeout``, ``conflict``,
``invalid`` (413/422).

:func:`running_fake_tax` starts the server as a subprocess on a free port and
:class:`FakeTaxAdmin` drives its admin API (for tests and drills).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any, Literal

import httpx
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from streams.adapters.tax import MAX_LINES_PER_REQUEST, TaxLedger, TaxRejected, rate_for
from streams.domain.invoice import TaxLine

logger = logging.getLogger("streams.stack.fake_tax")

Outcome = Literal["ok", "replay", "error", "timeout", "conflict", "invalid"]


class FakeTaxConfig(BaseModel):
    """The fake's knobs; all latencies in seconds, rates and probabilities in 0..1."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_latency_s: float = Field(0.02, ge=0)
    per_line_latency_s: float = Field(0.0, ge=0)
    spike_probability: float = Field(0.0, ge=0, le=1)
    spike_latency_s: float = Field(0.0, ge=0)
    #: Share of document requests answered ``error_status`` before any work.
    error_rate: float = Field(0.0, ge=0, le=1)
    error_status: int = Field(503, ge=400, le=599)
    #: Share of document requests held ``timeout_latency_s`` before answering.
    timeout_rate: float = Field(0.0, ge=0, le=1)
    timeout_latency_s: float = Field(60.0, ge=0)
    #: The next N document requests answer ``error_status`` (deterministic faults).
    fail_next: int = Field(0, ge=0)
    #: The next N document requests time out (deterministic faults).
    timeout_next: int = Field(0, ge=0)
    #: Lines allowed per document request (more → 413).
    max_lines: int = Field(MAX_LINES_PER_REQUEST, ge=1)
    #: Seed of the fault/latency draws; setting it (also via PUT) restarts the sequence.
    seed: int | None = None


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


class _Invalid(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        #: What could be read of the request, for its record.
        self.idempotency_key: str | None = None
        self.customer_id: str | None = None
        self.line_count = 0


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@dataclass(frozen=True)
class _Document:
    idempotency_key: str
    customer_id: str
    currency: str
    commit: bool
    lines: list[TaxLine]


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | Decimal):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def _optional_text(item: dict[str, Any], name: str, where: str) -> str | None:
    value = item.get(name)
    if value is not None and not isinstance(value, str):
        raise _Invalid(422, "invalid_request", f"{where}.{name} must be a string or null")
    return value


def _parse_document(raw: bytes, max_lines: int) -> _Document:
    """Parse and check a document request body.

    Raises:
        _Invalid: 422 for malformed JSON or fields, 413 for too many lines.
    """
    try:
        body = json.loads(raw, parse_float=Decimal)
    except ValueError as exc:
        raise _Invalid(422, "invalid_json", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _Invalid(422, "invalid_request", "body must be a JSON object")
    try:
        return _check_document(body, max_lines)
    except _Invalid as exc:
        key, customer, lines = (
            body.get("idempotency_key"),
            body.get("customer_id"),
            body.get("lines"),
        )
        exc.idempotency_key = key if isinstance(key, str) else None
        exc.customer_id = customer if isinstance(customer, str) else None
        exc.line_count = len(lines) if isinstance(lines, list) else 0
        raise


def _check_document(body: dict[str, Any], max_lines: int) -> _Document:
    key = body.get("idempotency_key")
    customer = body.get("customer_id")
    currency = body.get("currency")
    commit = body.get("commit")
    lines = body.get("lines")
    if not isinstance(key, str) or not key or len(key) > 512:
        raise _Invalid(422, "invalid_request", "idempotency_key must be a non-empty string")
    if not isinstance(customer, str) or not customer:
        raise _Invalid(422, "invalid_request", "customer_id must be a non-empty string")
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isalpha():
        raise _Invalid(422, "invalid_request", "currency must be a 3-letter code")
    if not isinstance(commit, bool):
        raise _Invalid(422, "invalid_request", "commit must be true or false")
    if not isinstance(lines, list):
        raise _Invalid(422, "invalid_request", "lines must be a list")
    if len(lines) > max_lines:
        raise _Invalid(
            413, "too_many_lines", f"{len(lines)} lines in one document, at most {max_lines}"
        )
    parsed: list[TaxLine] = []
    for index, item in enumerate(lines):
        where = f"lines[{index}]"
        if not isinstance(item, dict):
            raise _Invalid(422, "invalid_request", f"{where} must be an object")
        line_id = item.get("line_id")
        amount = item.get("amount")
        if not isinstance(line_id, str) or not line_id:
            raise _Invalid(422, "invalid_request", f"{where}.line_id must be a non-empty string")
        if not isinstance(amount, str):
            raise _Invalid(
                422,
                "invalid_amount",
                f"{where}.amount must be a decimal string, not a JSON {_json_type(amount)}",
            )
        try:
            value = Decimal(amount.strip())
        except InvalidOperation:
            raise _Invalid(
                422, "invalid_amount", f"{where}.amount {amount!r} is not a decimal"
            ) from None
        if not value.is_finite():
            raise _Invalid(422, "invalid_amount", f"{where}.amount {amount!r} is not finite")
        parsed.append(
            TaxLine(
                line_id=line_id,
                amount=value,
                region_id=_optional_text(item, "region_id", where),
                tax_code=_optional_text(item, "tax_code", where),
            )
        )
    return _Document(key, customer, currency.upper(), commit, parsed)


class FakeTaxServer:
    """The fake's state (ledger, knobs, random draws, records) and its aiohttp handlers.

    Single event loop: handlers decide synchronously (no ``await`` between reading
    the knobs and recording), so concurrent requests see a consistent state.
    """

    def __init__(self, config: FakeTaxConfig, *, record_file: Path | None = None) -> None:
        self.config = config
        self.ledger = TaxLedger(max_lines=config.max_lines)
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
                web.post("/v1/documents", self.post_document),
                web.get("/v1/rates", self.get_rate),
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
            doc = _parse_document(await request.read(), cfg.max_lines)
        except _Invalid as exc:
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
            await asyncio.sleep(latency)
            return _error(status, outcome, str(exc))
        self._record(
            **base,
            outcome="timeout" if timed_out else ("replay" if answer.replay else "ok"),
            status=200,
            latency_s=latency,
            document_id=answer.document_id,
        )
        await asyncio.sleep(latency)
        body = {
            "document_id": answer.document_id,
            "idempotency_key": answer.idempotency_key,
            "lines": [
                {
                    "line_id": t.line_id,
                    "tax_code": t.tax_code,
                    "rate": str(t.rate),
                    "tax": str(t.tax),
                }
                for t in answer.lines
            ],
        }
        headers = {"Idempotent-Replayed": "true"} if answer.replay else {}
        return web.json_response(body, headers=headers)

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
            rate = rate_for(region_id, tax_code)
        except TaxRejected as exc:
            self._record(**base, outcome="invalid", status=422, latency_s=0.0)
            return _error(422, "invalid_tax_code", str(exc))
        self._record(**base, outcome="ok", status=200, latency_s=latency)
        await asyncio.sleep(latency)
        return web.json_response(
            {"region_id": region_id, "tax_code": rate.tax_code, "rate": str(rate.rate)}
        )

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
        prog="python -m streams.stack.fake_tax",
        description="Fake third-party tax service (see the module docstring for the API).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18090, help="0 = a free port")
    parser.add_argument("--record-file", type=Path, required=True, help="JSON lines, appended")
    parser.add_argument("--port-file", type=Path, help="write the bound port here when ready")
    for name, info in FakeTaxConfig.model_fields.items():
        if name == "seed":
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
    """Entry point of ``python -m streams.stack.fake_tax``; returns the exit status."""
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


# --------------------------------------------------------------------------- test and drill helpers


class FakeTaxAdmin:
    """Client of the fake's admin API (synchronous, httpx)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url = url
        self._client = httpx.Client(base_url=url, timeout=timeout_s, trust_env=False)

    def close(self) -> None:
        self._client.close()

    def _json(self, response: httpx.Response) -> Any:
        response.raise_for_status()
        return response.json()

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json(self._client.get("/health"))
        return result

    def requests(
        self, *, kind: str | None = "document", key_prefix: str | None = None
    ) -> list[RequestRecord]:
        """Records in arrival order, of ``kind`` (``None`` = all) and key prefix."""
        params = {k: v for k, v in (("kind", kind), ("key_prefix", key_prefix)) if v is not None}
        data = self._json(self._client.get("/admin/requests", params=params))
        return [RequestRecord.model_validate(r) for r in data["requests"]]

    def clear(self) -> int:
        """Forget the records in memory; returns how many there were."""
        return int(self._json(self._client.delete("/admin/requests"))["cleared"])

    def config(self) -> FakeTaxConfig:
        return FakeTaxConfig.model_validate(self._json(self._client.get("/admin/config")))

    def configure(self, **changes: Any) -> FakeTaxConfig:
        """Change knobs at runtime, e.g. ``configure(error_rate=0.5, seed=1)``.

        Raises:
            httpx.HTTPStatusError: 422 for an unknown knob or a value out of range.
        """
        return FakeTaxConfig.model_validate(
            self._json(self._client.put("/admin/config", json=changes))
        )


@dataclass
class FakeTaxProcess:
    """A running fake started by :func:`running_fake_tax`."""

    url: str
    port: int
    admin: FakeTaxAdmin
    process: subprocess.Popen[bytes]
    record_file: Path
    log_file: Path


@contextmanager
def running_fake_tax(
    workdir: Path,
    *,
    config: FakeTaxConfig | None = None,
    startup_timeout_s: float = 20.0,
) -> Iterator[FakeTaxProcess]:
    """Start the fake as a subprocess on a free port of 127.0.0.1, wait until healthy,
    yield it, then stop it with SIGTERM (SIGKILL after 10 s).

    Files in ``workdir``: ``fake_tax.jsonl`` (records), ``fake_tax.log`` (stderr).

    Raises:
        RuntimeError: the server did not become healthy in ``startup_timeout_s``
            (the message carries the end of its log).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    port_file = workdir / "fake_tax.port"
    port_file.unlink(missing_ok=True)
    record_file = workdir / "fake_tax.jsonl"
    log_file = workdir / "fake_tax.log"
    argv = [
        sys.executable,
        "-m",
        "streams.stack.fake_tax",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--port-file",
        str(port_file),
        "--record-file",
        str(record_file),
    ]
    for name, value in (config or FakeTaxConfig()).model_dump().items():
        if value is not None:
            argv += ["--" + name.replace("_", "-"), str(value)]
    with log_file.open("ab") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=dict(os.environ)
        )
    admin: FakeTaxAdmin | None = None
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_file.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"fake tax service did not start (exit {process.poll()}):\n{tail}"
                )
            if port_file.exists():
                port = int(port_file.read_text())
                url = f"http://127.0.0.1:{port}"
                admin = FakeTaxAdmin(url)
                try:
                    admin.health()
                    break
                except httpx.HTTPError:
                    admin.close()
                    admin = None
            time.sleep(0.05)
        yield FakeTaxProcess(url, port, admin, process, record_file, log_file)
    finally:
        if admin is not None:
            admin.close()
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


if __name__ == "__main__":
    sys.exit(main())
