"""The long-running processes and the replay: the invoicing worker, the email
sender (each stopped by SIGTERM/SIGINT), and a replay run's clients.

Part of the composition root (:mod:`streams.bootstrap`): only entry points import it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

import redis
from confluent_kafka import Consumer, Producer
from psycopg_pool import ConnectionPool

from streams.adapters.kafka import make_consumer
from streams.bootstrap.clients import (
    consumer,
    postgres_pool,
    producer,
    redis_client,
    require_profile,
    tax_service,
)
from streams.bootstrap.runtime import tune_gc
from streams.core.billing.ports import TaxService
from streams.settings import Settings

if TYPE_CHECKING:  # imported when called: the demo and the drill pull in the fake services
    from streams.apps.email.prerender import Prerenderer
    from streams.apps.email.sender import EmailSender
    from streams.apps.invoicing.worker import InvoicingWorker
    from streams.apps.replay.report import ReplayReport
    from streams.apps.replay.run import ReplayClients

log = logging.getLogger("streams.bootstrap")


@contextmanager
def _stop_on_signals(stop: threading.Event, *, what: str) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while the block runs (main thread only); the
    previous handlers are restored on exit."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping the %s", signum, what)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def invoicing_worker(
    settings: Settings,
    *,
    pool: ConnectionPool[Any],
    tax: TaxService,
    stop: threading.Event | None = None,
) -> InvoicingWorker:
    """An invoicing worker on ``pool`` and ``tax``, with its own consumer of group
    ``settings.worker.invoicing_group`` and producer (the worker closes the consumer
    and flushes the producer when :meth:`~streams.apps.invoicing.worker.InvoicingWorker.run`
    ends)."""
    from streams.apps.invoicing.worker import InvoicingWorker

    return InvoicingWorker(
        settings,
        pool=pool,
        tax=tax,
        consumer=consumer(settings, settings.worker.invoicing_group),
        producer=producer(settings),
        stop=stop,
        shutdown_grace_s=settings.worker.shutdown_grace_s,
    )


def run_invoicing_worker(
    settings: Settings, *, stop: threading.Event | None = None, install_signal_handlers: bool = True
) -> dict[str, int]:
    """Build a worker from settings, run it until stopped (``stop`` set, or SIGTERM/SIGINT
    when ``install_signal_handlers``), and return its counters by name (records stored,
    invoices written, fencing refusals, ...). Closes the pool, Redis and tax clients it built.

    Raises:
        KafkaException: a fatal consumer error (see :meth:`InvoicingWorker.run`).
        psycopg_pool.PoolTimeout: the database did not answer within 30 s at start.
    """
    require_profile(settings)
    stop = stop or threading.Event()
    if install_signal_handlers:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    pool = postgres_pool(
        settings,
        role="worker",
        name="invoicing-worker",
        max_size=max(settings.postgres.pool_max_size, settings.worker.max_jobs + 2),
    )
    redis_conn = redis_client(settings)
    tax = tax_service(settings, redis_conn)
    try:
        worker = invoicing_worker(settings, pool=pool, tax=tax, stop=stop)
        tune_gc(settings.worker.gc_threshold)
        worker.run()
        return dict(worker.stats)
    finally:
        tax.close()
        redis_conn.close()
        pool.close()


def email_sender(
    settings: Settings,
    *,
    pool: ConnectionPool[Any],
    consumer: Consumer,
    producer: Producer,
    stop: threading.Event | None = None,
    prerender: Prerenderer | None = None,
) -> EmailSender:
    """An email sender on ``pool`` that commits ``consumer``'s offsets, sends through
    SMTP (``settings.smtp``) and dead-letters undecodable records with ``producer`` to
    ``billing.invoices.dlq.v1`` (prefixed); with ``prerender``, the PDFs of the records
    polled next are rendered ahead in its processes (the caller closes it).

    Raises:
        EmailConfigurationError: invalid ``settings.smtp.from_address``.
    """
    from streams.adapters.documents.source import PostgresDocuments
    from streams.adapters.smtp import SmtpTransport
    from streams.apps.email.sender import EmailSender, invoices_dlq_topic
    from streams.bootstrap.portal import page_links
    from streams.core.billing.dead_letters import DeadLetters

    return EmailSender(
        settings,
        pool,
        consumer=consumer,
        transport=SmtpTransport(settings.smtp),
        stop=stop,
        dead_letters=DeadLetters(
            producer, invoices_dlq_topic(settings), settings.worker.email_group
        ),
        documents=PostgresDocuments(pool),
        links=page_links(settings),
        prerender=prerender,
    )


def run_email_sender(
    settings: Settings,
    *,
    stop: threading.Event | None = None,
    pool: ConnectionPool[Any] | None = None,
    consumer: Consumer | None = None,
) -> None:
    """Run the email sender until ``stop`` is set (or SIGTERM/SIGINT arrives).

    Builds what is not given from ``settings``: the pool, and a consumer of group
    ``settings.worker.email_group`` (manual commits); always a producer for its
    dead letters. Subscribes the consumer to the invoices topic and serves metrics
    (:func:`streams.apps.email.sender.serve`).

    Shutdown: when ``stop`` is None, SIGTERM and SIGINT set an internal stop event
    (installed only when called from the main thread; the previous handlers are
    restored on return). The record in hand is finished and its offset committed
    (a record still failing transiently is left uncommitted, for redelivery); then
    the consumer and pool this function built are closed. A given consumer or pool
    is left open: its owner closes it.

    Raises:
        EmailConfigurationError: invalid ``settings.smtp.from_address``.
        KafkaException: a fatal consumer error.
        psycopg_pool.PoolTimeout: the database did not answer at start (30 s).
    """
    from streams.apps.email.prerender import Prerenderer
    from streams.apps.email.sender import serve

    require_profile(settings)
    stop_event = stop or threading.Event()
    with ExitStack() as owned:
        if stop is None:
            owned.enter_context(_stop_on_signals(stop_event, what="email sender"))
        owned.callback(log.info, "email sender stopped")
        the_pool = pool
        if the_pool is None:
            the_pool = postgres_pool(settings, role="email", name="email-sender")
            owned.callback(the_pool.close)
        the_consumer = consumer
        if the_consumer is None:
            the_consumer = make_consumer(settings.kafka, settings.worker.email_group)
            owned.callback(the_consumer.close)
        prerender = None
        if settings.worker.email_render_processes:
            prerender = Prerenderer(
                settings.worker.email_render_processes,
                limit=settings.worker.email_render_ahead,
                timeout_s=settings.worker.email_render_timeout_s,
            )
            owned.callback(prerender.close)
        sender = email_sender(
            settings,
            pool=the_pool,
            consumer=the_consumer,
            producer=producer(settings),
            stop=stop_event,
            prerender=prerender,
        )
        serve(sender, the_consumer, settings)


@contextmanager
def replay_clients(
    settings: Settings,
    *,
    pool: ConnectionPool[Any] | None = None,
    redis_conn: redis.Redis | None = None,
    tax: TaxService | None = None,
) -> Iterator[ReplayClients]:
    """The clients of a replay run: the given ones, the others built from ``settings``
    and closed when the block ends: a pool of ``tax.max_concurrency + 1`` connections (a
    dry run compares that many customers at once,
    :func:`streams.apps.replay.run.compare_customers`); Redis; the HTTP tax client with
    its Redis cache, whose quotes never come from cached rates (a replay prices with the
    rates the service applies now, or a rate change would not show as a difference) but
    from the rates this run's own answers taught it
    (docs/decisions/0100-replay-quotes-from-the-runs-rates.md). Consumers are made per
    group by the run (and closed by it)."""
    from streams.apps.replay.run import ReplayClients

    with ExitStack() as owned:
        if pool is None:
            pool = postgres_pool(
                settings,
                role="replay",
                name="replay",
                min_size=1,
                max_size=settings.tax.max_concurrency + 1,
            )
            owned.callback(pool.close)
        if redis_conn is None:
            redis_conn = redis_client(settings)
            owned.callback(redis_conn.close)
        if tax is None:
            http_tax = tax_service(
                settings,
                redis_conn,
                quotes_from_cached_rates=False,
                quotes_from_learned_rates=True,
            )
            owned.callback(http_tax.close)
            tax = http_tax

        def new_consumer(group_id: str, **overrides: Any) -> Consumer:
            return consumer(settings, group_id, **overrides)

        yield ReplayClients(pool=pool, redis=redis_conn, tax=tax, new_consumer=new_consumer)


def replay_period(
    period: str,
    settings: Settings,
    *,
    pool: ConnectionPool[Any] | None = None,
    redis_conn: redis.Redis | None = None,
    tax: TaxService | None = None,
    **options: Any,
) -> ReplayReport:
    """:func:`streams.apps.replay.run.replay_period` with :func:`replay_clients` (the given
    clients, the others built from ``settings`` and closed at the end). ``options``:
    ``mode`` (required), ``margin``, ``progress``, ``holder``, ``lease_ttl_s``,
    ``lease_key_prefix``, ``on_step``.

    Raises:
        InvalidPeriod: ``period`` is not ``YYYY-MM`` (before any client is built); and
        everything :func:`streams.apps.replay.run.replay_period` raises.
    """
    from streams.apps.replay.run import replay_period as run_replay
    from streams.core.domain.periods import BillingPeriod

    BillingPeriod.parse(period)
    with replay_clients(settings, pool=pool, redis_conn=redis_conn, tax=tax) as clients:
        return run_replay(period, settings, clients, **options)


# ================================================================================================
# The usage view and the HTTP ingest edge (docs/usage-api.md): their faust app, price book source,
# producer, Redis idempotency store and API keys, built from settings. Only
# streams.entrypoints.usage (and tests) call these.
# ================================================================================================
