"""The hosted page's routes (streams/apps/portal/server.py) on the twin document source,
served by aiohttp's test server on loopback: the answers, the 404s and the headers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from streams.adapters.documents.lines_csv import lines_csv
from streams.adapters.documents.pdf import render_pdf
from streams.adapters.documents.source import InMemoryDocuments
from streams.adapters.documents.tokens import PageLinks, TokenSigner
from streams.apps.portal.server import create_portal
from tests.unit.documents import samples

SIGNER = TokenSigner(["p" * 32])
LINKS = PageLinks("http://portal.test", SIGNER, timedelta(days=36500))


def run(
    check: Callable[[TestClient[Any, Any]], Any], health: Callable[[], None] = lambda: None
) -> None:
    documents = InMemoryDocuments()
    documents.put(samples.invoice())
    documents.put(samples.credit_note())
    documents.set_status(samples.INVOICE_ID, "superseded")

    async def main() -> None:
        async with TestClient(
            TestServer(create_portal(documents, SIGNER, health=health))
        ) as client:
            await check(client)

    asyncio.run(main())


def path_of(kind: str, document_id: str) -> str:
    url = LINKS.url(kind, document_id, samples.ISSUED)  # type: ignore[arg-type]
    return url.removeprefix("http://portal.test")


def test_the_page_and_its_pdf() -> None:
    async def check(client: TestClient[Any, Any]) -> None:
        page = await client.get(path_of("invoice", samples.INVOICE_ID))
        assert page.status == 200
        html = await page.text()
        assert "Compute line 2" in html and "38.35 USD" in html
        assert "&lt;Corp&gt; &amp; &#34;Sons&#34;" in html  # escaped
        assert "This invoice is superseded. Credited by CN-2026-10-000007." in html
        assert page.headers["Cache-Control"] == "private, no-store"
        assert page.headers["Referrer-Policy"] == "no-referrer"
        assert "script-src" not in page.headers["Content-Security-Policy"]
        token = path_of("invoice", samples.INVOICE_ID).split("?t=")[1]
        pdf = await client.get(f"/invoices/{samples.INVOICE_ID}/pdf?t={token}")
        assert pdf.status == 200 and pdf.content_type == "application/pdf"
        assert await pdf.read() == render_pdf(samples.invoice())
        assert f"/invoices/{samples.INVOICE_ID}/lines.csv?t={token}" in html
        lines = await client.get(f"/invoices/{samples.INVOICE_ID}/lines.csv?t={token}")
        assert lines.status == 200 and lines.content_type == "text/csv"
        assert await lines.read() == lines_csv(samples.invoice())
        assert lines.headers["Content-Disposition"] == (
            'attachment; filename="INV-2026-10-000042-lines.csv"'
        )
        assert lines.headers["Cache-Control"] == "private, no-store"
        note = await client.get(path_of("credit_note", samples.credit_note().document_id))
        assert note.status == 200 and "Credit note CN-2026-10-000007" in await note.text()

    run(check)


def test_bad_links_are_404_and_alike() -> None:
    expired = SIGNER.sign("invoice", samples.INVOICE_ID, datetime.now(UTC) - timedelta(seconds=1))
    unknown = "00000000-0000-4000-8000-000000000000"
    paths = [
        f"/invoices/{samples.INVOICE_ID}",  # no token
        f"/invoices/{samples.INVOICE_ID}?t=garbage",
        f"/invoices/{samples.INVOICE_ID}?t={expired}",
        f"/invoices/{samples.INVOICE_ID}/pdf?t={expired}",
        f"/invoices/{samples.INVOICE_ID}/lines.csv?t={expired}",
        # a credit note's token does not open the invoice, nor the other way round
        f"/invoices/{samples.INVOICE_ID}?t="
        + path_of("credit_note", samples.credit_note().document_id).split("?t=")[1],
        f"/credit-notes/{samples.INVOICE_ID}?t="
        + path_of("invoice", samples.INVOICE_ID).split("?t=")[1],
        path_of("invoice", unknown),  # a valid token of a document that is not stored
        "/invoices/not-a-uuid?t=x",
    ]

    async def check(client: TestClient[Any, Any]) -> None:
        bodies = set()
        for path in paths:
            response = await client.get(path)
            assert response.status == 404, path
            bodies.add(await response.text())
        assert len(bodies) == 1  # nothing tells the cases apart

    run(check)


def test_health_reports_the_database() -> None:
    async def ok(client: TestClient[Any, Any]) -> None:
        response = await client.get("/health")
        assert response.status == 200
        assert await response.json() == {"status": "ok", "database": "ok"}

    run(ok)

    def down() -> None:
        raise ConnectionRefusedError("no database")

    async def unavailable(client: TestClient[Any, Any]) -> None:
        response = await client.get("/health")
        assert response.status == 503
        assert (await response.json())["status"] == "unavailable"

    run(unavailable, health=down)
