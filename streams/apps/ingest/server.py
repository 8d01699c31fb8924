"""The HTTP ingest edge: ``POST /v1/events`` → ``billing.account-events.v1`` (aiohttp).

For systems without a Kafka client. A request is answered only after the broker
confirmed delivery of every record it produced (``acks=all``, idempotent
producer, murmur2 on the customer id: :func:`streams.adapters.kafka.producer_config`),
with one result per event in request order (:class:`~streams.core.domain.http.IngestResponse`):

* 200 — every event accepted or a duplicate;
* 207 — some rejected: each rejected result carries its problem (status, title, detail);
* 4xx — nothing taken: ``application/problem+json`` (RFC 9457), with ``results`` for a
  batch whose every event was refused; 401 without a valid bearer key, 403 for a key
  without the ``ingest`` scope, 413 over the
  body or batch limit, 415 another media type, 400 malformed JSON;
* 403 — an event outside its key's scope (problem type :data:`OUT_OF_SCOPE`, naming the
  type, customer or source; docs/security.md "API keys");
* 429 — the key is over its rate limit or its bound on requests in flight, with
  ``Retry-After``; 503 — the edge is over its total bound, or the producer's queue is
  full (``Retry-After``, at once: nothing waits on the event loop);
* 504 — the broker did not confirm in time: the outcome is **unknown** (event status
  ``unknown``, problem type :data:`OUTCOME_UNKNOWN`); the record may still be delivered,
  and a retry is safe (the consumers deduplicate by event id).

Every request is logged with its key id; the key id also travels as the record header
:data:`KEY_ID_HEADER`, which the invoicing worker stores as lineage.

The edge writes nothing but the topic (and its Redis idempotency claims): no
invoice, no database. Poison never reaches the topic: an event is produced only
after the topic's own decoder accepted its record (:mod:`streams.apps.ingest.edge`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from confluent_kafka import KafkaError, Message, Producer
from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import SlidingWindowCounterRateLimiter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from streams.apps.ingest import metrics
from streams.apps.ingest.edge import (
    BATCH,
    BodyError,
    Invalid,
    Valid,
    media_type,
    parse_body,
    validate,
    validate_batch_fast,
)
from streams.apps.ingest.idempotency import Claim, Idempotency
from streams.apps.ingest.keys import SCOPE_INGEST, ApiKey, ApiKeyFile
from streams.core.domain.codec import KEY_ID_HEADER
from streams.core.domain.http import EventResult, IngestResponse, Problem

__all__ = ["KEY_ID_HEADER", "OUTCOME_UNKNOWN", "OUT_OF_SCOPE", "EdgeConfig", "create_edge", "serve"]

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"

#: A delivery report: (error text or None, partition, offset).
Delivery = tuple[str | None, int | None, int | None]

#: The report of a record the producer's local queue had no room for: never produced, so a
#: retry is safe (its claim is released) and the client is told when to retry.
QUEUE_FULL = "the producer's queue is full"

#: Problem type (RFC 9457 ``type``) of an event outside its key's scope (403).
OUT_OF_SCOPE = "https://invoicing-pipeline.invalid/problems/out-of-scope"

#: Problem type of an event whose delivery is unknown: the broker did not confirm it in
#: time, and it may still be delivered (504; event status ``unknown``).
OUTCOME_UNKNOWN = "https://invoicing-pipeline.invalid/problems/outcome-unknown"

#: ``Retry-After`` (seconds) of a 503: a queue full, or no delivery report in time.
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class EdgeConfig:
    """The edge's settings (:class:`streams.settings.IngestSettings`): bounds in bytes,
    events, seconds and requests; ``default_rate_limit`` in the ``limits`` library's
    notation (``200/second``), for keys without a rate limit of their own."""

    host: str
    port: int
    topic: str
    max_body_bytes: int
    max_batch_events: int
    delivery_timeout_s: float
    #: Requests in flight in this process, all keys together; beyond: 503.
    max_in_flight: int = 256
    #: Requests in flight in this process per key; beyond: 429.
    max_in_flight_per_key: int = 32
    default_rate_limit: str = "200/second"


class Admission:
    """Per-key rate limits (sliding window counters of the ``limits`` library, in this
    process's memory) and bounds on requests in flight, per key and in total. Runs on the
    event loop only (no lock). A refusal is ``(status, title, detail, Retry-After s)``."""

    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self._limiter = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._limits: dict[str, RateLimitItem] = {}
        self._per_key: dict[str, int] = {}
        self._total = 0

    def _limit(self, key: ApiKey) -> RateLimitItem:
        text = key.rate_limit or self.config.default_rate_limit
        item = self._limits.get(text)
        if item is None:
            item = self._limits[text] = parse(text)
        return item

    def enter(self, key: ApiKey) -> tuple[int, str, str, int] | None:
        """Admit a request of ``key`` (then :meth:`leave` once answered), or the refusal."""
        limit = self._limit(key)
        if not self._limiter.hit(limit, "key", key.key_id):
            reset = self._limiter.get_window_stats(limit, "key", key.key_id).reset_time
            wait = max(1, math.ceil(reset - time.time()))
            return 429, "Rate limit", f"key {key.key_id}: over {limit} requests", wait
        if self._per_key.get(key.key_id, 0) >= self.config.max_in_flight_per_key:
            return (
                429,
                "Too many requests in flight",
                f"key {key.key_id}: {self.config.max_in_flight_per_key} requests wait for the broker",
                RETRY_AFTER_S,
            )
        if self._total >= self.config.max_in_flight:
            return (
                503,
                "Edge busy",
                f"{self.config.max_in_flight} requests wait for the broker",
                RETRY_AFTER_S,
            )
        self._per_key[key.key_id] = self._per_key.get(key.key_id, 0) + 1
        self._total += 1
        return None

    def leave(self, key: ApiKey) -> None:
        self._total -= 1
        left = self._per_key[key.key_id] - 1
        if left:
            self._per_key[key.key_id] = left
        else:
            del self._per_key[key.key_id]


def problem_response(
    status: int,
    title: str,
    detail: str | None = None,
    *,
    retry_after: int | None = None,
    **extra: Any,
) -> web.Response:
    body = Problem(title=title, status=status, detail=detail, **extra)
    headers = {"WWW-Authenticate": 'Bearer realm="invoicing"'} if status == 401 else {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    elif status in (503, 504):
        headers["Retry-After"] = str(RETRY_AFTER_S)
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
            try:
                self.producer.produce(
                    topic,
                    key=record.key,
                    value=record.value,
                    headers=headers,
                    on_delivery=reporter(i),
                )
            except BufferError:
                # The local queue is full. Never wait for room here: this runs on the event
                # loop, and waiting stalled the whole edge, /health included. The rest of
                # the request is not produced; it is answered 503 with Retry-After at once.
                rest = len(items) - i
                for j in range(i, len(items)):
                    reports[j] = (QUEUE_FULL, None, None)
                with lock:
                    remaining[0] -= rest
                    last = remaining[0] == 0
                if last:
                    self.loop.call_soon_threadsafe(settle)
                break
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
    admission = Admission(config)

    async def post_events(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return problem_response(401, "Unauthorized", "send Authorization: Bearer <API key>")
        if not token.isascii():
            # keys are URL-safe ASCII; a header that is not UTF-8 arrives with surrogates
            return problem_response(401, "Unauthorized", "unknown or revoked API key")
        key = keys.verify(token.strip())
        if key is None:
            return problem_response(401, "Unauthorized", "unknown or revoked API key")
        if not key.allows(SCOPE_INGEST):
            log.info("ingest key=%s status=403 no %s scope", key.key_id, SCOPE_INGEST)
            return problem_response(403, "Forbidden", f"the key has no {SCOPE_INGEST!r} scope")
        refused = admission.enter(key)
        if refused is not None:
            status, title, detail, wait = refused
            log.info("ingest key=%s status=%d %s", key.key_id, status, title)
            return problem_response(status, title, detail, retry_after=wait)
        try:
            response = await _post_events(request, key)
        finally:
            admission.leave(key)
        log.info("ingest key=%s status=%d", key.key_id, response.status)
        return response

    async def _post_events(request: web.Request, key: ApiKey) -> web.Response:
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
                if first_in_request[item.event_id] == item.claim:
                    results[item.index] = EventResult(
                        index=item.index, id=item.event_id, status="duplicate"
                    )
                else:
                    results[item.index] = _rejected(
                        item.index,
                        item.event_id,
                        409,
                        "Event id conflict",
                        "another event of this request has this id with other content or source",
                    )
            elif (why := key.refusal(item.event_type, item.customer_id, item.source)) is not None:
                results[item.index] = _rejected(
                    item.index, item.event_id, 403, "Out of scope", why, OUT_OF_SCOPE
                )
            else:
                first_in_request[item.event_id] = item.claim
                valid.append(_with_key(item, key.key_id))
        if valid:
            await _produce(config, state["pump"], idempotency, valid, results)
        ordered = tuple(results[i] for i in range(len(items)))
        accepted = sum(1 for r in ordered if r.status == "accepted")
        duplicates = sum(1 for r in ordered if r.status == "duplicate")
        unknown = sum(1 for r in ordered if r.status == "unknown")
        rejected = len(ordered) - accepted - duplicates - unknown
        for outcome, count in (
            ("accepted", accepted),
            ("duplicate", duplicates),
            ("rejected", rejected),
            ("unknown", unknown),
        ):
            if count:
                metrics.INGEST_EVENTS.labels(outcome).inc(count)
        if unknown and not (accepted or duplicates or rejected):
            return problem_response(
                504,
                "Outcome unknown",
                f"the broker did not confirm {unknown} event(s) in time; they may still be "
                "delivered: retry with the same ids (a delivered one is deduplicated)",
                type=OUTCOME_UNKNOWN,
                results=[r.model_dump(mode="json", exclude_none=True) for r in ordered],
            )
        if rejected and not (accepted or duplicates or unknown):
            statuses = {r.error.status for r in ordered if r.error is not None}
            status = statuses.pop() if len(statuses) == 1 else 400
            if not batch:
                only = ordered[0].error
                assert only is not None
                return problem_response(
                    only.status, only.title, only.detail, id=ordered[0].id, type=only.type
                )
            return problem_response(
                status,
                "No event taken",
                f"all {rejected} event(s) were rejected",
                results=[r.model_dump(mode="json", exclude_none=True) for r in ordered],
            )
        response = IngestResponse(
            accepted=accepted,
            duplicates=duplicates,
            rejected=rejected,
            unknown=unknown,
            results=ordered,
        )
        status = 207 if rejected or unknown else 200
        metrics.INGEST_REQUESTS.labels(str(status)).inc()
        unavailable = any(r.error is not None and r.error.status in (503, 504) for r in ordered)
        return web.Response(
            body=response.model_dump_json(exclude_none=True).encode(),
            status=status,
            content_type="application/json",
            headers={"Retry-After": str(RETRY_AFTER_S)} if unavailable else None,
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
    index: int,
    event_id: str | None,
    status: int,
    title: str,
    detail: str,
    problem_type: str = "about:blank",
) -> EventResult:
    return EventResult(
        index=index,
        id=event_id,
        status="rejected",
        error=Problem(type=problem_type, title=title, status=status, detail=detail),
    )


def _with_key(item: Valid, key_id: str) -> Valid:
    """``item`` with the header :data:`KEY_ID_HEADER` naming the key that sent it."""
    record = item.record
    headers = [*record.headers, (KEY_ID_HEADER, key_id.encode())]
    return replace(item, record=replace(record, headers=headers))


async def _produce(
    config: EdgeConfig,
    pump: DeliveryPump,
    idempotency: Idempotency,
    valid: list[Valid],
    results: dict[int, EventResult],
) -> None:
    """Claim, produce, wait for every delivery report; fill ``results``."""
    loop = asyncio.get_running_loop()
    pairs = [(v.event_id, v.claim) for v in valid]
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
                "an event with this id and other content or source was accepted before; send a new id",
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
            delivered.append((item.event_id, item.claim))
        elif report is None:
            # Produced, not confirmed in time: it may still be delivered. Not a refusal.
            results[item.index] = EventResult(
                index=item.index,
                id=item.event_id,
                status="unknown",
                error=Problem(
                    type=OUTCOME_UNKNOWN,
                    title="Outcome unknown",
                    status=504,
                    detail=f"no delivery report in {config.delivery_timeout_s} s: it may "
                    "still be delivered; a retry with the same id is safe",
                ),
            )
            failed.append((item.event_id, item.claim))
        else:
            reason = str(report[0])
            if report[0] == QUEUE_FULL:
                reason = f"{QUEUE_FULL}: not produced, retry after {RETRY_AFTER_S} s"
            results[item.index] = _rejected(item.index, item.event_id, 503, "Not delivered", reason)
            failed.append((item.event_id, item.claim))
    metrics.INGEST_PRODUCE_SECONDS.observe(time.perf_counter() - started)
    if delivered:
        await loop.run_in_executor(None, idempotency.done, delivered)
    if failed:
        log.warning("ingest: %d event(s) not delivered or not confirmed", len(failed))
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
