"""The wired runs of the commands that produce or publish: ``import focus``,
``import events``, ``close-period``, ``plans publish``, and the clients of the demo
and the drill.

Part of the composition root (:mod:`streams.bootstrap`): only entry points import it.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from streams.adapters.lease import DEFAULT_KEY_PREFIX
from streams.apps.importers.close_period import (
    DEFAULT_SCAN_MARGIN,
    CloseSummary,
    close_period,
    workers_committed,
)
from streams.apps.importers.events_import import EventsImportSummary, import_events
from streams.apps.importers.focus_import import (
    FLUSH_TIMEOUT_S,
    IMPORT_PRODUCER_OVERRIDES,
    ImportSummary,
    import_focus,
)
from streams.bootstrap.clients import (
    connection,
    postgres_pool,
    producer,
    reader,
    redis_client,
    scan_consumer,
)
from streams.settings import Settings

if TYPE_CHECKING:  # imported when called: the demo and the drill pull in the fake services
    from streams.apps.importers.price_book import PublishSummary
    from streams.devtools.demo.drafts import DraftsDemoClients
    from streams.devtools.demo.lifecycle import LifecycleClients
    from streams.devtools.demo.pricing.run import PricingDemoClients
    from streams.devtools.demo.run import DemoClients
    from streams.devtools.drill.run import DrillClients


def run_import_focus(
    path: Path,
    settings: Settings,
    *,
    progress: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
) -> ImportSummary:
    """:func:`streams.apps.importers.focus_import.import_focus` with a new :func:`producer`
    (flushed by the import; a producer has nothing to close), batching for throughput
    (:data:`streams.apps.importers.focus_import.IMPORT_PRODUCER_OVERRIDES`). Same errors."""
    return import_focus(
        path,
        settings,
        producer=producer(settings, **IMPORT_PRODUCER_OVERRIDES),
        progress=progress,
        flush_timeout_s=flush_timeout_s,
    )


def run_import_events(
    path: Path,
    settings: Settings,
    *,
    progress: bool = True,
    flush_timeout_s: float = FLUSH_TIMEOUT_S,
) -> EventsImportSummary:
    """:func:`streams.apps.importers.events_import.import_events` with a new :func:`producer`.
    Same errors."""
    return import_events(
        path,
        settings,
        producer=producer(settings),
        progress=progress,
        flush_timeout_s=flush_timeout_s,
    )


def run_close_period(
    period: str,
    settings: Settings,
    *,
    lease_ttl_s: float = 30.0,
    progress: bool = True,
    holder: str | None = None,
    scan_margin: timedelta = DEFAULT_SCAN_MARGIN,
    lease_key_prefix: str = DEFAULT_KEY_PREFIX,
) -> CloseSummary:
    """:func:`streams.apps.importers.close_period.close_period` with its clients: a pool of 1-2
    connections (``close-period``), a Redis client, a producer, :func:`scan_consumer` and
    the invoicing workers' committed offsets (a :func:`reader` of ``worker.invoicing_group``);
    the pool and the Redis client are closed after the run. Same errors."""
    with (
        contextlib.closing(
            postgres_pool(settings, role="close", name="close-period", min_size=1, max_size=2)
        ) as pool,
        contextlib.closing(redis_client(settings)) as redis_conn,
    ):
        return close_period(
            period,
            settings,
            producer=producer(settings),
            redis_conn=redis_conn,
            pool=pool,
            scan_consumer=lambda: scan_consumer(settings),
            stored_offsets=workers_committed(
                lambda: reader(settings, settings.worker.invoicing_group)
            ),
            lease_ttl_s=lease_ttl_s,
            progress=progress,
            holder=holder,
            scan_margin=scan_margin,
            lease_key_prefix=lease_key_prefix,
        )


def run_publish_price_book(path: Path, settings: Settings, *, published_by: str) -> PublishSummary:
    """:func:`streams.apps.importers.price_book.publish_price_book` with a pool of 1 connection
    (``plans-publish``, closed after) and a new :func:`producer` (flushed by it). Same errors."""
    from streams.apps.importers.price_book import publish_price_book

    with contextlib.closing(
        postgres_pool(settings, name="plans-publish", role="pricing", min_size=1, max_size=1)
    ) as pool:
        return publish_price_book(
            path, settings, pool=pool, producer=producer(settings), published_by=published_by
        )


def naive_drill_redis(settings: Settings) -> redis.Redis:
    """The naive drill's Redis client: a plain one with a 10 s socket timeout, as the
    failed design's workers had (no retry policy of ours: it reproduces that design)."""
    return redis.Redis.from_url(
        settings.redis.url.get_secret_value(), socket_timeout=10, **settings.redis.client_kwargs()
    )


def drill_clients() -> DrillClients:
    """What ``invoicing drill`` runs through (:class:`streams.devtools.drill.run.DrillClients`)."""
    from streams.devtools.drill.run import DrillClients

    return DrillClients(redis=naive_drill_redis, producer=producer, close_period=run_close_period)


def demo_clients() -> DemoClients:
    """What ``invoicing demo`` runs through (:class:`streams.devtools.demo.run.DemoClients`)."""
    from streams.devtools.demo.run import DemoClients

    return DemoClients(
        import_focus=run_import_focus,
        close_period=run_close_period,
        database=lambda settings: connection(settings, role="operator"),
    )


def lifecycle_demo_clients() -> LifecycleClients:
    """What ``invoicing demo --scenario lifecycle`` runs through
    (:class:`streams.devtools.demo.lifecycle.LifecycleClients`)."""
    from streams.devtools.demo.lifecycle import LifecycleClients

    return LifecycleClients(
        close_period=run_close_period,
        database=lambda settings, role: connection(settings, role=role),
    )


def pricing_demo_clients() -> PricingDemoClients:
    """What ``invoicing demo --scenario pricing`` runs through
    (:class:`streams.devtools.demo.pricing.run.PricingDemoClients`; the price book is published by
    the ``invoicing plans publish`` command, run as a process)."""
    from streams.devtools.demo.pricing.run import PricingDemoClients

    return PricingDemoClients(
        import_events=run_import_events,
        close_period=run_close_period,
        database=lambda settings: connection(settings, role="operator"),
    )


def drafts_demo_clients() -> DraftsDemoClients:
    """What ``invoicing demo --scenario drafts`` runs through
    (:class:`streams.devtools.demo.drafts.DraftsDemoClients`): close-period, a connection of
    a named role (``operator`` to read, ``admin`` to finalise), a producer."""
    from streams.devtools.demo.drafts import DraftsDemoClients

    return DraftsDemoClients(
        close_period=run_close_period,
        database=lambda settings, role: connection(settings, role=role),
        producer=lambda settings: producer(settings),
    )
