"""The usage view: a faust-streaming app over ``billing.account-events.v1`` (docs/usage-api.md).

One consumer group of its own (``settings.view.group``, the faust app id), so it
reads every account event without touching the invoicing workers' offsets. Faust
assigns the source topic's partitions across the instances and co-partitions the
tables' changelog topics with them: the instance that owns source partition N
owns changelog partition N of every table, because faust writes a table change to
the **same partition number as the event being processed** (``Table.partition_for_key``
returns ``event.message.partition``; ``use_partitioner`` stays off).

HTTP (faust's aiohttp web server on ``--port``; faust's own ``/table`` and
``/router`` endpoints are off: they would serve stored customer state to anyone):

* ``GET /v1/customers/{id}/usage?period=YYYY-MM`` — needs a bearer key with the
  ``usage:read`` scope (:mod:`streams.apps.usage_view.access`); answered by the
  owner of the customer's partition, found by faust's router
  (``app.router.key_store``): faust hashes the key serialised by the ``customers``
  table (raw UTF-8 bytes of the customer id) with the producer's partitioner over
  the changelog topic's partitions. Another instance forwards the request itself
  (:meth:`UsageEndpoint.forward`: group members only, the caller's key and
  ``Accept`` only, one hop, ``forward_timeout_s``). aiokafka's ``DefaultPartitioner`` is murmur2 (Java's
  ``Utils.murmur2``, masked positive, modulo the partition count), the same as
  librdkafka's ``murmur2_random`` for a non-empty key and the Java client's
  default, so the owner found is the owner of the partition our producers wrote
  the customer to (``tests/unit/usage_view/test_partitioning.py`` pins it).
* ``GET /metrics`` — Prometheus; ``GET /health`` — 200 once the app runs.

Records are applied a batch at a time (``take_events``; :class:`Batch`): each changed
key is written once per batch, to the changelog partition of the record that changed
it last (docs/usage-api.md, "Throughput").

Tables (values in :mod:`streams.apps.usage_view.state`): ``customers``, ``periods``,
``event_ids``, ``usage_days``. Memory: the store is ``memory://`` (default) or ``rocksdb://``
(``rocksdict``); a timer drops periods closed longer than the retention (and
their event ids), writing tombstones to the right changelog partitions so a
restarted instance does not bring them back (docs/decisions/0098-usage-view-state.md).

A record that does not decode is counted, logged and noted on its customer; the
view never writes a dead-letter topic (the invoicing workers dead-letter the same
record in ``billing.account-events.dlq.v1``; a second copy would mean two things).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import faust
from faust.web import Request, Response, View
from faust.web.exceptions import ServiceUnavailable
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import TypeAdapter, ValidationError
from yarl import URL

from streams.apps.usage_view import metrics, state
from streams.apps.usage_view.access import (
    HOP_HEADER,
    KeyStore,
    Refused,
    authorize,
    authorize_customer,
    forward_target,
    forwarded_headers,
)
from streams.apps.usage_view.batch import (
    Batch,
    ChangelogDeliveries,
    SourceRecord,
    current_records,
    guard_commits,
    withhold,
)
from streams.apps.usage_view.event_index import Chunks, EventIndex
from streams.apps.usage_view.preview import preview
from streams.apps.usage_view.price_book import PriceBookSource, refresh_for_metrics
from streams.apps.usage_view.retention import expire
from streams.core.domain.codec import decode
from streams.core.domain.errors import DomainError, InvalidEvent
from streams.core.domain.events import CustomerId, Envelope, UsageMetered, event_models
from streams.core.domain.http import Problem
from streams.core.domain.periods import BillingPeriod
from streams.core.domain.rating import RatingError
from streams.topics import ACCOUNT_EVENTS, TopicSpec

log = logging.getLogger(__name__)

_CUSTOMER_ID: TypeAdapter[str] = TypeAdapter(CustomerId)
_ACCOUNT_MODELS = event_models(ACCOUNT_EVENTS.event_types)
PROBLEM_JSON = "application/problem+json"


@dataclass(frozen=True)
class RocksDBBounds:
    """The memory one RocksDB database of the view may use (docs/usage-api.md "Memory
    bounds"). faust opens one database per table partition an instance holds (standby
    copies included), each with its own block cache and memtables, so an instance's
    bound is ``tables * partitions held * (block_cache_bytes + write_buffer_bytes *
    max_write_buffers)`` (:meth:`per_database_bytes`). faust's defaults are a 2 GiB
    block cache and 3 memtables of 64 MiB per database.

    * ``block_cache_bytes`` — LRU cache of uncompressed blocks read (bytes, default 4 MiB);
    * ``write_buffer_bytes`` — one memtable (bytes, default 2 MiB);
    * ``max_write_buffers`` — memtables held at once (default 2: one filling, one
      flushing).
    """

    block_cache_bytes: int = 4 * 1024 * 1024
    write_buffer_bytes: int = 2 * 1024 * 1024
    max_write_buffers: int = 2

    def per_database_bytes(self) -> int:
        """The most one database's cache and memtables hold (bytes)."""
        return self.block_cache_bytes + self.write_buffer_bytes * self.max_write_buffers

    def table_options(self) -> dict[str, int]:
        """faust's RocksDB ``Table(options=…)`` (``faust.stores.rocksdb.RocksDBOptions``)."""
        return {
            "block_cache_size": self.block_cache_bytes,
            # the python-rocksdb driver's compressed cache (rocksdict has none)
            "block_cache_compressed_size": self.block_cache_bytes,
            "write_buffer_size": self.write_buffer_bytes,
            "max_write_buffer_number": self.max_write_buffers,
        }


@dataclass(frozen=True)
class ViewConfig:
    """What one view instance runs with (built from settings by :mod:`streams.bootstrap`).

    * ``app_id`` — faust app id: the consumer group, and the prefix of the changelog
      topics (``<app_id>-<table>-changelog``);
    * ``brokers`` — ``host:port`` list; ``source_topic`` and its ``partitions``
      (the changelog topics get as many: faust refuses a mismatch);
    * ``host``/``port`` — the web server; ``canonical_url`` is ``http://host:port``
      (``advertised_host`` in place of ``host`` when given)
      and is what other instances route to;
    * ``store`` — ``memory://`` or ``rocksdb://``; ``datadir`` — faust's data folder
      (RocksDB files, per instance and port);
    * ``standby_replicas`` — standby copies of each table partition kept warm by
      other instances (0: a new owner recovers from the changelog);
    * ``retain_closed``/``retain_open`` — how long a closed period (after its close
      marker) / a period never closed (after its month) stays in the tables;
    * ``cleanup_interval_s`` — how often the retention runs;
    * ``changelog_linger_s``/``changelog_batch_bytes`` — the changelog producer's
      linger (default 10 ms) and batch size (default 512 KiB, under the broker's
      1 MB message limit); batches are lz4-compressed;
    * ``batch_max_records``/``batch_wait_s`` — source records applied as one batch: at
      most this many (default 2,000), or what arrived within this wait (seconds,
      default 0.1: what an idle view adds to an answer's freshness);
    * ``forward_timeout_s`` — longest wait for the owner of a partition to answer a
      forwarded request (seconds, default 2; then 504);
    * ``rocksdb`` — the memory bounds of each RocksDB database (:class:`RocksDBBounds`;
      ignored by the memory store).
    """

    app_id: str
    brokers: str
    source_topic: str
    partitions: int
    host: str
    port: int
    store: str
    datadir: Path
    standby_replicas: int
    retain_closed: timedelta
    retain_open: timedelta
    cleanup_interval_s: float
    commit_interval_s: float = 1.0
    advertised_host: str | None = None
    #: Replication of the changelog topics (the settings' replication of the source topic).
    replication_factor: int = 1
    min_insync_replicas: int = 1
    #: faust's ``broker_credentials`` (TLS / SASL of the brokers, built by
    #: :func:`streams.adapters.kafka.faust_credentials`); None: plaintext.
    broker_credentials: Any = None
    forward_timeout_s: float = 2.0
    changelog_linger_s: float = 0.010
    changelog_batch_bytes: int = 524_288
    batch_max_records: int = 2_000
    batch_wait_s: float = 0.100
    rocksdb: RocksDBBounds = field(default_factory=RocksDBBounds)

    @property
    def canonical_url(self) -> str:
        """Where the other instances forward this instance's customers' requests:
        ``http://{advertised_host or host}:{port}``."""
        return f"http://{self.advertised_host or self.host}:{self.port}"


def problem(
    view: View, status: int, title: str, detail: str | None = None, **extra: Any
) -> Response:
    """An RFC 9457 problem details response (401s carry ``WWW-Authenticate: Bearer``)."""
    body = Problem(title=title, status=status, detail=detail, **extra)
    headers = {"WWW-Authenticate": 'Bearer realm="invoicing"'} if status == 401 else None
    return view.bytes(
        body.model_dump_json(exclude_none=True).encode(),
        content_type=PROBLEM_JSON,
        status=status,
        headers=headers,
    )


def metered_metrics(envelopes: list[Envelope | InvalidEvent]) -> set[str]:
    """The metric codes of the ``usage.metered`` events among ``envelopes``."""
    return {
        envelope.data.metric
        for envelope in envelopes
        if isinstance(envelope, Envelope) and isinstance(envelope.data, UsageMetered)
    }


def usable_customer_id(key: bytes | None) -> str | None:
    """The record key as a customer id, when it is one (else ``None``)."""
    if key is None:
        return None
    try:
        return _CUSTOMER_ID.validate_python(key.decode("utf-8"))
    except (UnicodeDecodeError, ValidationError):
        return None


def create_app(config: ViewConfig, price_books: PriceBookSource, *, keys: KeyStore) -> faust.App:
    """The view's faust app (not started: :func:`run_view` runs it); ``keys`` checks the
    bearer keys of the usage API (the edge's key store).

    Nothing connects before the worker starts; the app id, topics and tables are
    declared here.
    """
    config.datadir.mkdir(parents=True, exist_ok=True)
    app = faust.App(
        config.app_id,
        broker=[f"kafka://{b.strip()}" for b in config.brokers.split(",") if b.strip()],
        broker_credentials=config.broker_credentials,
        store=config.store,
        datadir=str(config.datadir),
        autodiscover=False,
        web_enabled=True,
        # faust's /table (reads any table key) and /router (the group's topology) are
        # off; routing goes through app.router in-process (UsageEndpoint.forward)
        web_tables_enabled=False,
        web_router_enabled=False,
        web_host=config.host,
        web_bind=config.host,
        web_port=config.port,
        canonical_url=config.canonical_url,
        topic_partitions=config.partitions,
        topic_replication_factor=config.replication_factor,
        table_standby_replicas=config.standby_replicas,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=config.commit_interval_s,
        producer_acks=-1,
        # the changelog writes (2-3 records per event) go out in large lz4 batches
        # instead of aiokafka's 16 KB, no-linger default: docs/usage-api.md, "Throughput"
        producer_linger=config.changelog_linger_s,
        producer_max_batch_size=config.changelog_batch_bytes,
        producer_compression_type="lz4",
        key_serializer="raw",
        value_serializer="json",
        stream_wait_empty=False,
    )
    # every commit waits for the changelog records of the batches it commits
    deliveries = ChangelogDeliveries()
    guard_commits(app, deliveries)
    source = app.topic(
        config.source_topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=config.partitions,
    )

    def table(name: str, help_text: str) -> Any:
        return app.Table(
            name,
            default=None,
            # key_type=bytes: faust derives the changelog key serializer from the key type
            # ("raw" for bytes, else JSON): the key must be the raw customer id bytes for
            # routing to hash what our producers hash
            key_type=bytes,
            partitions=config.partitions,
            help=help_text,
            # bounded caches and memtables per database (docs/usage-api.md "Memory bounds");
            # a fresh dict per table: faust's RocksDB store pops keys from the one it gets
            options=config.rocksdb.table_options() if config.store.startswith("rocksdb") else None,
        )

    customers = table("customers", "customer id → customer state (name, currency, subscriptions)")
    periods = table("periods", "customer|period → usage to date of that billing period")
    event_ids = table(
        "event_ids",
        "chunks of event ids, one per batch and (partition, period): "
        "'\\x00partition|period|first offset|part' → {event id: 'digest period partition offset'}",
    )
    #: the lookups of event ids, in memory (streams/apps/usage_view/event_index.py)
    index = EventIndex()
    usage_days = table("usage_days", "customer|period|day → that day's metered aggregates")
    next_offsets: dict[int, int] = {}

    def decoded(record: SourceRecord) -> Envelope | InvalidEvent:
        """``record`` decoded, or why it does not decode."""
        try:
            return decode(record.key, record.value, record.headers, allowed=_ACCOUNT_MODELS)
        except InvalidEvent as exc:
            return exc

    def handle(
        batch: Batch, chunks: Chunks, record: SourceRecord, envelope: Envelope | InvalidEvent
    ) -> tuple[str, str]:
        """Apply ``record`` (decoded as ``envelope``) to ``batch`` (the event ids it
        records to ``index`` and ``chunks``); returns its ``(event type, outcome)``."""
        key, partition, offset = record.key, record.partition, record.offset
        if isinstance(envelope, InvalidEvent):
            exc = envelope
            customer_id = usable_customer_id(key)
            change = state.refused(
                batch.get(customers, customer_id.encode(), partition) if customer_id else None,
                customer_id,
                partition,
                str(exc),
            )
            log.warning(
                "usage view: refused record %s[%d]@%d (key %r): %s",
                config.source_topic,
                partition,
                offset,
                customer_id,
                exc,
            )
            if change.customer is not None and customer_id is not None:
                batch.put(customers, customer_id.encode(), change.customer, partition)
            return "unknown", change.outcome.value
        # a metric this book lacks was looked up before the batch (refresh_for_metrics)
        book, _ = price_books.current()
        customer_key = envelope.subject.encode()
        period_name = state.event_period(envelope.data)
        key_of_period = state.period_key(envelope.subject, period_name) if period_name else None
        day_key = state.usage_day_key(envelope.subject, envelope.data)
        try:
            change = state.apply(
                envelope,
                partition=partition,
                offset=offset,
                customer=batch.get(customers, customer_key, partition),
                period=batch.get(periods, key_of_period.encode(), partition)
                if key_of_period
                else None,
                seen=index.get(partition, envelope.id),
                book=book,
                now=datetime.now(UTC),
                day=batch.get(usage_days, day_key.encode(), partition) if day_key else None,
            )
        except (DomainError, RatingError) as exc:
            # Valid by the contract, but not aggregatable (e.g. the stored usage is of
            # another shape): counted and noted like an unreadable record.
            change = state.refused(
                batch.get(customers, customer_key, partition),
                envelope.subject,
                partition,
                f"{type(exc).__name__}: {exc}",
            )
            log.error(
                "usage view: record %s[%d]@%d not applied: %s",
                config.source_topic,
                partition,
                offset,
                exc,
            )
        if change.day is not None and change.day_key is not None:
            batch.put(usage_days, change.day_key.encode(), change.day, partition)
        if change.period is not None and change.period_key is not None:
            batch.put(periods, change.period_key.encode(), change.period, partition)
        if change.event_id_value is not None and change.event_id is not None:
            index.add(partition, change.event_id, change.event_id_value)
            chunks.add(partition, change.event_id, change.event_id_value)
        if change.customer is not None:
            batch.put(customers, customer_key, change.customer, partition)
        if change.outcome is state.Outcome.CONFLICT:
            log.warning("usage view: %s", change.detail)
        return envelope.type, change.outcome.value

    def apply_batch(
        records: list[SourceRecord], envelopes: list[Envelope | InvalidEvent]
    ) -> tuple[Counter[tuple[str, str]], list[Any]]:
        """Apply ``records`` (in order, decoded as ``envelopes``) and write each changed
        key once; no ``await`` between the first read and the last write, so no
        rebalance or timer runs in between (docs/usage-api.md, "Throughput"). Returns
        the outcomes counted per (event type, outcome) and the changelog records queued
        (:attr:`Batch.sent`)."""
        batch = Batch()
        chunks = Chunks()
        outcomes: Counter[tuple[str, str]] = Counter()
        for record, envelope in zip(records, envelopes, strict=True):
            chunks.first_offset(record.partition, record.offset)
            try:
                outcomes[handle(batch, chunks, record, envelope)] += 1
            except Exception:
                log.critical(
                    "usage view: crashed on %s[%d]@%d",
                    config.source_topic,
                    record.partition,
                    record.offset,
                    exc_info=True,
                )
                raise
        for key, ids, partition in chunks.items():
            batch.put(event_ids, key, dict(ids), partition)
        for name, count in batch.write().items():
            metrics.VIEW_KEYS_WRITTEN.labels(name).inc(count)
        metrics.VIEW_BATCH_RECORDS.observe(len(records))
        return outcomes, batch.sent

    @app.agent(source, name="account-events")
    async def account_events(stream: Any) -> None:
        # A batch at a time: faust acknowledges a batch's events once this body has
        # applied them and tracked their changelog records; a commit waits for those
        # records to be on the broker (ChangelogDeliveries: faust's own flush before a
        # commit does not make sure of it).
        async for events in stream.take_events(config.batch_max_records, config.batch_wait_s):
            generation = app.consumer_generation_id
            records = current_records(events, generation)
            if not records:
                continue
            envelopes = [decoded(record) for record in records]
            # a book published a moment ago may define a metric this one lacks: look now,
            # off the event loop (rare: a new metric's first events)
            if (
                await refresh_for_metrics(price_books, metered_metrics(envelopes))
                and app.consumer_generation_id != generation
            ):
                # a rebalance came during the look: none of these records is current now
                current_records(events, app.consumer_generation_id)
                continue
            # the ids of the owned partitions, built again after a rebalance from what
            # faust recovered (streams/apps/usage_view/event_index.py)
            owned = {
                tp.partition
                for tp in app.assignor.assigned_actives()
                if tp.topic == config.source_topic
            }
            index.ensure(event_ids, generation, owned | {r.partition for r in records})
            try:
                outcomes, sent = apply_batch(records, envelopes)
            except Exception as exc:
                # A bug, not bad input (bad input is refused above): stop the instance
                # loudly rather than skip the records; its partitions move to another
                # instance, which retries from the last committed offset (apply_batch
                # logged the record). Withheld: faust acknowledges the events of a body
                # that raised and commits on an agent's error.
                withhold(events)
                await app.crash(exc)
                raise
            # before faust acknowledges the events: their offsets' commit waits for these
            deliveries.track(sent)
            for (event_type, outcome), count in outcomes.items():
                metrics.VIEW_RECORDS.labels(event_type, outcome).inc(count)
            applied_at = time.time()
            for record in records:
                next_offsets[record.partition] = record.offset + 1
            for partition in {record.partition for record in records}:
                metrics.VIEW_LAST_APPLIED.labels(str(partition)).set(applied_at)

    async def report_lag() -> None:
        owned = {tp for tp in app.consumer.assignment() if tp.topic == config.source_topic}
        for tp in owned:
            try:
                high = app.consumer.highwater(tp)
            except Exception:
                continue
            if high is None:
                continue
            position = next_offsets.get(tp.partition)
            if position is None:
                position = await app.consumer.position(tp) or 0
            metrics.VIEW_LAG.labels(str(tp.partition)).set(max(0, int(high) - int(position)))

    async def retention() -> None:
        expire(app, config, customers, periods, event_ids, usage_days, index)

    app.timer(interval=5.0)(report_lag)
    app.timer(interval=config.cleanup_interval_s)(retention)

    served_by = config.canonical_url

    @app.page("/v1/customers/{customer_id}/usage")
    class UsageEndpoint(View):
        """``GET /v1/customers/{id}/usage?period=YYYY-MM`` (id percent-encoded; bearer key
        with ``usage:read``)."""

        async def get(self, request: Request, customer_id: str) -> Response:
            started = time.perf_counter()
            try:
                key = authorize(request.headers, keys)
            except Refused as exc:
                metrics.VIEW_REQUESTS.labels(str(exc.status), "local").inc()
                return problem(self, exc.status, exc.title, exc.detail)
            text = request.query.get("period")
            if text is None:
                text = str(BillingPeriod.of(datetime.now(UTC)))
            try:
                period = BillingPeriod.parse(text)
            except DomainError as exc:
                metrics.VIEW_REQUESTS.labels("400", "local").inc()
                return problem(self, 400, "Bad period", str(exc))
            try:
                _CUSTOMER_ID.validate_python(customer_id)
            except ValidationError:
                metrics.VIEW_REQUESTS.labels("404", "local").inc()
                return problem(
                    self, 404, "Unknown customer", f"{customer_id!r} is not a customer id"
                )
            try:
                authorize_customer(key, customer_id)
            except Refused as exc:
                metrics.VIEW_REQUESTS.labels(str(exc.status), "local").inc()
                return problem(self, exc.status, exc.title, exc.detail)
            try:
                target = self.owner(request, customer_id)
            except ServiceUnavailable:
                metrics.VIEW_REQUESTS.labels("503", "routed").inc()
                return problem(self, 503, "Owner unknown", "the view is rebalancing; retry shortly")
            except Refused as exc:
                metrics.VIEW_REQUESTS.labels(str(exc.status), "routed").inc()
                return problem(self, exc.status, exc.title, exc.detail)
            if target is None:
                response = self.owned(customer_id=customer_id, period=period)
            else:
                response = await self.forward(request, target, customer_id, str(period))
            metrics.VIEW_REQUEST_SECONDS.observe(time.perf_counter() - started)
            return response

        def owner(self, request: Request, customer_id: str) -> URL | None:
            """The base URL of the instance to forward to, ``None``: answer here.

            Raises:
                ServiceUnavailable: no owner known (rebalancing).
                Refused: 508 a second hop; 502 the owner is not of the group.
            """
            try:
                owner = app.router.key_store(customers.name, customer_id)
            except KeyError as exc:
                raise ServiceUnavailable() from exc
            return forward_target(
                owner,
                me=served_by,
                members=app.assignor.tables_metadata().keys(),
                hop=request.headers.get(HOP_HEADER),
            )

        async def forward(
            self, request: Request, target: URL, customer_id: str, period: str
        ) -> Response:
            """The owner's answer (status, body and media type as it sent them): 504 when it
            does not answer within ``forward_timeout_s``, 503 when it cannot be reached."""
            url = str(target) + usage_path(customer_id, period)
            try:
                async with app.http_client.get(
                    url,
                    headers=forwarded_headers(request.headers),
                    timeout=aiohttp.ClientTimeout(total=config.forward_timeout_s),
                    allow_redirects=False,
                ) as answer:
                    body = await answer.read()
                    status, media = answer.status, answer.content_type
            except TimeoutError:
                metrics.VIEW_REQUESTS.labels("504", "routed").inc()
                return problem(
                    self,
                    504,
                    "Owner timed out",
                    f"{target} did not answer within {config.forward_timeout_s} s",
                )
            except (aiohttp.ClientError, OSError) as exc:  # it may have just died
                metrics.VIEW_REQUESTS.labels("503", "routed").inc()
                return problem(self, 503, "Owner unreachable", f"{type(exc).__name__}: {exc}")
            metrics.VIEW_REQUESTS.labels(str(status), "routed").inc()
            return self.bytes(body, content_type=media, status=status)

        def owned(self, *, customer_id: str, period: BillingPeriod) -> Response:
            customer = customers.get(customer_id.encode())
            if customer is None:
                metrics.VIEW_REQUESTS.labels("404", "local").inc()
                return problem(
                    self,
                    404,
                    "Unknown customer",
                    f"no event of customer {customer_id!r} has reached the view",
                )
            book, label = price_books.current()
            period_state = periods.get(state.period_key(customer_id, str(period)).encode())
            days = {
                day: usage_days.get(f"{customer_id}|{period}|{day}".encode()) or state.new_day()
                for day in (period_state or {}).get("usage_days", [])
            }
            try:
                answer = preview(
                    customer,
                    period_state,
                    period,
                    days=days,
                    book=book,
                    book_label=label,
                    served_by=served_by,
                    partition=int(customer["partition"]),
                )
            except RatingError as exc:
                log.exception("usage view: cannot rate %s %s", customer_id, period)
                metrics.VIEW_REQUESTS.labels("500", "local").inc()
                return problem(self, 500, "Cannot rate", str(exc))
            metrics.VIEW_REQUESTS.labels("200", "local").inc()
            return self.json(answer.model_dump(mode="json"))

    @app.page("/metrics")
    class MetricsEndpoint(View):
        async def get(self, request: Request) -> Response:
            return self.bytes(generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/health")
    class HealthEndpoint(View):
        async def get(self, request: Request) -> Response:
            owned = sorted(
                tp.partition for tp in app.consumer.assignment() if tp.topic == config.source_topic
            )
            return self.json({"status": "ok", "instance": served_by, "partitions": owned})

    _ = account_events, report_lag, retention
    return app


TABLES = ("customers", "periods", "event_ids", "usage_days")


def changelog_topics(config: ViewConfig) -> tuple[TopicSpec, ...]:
    """The tables' changelog topics as faust names them (``<app id>-<table>-changelog``),
    compacted, with the source topic's partition count and the configured replication. Created before the app starts
    (:func:`streams.bootstrap.run_usage_view`): a topic that faust creates itself can
    still show 0 partitions in its consumer's metadata when the first record is
    handled, and faust then refuses the write (``PartitionsMismatch``)."""
    return tuple(
        TopicSpec(
            name=f"{config.app_id}-{name}-changelog",
            partitions=config.partitions,
            key=name,
            description=f"changelog of the usage view's {name} table",
            cleanup_policy="compact",
            replication_factor=config.replication_factor,
            extra_config={"min.insync.replicas": str(config.min_insync_replicas)},
        )
        for name in TABLES
    )


def tables_of(app: faust.App) -> tuple[Any, ...]:
    """``(customers, periods, event_ids, usage_days)`` of a view app."""
    return tuple(app.tables[name] for name in TABLES)


def usage_path(customer_id: str, period: str | None = None) -> str:
    """The request path of a customer's usage (the id percent-encoded, ``/`` included)."""
    path = f"/v1/customers/{quote(customer_id, safe='')}/usage"
    return path if period is None else f"{path}?period={period}"


def run_view(
    app: faust.App, *, loglevel: str = "INFO", on_started: Callable[[], None] | None = None
) -> None:
    """Run ``app`` in this process until SIGTERM/SIGINT (faust's worker: it installs the
    signal handlers, leaves the group and flushes the changelogs on the way out)."""
    from faust.worker import Worker

    worker = Worker(app, loglevel=loglevel, override_logging=False, quiet=True)
    if on_started is not None:
        on_started()
    worker.execute_from_commandline()
