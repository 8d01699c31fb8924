"""The HTTP ingest edge: ``POST /v1/events`` → ``billing.account-events.v1`` (aiohttp).

For systems without a Kafka client. A request is answered only after the broker
confirmed delivery of every record it produced (``acks=all``, idempotent
producer, murmur2 on the customer id: :func:`streams.adapters.kafka.producer_config`),
with one result per event in request order (:class:`~streams.usage_view.models.IngestResponse`):

* 200 — every event accepted or a duplicate;
* 207 — some rejected: each rejected result carries its problem (status, title, detail);
* 4xx — nothing taken: ``application/problem+json`` (RFC 9457), with ``results`` for a
  batch whose every event was refused; 401 without a valid bearer key, 413 over the
  body or batch limit, 415 another media type, 400 malformed JSON;
* 503 — the broker did not confirm in time (nothing is marked done: retry).

The edge writes nothing but the topic (and its Redis idempotency claims): no
invoice, no database. Poison never reaches the topic: an event is produced only
after the topic's own decoder accepted its record (:mod:`streams.ingest.edge`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from confluent_kafka import KafkaError, Message, Producer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from streams.ingest.edge import (
    BATCH,
    BodyError,
    Invalid,
    Valid,
    media_type,
    parse_body,
    validate,
    validate_batch_fast,
)
from streams.ingest.idempotency import Claim, Idempotency
from streams.ingest.keys import ApiKeyFile
from streams.usage_view import metrics
from streams.usage_view.models import EventResult, IngestResponse, Problem

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

#: A delivery report: (error text or None, partition, offset).
Delivery = tuple[str | None, int | None, int | None]


@dataclass(frozen=True)
class EdgeConfig:
    host: str
    port: int
    topic: str
    max_body_bytes: int
    max_batch_events: int
    delivery_timeout_s: float


def problem_response(
    status: int, title: str, detail: str | None = None, **extra: Any
) -> web.Response:
    body = Problem(title=title, status=status, detail=detail, **extra)
    headers = {"WWW-Authenticate": 'Bearer realm="invoicing"'} if status == 401 else None
    metrics.INGEST_REQUESTS.labels(str(status)).inc()
    return web.Response(
        body=body.model_dump_json(exclude_none=True).encode(),
        status=status,
        content_type=PROBLEM_JSON,
        headers=headers,
    )


class DeliveryPump:
    """Serves a confluent-kafka producer's delivery reports to asyncio: a thread polls
    the producer and resolves each record's future on the event loop."""

    def __init__(self, producer: Producer, loop: asyncio.AbstractEventLoop) -> None:
        self.producer = producer
        self.loop = loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingest-delivery", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def produce_all(self, topic: str, items: list[Valid]) -> asyncio.Future[list[Delivery]]:
        """Produce ``items``; the future resolves, on the loop, once every delivery report
        arrived: per item ``(error or None, partition, offset)``. One wake-up of the loop
        per request, not per event (the reports arrive on the pump's thread)."""
        future: asyncio.Future[list[Delivery]] = self.loop.create_future()
        reports: list[Delivery] = [None] * len(items)  # type: ignore[list-item]
        remaining = [len(items)]
        lock = threading.Lock()

        def settle() -> None:
            if not future.done():
                future.set_result(reports)

        def reporter(i: int) -> Any:
            def report(err: KafkaError | None, msg: Message) -> None:
                reports[i] = (None if err is None else str(err), msg.partition(), msg.offset())
                with lock:
                    remaining[0] -= 1
                    last = remaining[0] == 0
                if last:
                    self.loop.call_soon_threadsafe(settle)

            return report

        for i, valid in enumerate(items):
            record = valid.record
            headers: list[tuple[str, str | bytes | None]] = list(record.headers)
            while True:
                try:
                    self.producer.produce(
                        topic,
                        key=record.key,
                        value=record.value,
                        headers=headers,
                        on_delivery=reporter(i),
                    )
                    break
                except BufferError:  # local queue full: let the pump drain it
                    time.sleep(0.005)
        return future

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self.producer.flush(timeout_s)


def create_edge(
    config: EdgeConfig, *, pump_factory: Any, keys: ApiKeyFile, idempotency: Idempotency
) -> web.Application:
    """The edge's aiohttp application. ``pump_factory(loop)`` builds its :class:`DeliveryPump`
    on startup (and it is closed on cleanup)."""
    app = web.Application(client_max_size=config.max_body_bytes)
    state: dict[str, DeliveryPump] = {}

    async def on_startup(_: web.Application) -> None:
        state["pump"] = pump_factory(asyncio.get_running_loop())

    async def on_cleanup(_: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, state["pump"].close)

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

    async def post_events(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return problem_response(401, "Unauthorized", "send Authorization: Bearer <API key>")
        if keys.verify(token.strip()) is None:
            return problem_response(401, "Unauthorized", "unknown or revoked API key")
        if request.content_length is not None and request.content_length > config.max_body_bytes:
            return problem_response(
                413,
                "Body too large",
                f"{request.content_length} bytes, at most {config.max_body_bytes}",
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return problem_response(413, "Body too large", f"at most {config.max_body_bytes} bytes")
        received_at = datetime.now(UTC)
        content_type = request.headers.get("Content-Type")
        # A clean batch takes one pydantic-core pass; any error takes the per-event path,
        # which says which events failed and why.
        fast = (
            validate_batch_fast(body, received_at=received_at)
            if media_type(content_type) == BATCH
            else None
        )
        checked: list[Valid | Invalid]
        items: list[Any]
        if fast is not None and 0 < len(fast) <= config.max_batch_events:
            items, batch, checked = list(fast), True, list(fast)
        else:
            try:
                items, batch = parse_body(body, content_type, max_events=config.max_batch_events)
            except BodyError as exc:
                return problem_response(exc.status, exc.title, exc.detail)
            checked = [validate(i, item, received_at=received_at) for i, item in enumerate(items)]
        results: dict[int, EventResult] = {}
        valid: list[Valid] = []
        first_in_request: dict[str, str] = {}
        for item in checked:
            if isinstance(item, Invalid):
                results[item.index] = _rejected(
                    item.index, item.event_id, item.status, item.title, item.detail
                )
            elif item.event_id in first_in_request:  # the same id twice in one request
                if first_in_request[item.event_id] == item.digest:
                    results[item.index] = EventResult(
                        index=item.index, id=item.event_id, status="duplicate"
                    )
                else:
                    results[item.index] = _rejected(
                        item.index,
                        item.event_id,
                        409,
                        "Event id conflict",
                        "another event of this request has this id with other content",
                    )
            else:
                first_in_request[item.event_id] = item.digest
                valid.append(item)
        if valid:
            await _produce(config, state["pump"], idempotency, valid, results)
        ordered = tuple(results[i] for i in range(len(items)))
        accepted = sum(1 for r in ordered if r.status == "accepted")
        duplicates = sum(1 for r in ordered if r.status == "duplicate")
        rejected = len(ordered) - accepted - duplicates
        for outcome, count in (
            ("accepted", accepted),
            ("duplicate", duplicates),
            ("rejected", rejected),
        ):
            if count:
                metrics.INGEST_EVENTS.labels(outcome).inc(count)
        if rejected and not (accepted or duplicates):
            statuses = {r.error.status for r in ordered if r.error is not None}
            status = statuses.pop() if len(statuses) == 1 else 400
            if not batch:
                only = ordered[0].error
                assert only is not None
                return problem_response(only.status, only.title, only.detail, id=ordered[0].id)
            return problem_response(
                status,
                "No event taken",
                f"all {rejected} event(s) were rejected",
                results=[r.model_dump(mode="json", exclude_none=True) for r in ordered],
            )
        response = IngestResponse(
            accepted=accepted, duplicates=duplicates, rejected=rejected, results=ordered
        )
        status = 207 if rejected else 200
        metrics.INGEST_REQUESTS.labels(str(status)).inc()
        return web.Response(
            body=response.model_dump_json(exclude_none=True).encode(),
            status=status,
            content_type="application/json",
        )

    async def get_metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    async def get_health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_post("/v1/events", post_events)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/health", get_health)
    return app


def _rejected(
    index: int, event_id: str | None, status: int, title: str, detail: str
) -> EventResult:
    return EventResult(
        index=index,
        id=event_id,
        status="rejected",
        error=Problem(title=title, status=status, detail=detail),
    )


async def _produce(
    config: EdgeConfig,
    pump: DeliveryPump,
    idempotency: Idempotency,
    valid: list[Valid],
    results: dict[int, EventResult],
) -> None:
    """Claim, produce, wait for every delivery report; fill ``results``."""
    loop = asyncio.get_running_loop()
    pairs = [(v.event_id, v.digest) for v in valid]
    claims = await loop.run_in_executor(None, idempotency.claim, pairs)
    to_send: list[Valid] = []
    for item, claim in zip(valid, claims, strict=True):
        if claim is Claim.DUPLICATE:
            results[item.index] = EventResult(
                index=item.index, id=item.event_id, status="duplicate"
            )
        elif claim is Claim.CONFLICT:
            results[item.index] = _rejected(
                item.index,
                item.event_id,
                409,
                "Event id conflict",
                "an event with this id and other content was accepted before; send a new id",
            )
        else:
            to_send.append(item)
    if not to_send:
        return
    started = time.perf_counter()
    future = pump.produce_all(config.topic, to_send)
    try:
        reports: list[Delivery] | None = await asyncio.wait_for(
            asyncio.shield(future), config.delivery_timeout_s
        )
    except TimeoutError:
        reports = None
    delivered: list[tuple[str, str]] = []
    failed: list[tuple[str, str]] = []
    for i, item in enumerate(to_send):
        report = reports[i] if reports is not None else None
        if report is not None and report[0] is None:
            results[item.index] = EventResult(
                index=item.index,
                id=item.event_id,
                status="accepted",
                partition=report[1],
                offset=report[2],
            )
            delivered.append((item.event_id, item.digest))
        else:
            reason = "no delivery report in time" if report is None else str(report[0])
            results[item.index] = _rejected(item.index, item.event_id, 503, "Not delivered", reason)
            failed.append((item.event_id, item.digest))
    metrics.INGEST_PRODUCE_SECONDS.observe(time.perf_counter() - started)
    if delivered:
        await loop.run_in_executor(None, idempotency.done, delivered)
    if failed:
        log.warning("ingest: %d event(s) not delivered", len(failed))
        await loop.run_in_executor(None, idempotency.release, failed)


def serve(
    config: EdgeConfig, *, producer: Producer, keys: ApiKeyFile, idempotency: Idempotency
) -> None:
    """Serve the edge on ``config.host:port`` until SIGTERM/SIGINT (then flush the producer)."""
    app = create_edge(
        config,
        pump_factory=lambda loop: DeliveryPump(producer, loop),
        keys=keys,
        idempotency=idempotency,
    )
    log.info("ingest edge on http://%s:%d → %s", config.host, config.port, config.topic)
    # reuse_port: several edge processes may serve one port (the kernel spreads the
    # connections); the edge keeps no state of its own, so it scales by processes.
    web.run_app(
        app, host=config.host, port=config.port, print=None, access_log=None, reuse_port=True
    )
