"""The hosted invoice page's wiring: the links' secret, the links every email carries, and
the ``invoicing worker portal`` process."""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

from streams.adapters.documents.tokens import PageLinks, TokenSigner
from streams.settings import Settings

__all__ = ["page_links", "portal_secret_path", "portal_secrets", "run_portal"]


def portal_secret_path(settings: Settings) -> Path:
    """The secret's file (``settings.portal.token_secret_file``, default under ``.local/data``)."""
    return (
        settings.portal.token_secret_file or settings.stack.local_dir / "data" / "portal-token.key"
    )


def _file_secret(path: Path) -> str:
    """The secret in ``path``, created (32 random bytes, URL-safe text, mode 0600) when the
    file does not exist; a concurrent creator's secret wins (``O_EXCL``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
    text = path.read_text().strip()
    if not text:  # created but not yet written by another process: read again
        text = path.read_text().strip()
    return text


def portal_secrets(settings: Settings) -> list[str]:
    """The links' secrets, the signing one first: ``settings.portal.token_secret`` (else
    the file of :func:`portal_secret_path`), then ``previous_secrets``.

    Raises:
        ValueError: a secret shorter than 32 bytes (from :class:`TokenSigner`).
    """
    portal = settings.portal
    primary = (
        portal.token_secret.get_secret_value()
        if portal.token_secret is not None
        else _file_secret(portal_secret_path(settings))
    )
    return [primary, *(s.get_secret_value() for s in portal.previous_secrets)]


def page_links(settings: Settings) -> PageLinks:
    """The hosted page's links (``settings.portal.public_url``, ``token_ttl_days``)."""
    return PageLinks(
        settings.portal.public_url,
        TokenSigner(portal_secrets(settings)),
        timedelta(days=settings.portal.token_ttl_days),
    )


def run_portal(settings: Settings, *, port: int | None = None) -> None:
    """Serve the hosted page until SIGTERM/SIGINT, reading through the ``portal`` role."""
    from streams.adapters.documents.source import PostgresDocuments
    from streams.apps.portal.server import PortalConfig, create_portal, serve
    from streams.bootstrap.clients import postgres_pool

    pool = postgres_pool(
        settings, role="portal", name="portal", max_size=settings.portal.pool_max_size
    )

    def health() -> None:
        with pool.connection(timeout=2.0) as conn:
            conn.execute("SELECT 1")

    app = create_portal(PostgresDocuments(pool), page_links(settings).signer, health=health)

    async def close_pool(_: object) -> None:
        pool.close()

    app.on_cleanup.append(close_pool)
    config = PortalConfig(settings.portal.host, port if port is not None else settings.portal.port)
    serve(config, app)
