"""The composition root: the one module that builds pools, clients and workers from settings.

Everything else receives what it needs as arguments (docs/conventions.md "One composition root").
Nothing is built at import time; each factory builds on call, and the caller owns (and closes) what
it gets. Clients: :func:`postgres_pool`, :func:`redis_client`, :func:`tax_service`,
:func:`producer`, :func:`consumer`. Processes: :func:`invoicing_worker` /
:func:`run_invoicing_worker` (the invoicing worker), :func:`email_sender` / :func:`run_email_sender`
(the email sender), :func:`replay_clients` / :func:`replay_period` (a replay run). The worker, the
email sender and the replay import nothing from here; only entrypoints do.

Database roles (docs/roles.md): every pool and connection names the login it uses —
the invoicing worker ``worker``, the email sender ``email``, close-period ``close``, a
replay run ``replay``, the status view and the read-only commands ``operator``, the
operator commands that write ``admin``. Nothing here connects as the owner (migrations,
:mod:`streams.adapters.postgres.migrate`) or the provisioner (sandbox databases).

Modules: :mod:`~streams.bootstrap.clients` (pools, clients, producers, consumers),
:mod:`~streams.bootstrap.commands` (the wired runs of import, close-period, plans
publish; demo and drill clients), :mod:`~streams.bootstrap.processes` (the invoicing
worker, the email sender, a replay run), :mod:`~streams.bootstrap.view` (the usage
view, the ingest edge, the usage API client).
"""

from __future__ import annotations

from streams.bootstrap.clients import (
    connect_client,
    connection,
    consumer,
    outbox_connector_status,
    postgres_pool,
    producer,
    reader,
    redis_client,
    require_profile,
    scan_consumer,
    status_sources,
    tax_service,
    topic_reader,
)
from streams.bootstrap.commands import (
    demo_clients,
    drafts_demo_clients,
    drill_clients,
    lifecycle_demo_clients,
    naive_drill_redis,
    pricing_demo_clients,
    run_close_period,
    run_import_events,
    run_import_focus,
    run_publish_price_book,
)
from streams.bootstrap.portal import page_links, portal_secrets, run_portal
from streams.bootstrap.processes import (
    email_sender,
    invoicing_worker,
    replay_clients,
    replay_period,
    run_email_sender,
    run_invoicing_worker,
)
from streams.bootstrap.view import (
    api_key_store,
    api_keys_path,
    run_ingest_edge,
    run_usage_view,
    usage_client,
    view_config,
    view_price_books,
)

__all__ = [
    "api_key_store",
    "api_keys_path",
    "connect_client",
    "connection",
    "consumer",
    "demo_clients",
    "drafts_demo_clients",
    "drill_clients",
    "email_sender",
    "invoicing_worker",
    "lifecycle_demo_clients",
    "naive_drill_redis",
    "outbox_connector_status",
    "page_links",
    "portal_secrets",
    "postgres_pool",
    "pricing_demo_clients",
    "producer",
    "reader",
    "redis_client",
    "replay_clients",
    "replay_period",
    "require_profile",
    "run_close_period",
    "run_email_sender",
    "run_import_events",
    "run_import_focus",
    "run_ingest_edge",
    "run_invoicing_worker",
    "run_portal",
    "run_publish_price_book",
    "run_usage_view",
    "scan_consumer",
    "status_sources",
    "tax_service",
    "topic_reader",
    "usage_client",
    "view_config",
    "view_price_books",
]
