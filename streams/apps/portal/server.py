"""The hosted invoice page: a small aiohttp server that shows a customer one document.

Routes (``{id}`` is the invoice revision's id or the credit note's id):

=====================================  ==============================================
``GET /invoices/{id}?t=TOKEN``         the invoice's page (HTML): its lines and totals,
                                       its status when it is no longer current, a link
                                       to the PDF
``GET /invoices/{id}/pdf?t=TOKEN``     the invoice's PDF (the bytes the email attached)
``GET /invoices/{id}/lines.csv?t=…``   every line as CSV (the bytes the email attached
                                       when the PDF shows only the largest lines)
``GET /credit-notes/{id}[/pdf]?t=…``   the same for a credit note
``GET /health``                        200 when the database answers, else 503 (JSON)
``GET /metrics``                       Prometheus
=====================================  ==============================================

A token that is forged, malformed, expired, or made for another document, and a document
that is not stored, all get the same **404** page: the answer tells nobody which
(:mod:`streams.adapters.documents.tokens`). The database unreachable is a 503.

Headers: ``Cache-Control: private, no-store`` and ``Referrer-Policy: no-referrer`` (the
token is in the URL and must not leak through a cache or a referrer), a Content Security
Policy that allows no script and no outside resource, ``X-Content-Type-Options: nosniff``.

The server reads through the read-only role ``postgres.portal`` (grants in
``streams/adapters/postgres/grants.py``: the document's columns, no email address) in
worker threads (psycopg's pool is synchronous), and renders the PDF in a thread too.

Metrics: ``invoicing_portal_requests_total{route, outcome}`` (outcome ``ok``,
``not_found``, ``unavailable``), ``invoicing_portal_pdf_seconds`` (render time).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from streams.adapters.documents.lines_csv import lines_csv, lines_csv_filename
from streams.adapters.documents.pdf import pdf_filename, render_pdf
from streams.adapters.documents.source import DocumentSource
from streams.adapters.documents.templates import render
from streams.adapters.documents.tokens import PageLinks, TokenSigner
from streams.core.billing.failures import classify
from streams.core.domain.documents import Document, DocumentKind

__all__ = ["PortalConfig", "create_portal", "serve"]

log = logging.getLogger("streams.apps.portal")

REQUESTS = Counter(
    "invoicing_portal_requests_total", "Requests of the hosted page.", ["route", "outcome"]
)
PDF_SECONDS = Histogram(
    "invoicing_portal_pdf_seconds",
    "Time to render one PDF (seconds).",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)

_SECURITY_HEADERS = {
    "Cache-Control": "private, no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'"
    ),
}
_KINDS: dict[str, DocumentKind] = {"invoices": "invoice", "credit-notes": "credit_note"}

T = TypeVar("T")


@dataclass(frozen=True)
class PortalConfig:
    """Where the page listens."""

    host: str
    port: int


class _Unavailable(Exception):
    """The database could not answer (a transient failure): 503."""


def _not_found(route: str) -> web.Response:
    REQUESTS.labels(route=route, outcome="not_found").inc()
    return web.Response(
        status=404,
        text=render("not_found.html.j2"),
        content_type="text/html",
        charset="utf-8",
        headers=_SECURITY_HEADERS,
    )


def create_portal(
    documents: DocumentSource,
    signer: TokenSigner,
    *,
    health: Callable[[], None],
) -> web.Application:
    """The page's aiohttp application.

    Args:
        documents: where documents are read (the portal's read-only pool).
        signer: verifies the links' tokens.
        health: raises when the database does not answer (``/health``).
    """
    app = web.Application()

    async def blocking(fn: Callable[[], T]) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(None, fn)
        except Exception as exc:
            if classify(exc).permanent:
                raise
            raise _Unavailable(str(exc)) from exc

    def target(request: web.Request) -> tuple[DocumentKind, str] | None:
        kind = _KINDS[request.match_info["folder"]]
        try:
            document_id = str(uuid.UUID(request.match_info["id"]))
        except ValueError:
            return None
        found = signer.verify(request.query.get("t", ""))
        if found is None or found.kind != kind or found.document_id != document_id:
            return None
        return kind, document_id

    def unavailable(route: str, exc: _Unavailable) -> web.HTTPServiceUnavailable:
        REQUESTS.labels(route=route, outcome="unavailable").inc()
        log.warning("portal: database unavailable: %s", exc)
        return web.HTTPServiceUnavailable(headers=_SECURITY_HEADERS)

    async def load(request: web.Request, route: str) -> tuple[DocumentKind, str, Document] | None:
        """The document the request's signed token grants (kind, id, document), or None
        (answer 404: a bad, expired or foreign token, or no such document).

        Raises:
            web.HTTPServiceUnavailable: the database did not answer (503, counted).
        """
        ref = target(request)
        if ref is None:
            return None
        kind, document_id = ref
        try:
            doc = await blocking(lambda: documents.load(kind, document_id))
        except _Unavailable as exc:
            raise unavailable(route, exc) from exc
        return None if doc is None else (kind, document_id, doc)

    async def page(request: web.Request) -> web.Response:
        route = "page"
        found = await load(request, route)
        if found is None:
            return _not_found(route)
        kind, document_id, doc = found
        try:
            state = await blocking(lambda: documents.state(kind, document_id))
        except _Unavailable as exc:
            raise unavailable(route, exc) from exc
        if state is None:
            return _not_found(route)
        base = PageLinks.path(kind, document_id)
        pdf_url = f"{base}/pdf?t={request.query['t']}"
        csv_url = f"{base}/lines.csv?t={request.query['t']}" if doc.lines else None
        REQUESTS.labels(route=route, outcome="ok").inc()
        return web.Response(
            text=render("page.html.j2", doc=doc, state=state, pdf_url=pdf_url, csv_url=csv_url),
            content_type="text/html",
            charset="utf-8",
            headers=_SECURITY_HEADERS,
        )

    async def pdf(request: web.Request) -> web.Response:
        route = "pdf"
        found = await load(request, route)
        if found is None:
            return _not_found(route)
        doc = found[2]
        started = time.perf_counter()
        body = await asyncio.get_running_loop().run_in_executor(None, render_pdf, doc)
        PDF_SECONDS.observe(time.perf_counter() - started)
        REQUESTS.labels(route=route, outcome="ok").inc()
        return web.Response(
            body=body,
            content_type="application/pdf",
            headers={
                **_SECURITY_HEADERS,
                "Content-Disposition": f'inline; filename="{pdf_filename(doc)}"',
            },
        )

    async def lines(request: web.Request) -> web.Response:
        route = "lines_csv"
        found = await load(request, route)
        if found is None:
            return _not_found(route)
        doc = found[2]
        REQUESTS.labels(route=route, outcome="ok").inc()
        return web.Response(
            body=lines_csv(doc),
            content_type="text/csv",
            charset="utf-8",
            headers={
                **_SECURITY_HEADERS,
                "Content-Disposition": f'attachment; filename="{lines_csv_filename(doc)}"',
            },
        )

    async def get_health(_: web.Request) -> web.Response:
        try:
            await blocking(health)
        except Exception as exc:  # any failure to answer is "not ready"
            return web.json_response(
                {"status": "unavailable", "database": type(exc).__name__}, status=503
            )
        return web.json_response({"status": "ok", "database": "ok"})

    async def get_metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    folders = "{folder:invoices|credit-notes}"
    app.router.add_get(f"/{folders}/{{id}}", page)
    app.router.add_get(f"/{folders}/{{id}}/pdf", pdf)
    app.router.add_get(f"/{folders}/{{id}}/lines.csv", lines)
    app.router.add_get("/health", get_health)
    app.router.add_get("/metrics", get_metrics)
    return app


def serve(config: PortalConfig, app: web.Application, **kwargs: Any) -> None:
    """Serve ``app`` on ``config.host:port`` until SIGTERM/SIGINT."""
    log.info("hosted invoice page on http://%s:%d", config.host, config.port)
    web.run_app(app, host=config.host, port=config.port, print=None, access_log=None, **kwargs)
