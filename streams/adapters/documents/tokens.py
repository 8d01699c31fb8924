"""Signed, expiring links to a document's hosted page (docs/decisions/0051-hosted-page-tokens.md).

A token is ``itsdangerous.URLSafeSerializer`` over ``{"k": kind, "d": document id,
"e": expiry}`` (expiry in whole seconds since the epoch, UTC), signed with HMAC-SHA256
under the portal's secret and the salt :data:`SALT`:

* **unguessable**: without the secret nobody can make a valid token (256-bit key);
* **bound to one document**: the page checks that the token names the document of the
  URL, so a token of one invoice opens no other;
* **expiring**: ``e`` is checked against the clock; an expired token is refused like a
  forged one (the page answers 404 to both, and tells neither apart);
* **deterministic**: the expiry derives from the document's issue time
  (``issued_at + ttl``), never from the clock at sending, so a resent email carries the
  same link (the email is a function of the document and the event id).

Rotation: the signing secret is the first of ``secrets``; the others still verify
(tokens in emails already sent keep working until they expire).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from itsdangerous import BadData, URLSafeSerializer

from streams.core.domain.documents import DocumentKind

__all__ = ["SALT", "PageLinks", "TokenSigner", "TokenTarget"]

#: Separates these tokens from any other use of the same secret.
SALT: Final = "invoicing.hosted-page.v1"
_KINDS: Final = ("invoice", "credit_note")


@dataclass(frozen=True)
class TokenTarget:
    """What a valid token opens: a document and until when (UTC)."""

    kind: DocumentKind
    document_id: str
    expires_at: datetime


class TokenSigner:
    """Makes and checks hosted-page tokens.

    Args:
        secrets: the signing secret first, then older secrets that still verify; each at
            least 32 bytes.

    Raises:
        ValueError: no secret, or one shorter than 32 bytes.
    """

    def __init__(self, secrets: Sequence[str]) -> None:
        if not secrets:
            raise ValueError("the hosted page needs a token secret")
        if any(len(s.encode()) < 32 for s in secrets):
            raise ValueError("a hosted-page token secret must be at least 32 bytes")
        # itsdangerous signs with the last key and verifies with all of them
        self._serializer = URLSafeSerializer(
            list(reversed(secrets)),
            salt=SALT,
            signer_kwargs={"digest_method": hashlib.sha256},
        )

    def sign(self, kind: DocumentKind, document_id: str, expires_at: datetime) -> str:
        """The token of ``kind``/``document_id`` valid until ``expires_at`` (UTC-aware)."""
        payload = {"k": kind, "d": document_id.lower(), "e": int(expires_at.timestamp())}
        return str(self._serializer.dumps(payload))

    def sign_for(
        self, kind: DocumentKind, document_id: str, issued_at: datetime, ttl: timedelta
    ) -> str:
        """:meth:`sign` with the expiry ``issued_at + ttl`` (deterministic per document)."""
        return self.sign(kind, document_id, issued_at + ttl)

    def verify(self, token: str, *, now: datetime | None = None) -> TokenTarget | None:
        """The target of ``token``, or None when it is forged, malformed or expired
        (``now`` defaults to the clock, UTC)."""
        try:
            payload: Any = self._serializer.loads(token)
        except (BadData, ValueError, TypeError):
            return None
        if not isinstance(payload, dict) or set(payload) != {"k", "d", "e"}:
            return None
        kind, document_id, expiry = payload["k"], payload["d"], payload["e"]
        if kind not in _KINDS or not isinstance(document_id, str) or type(expiry) is not int:
            return None
        expires_at = datetime.fromtimestamp(expiry, UTC)
        if expires_at <= (now or datetime.now(UTC)):
            return None
        return TokenTarget(kind, document_id, expires_at)


class PageLinks:
    """The links of the hosted page: ``{public_url}/invoices/{id}?t=TOKEN`` (credit notes:
    ``/credit-notes/{id}``), valid ``ttl`` after the document was issued.

    Args:
        public_url: the page's address as customers reach it (no trailing slash needed).
    """

    def __init__(self, public_url: str, signer: TokenSigner, ttl: timedelta) -> None:
        self._base = public_url.rstrip("/")
        self.signer = signer
        self.ttl = ttl

    @staticmethod
    def path(kind: DocumentKind, document_id: str) -> str:
        """``/invoices/{id}`` or ``/credit-notes/{id}``."""
        folder = "invoices" if kind == "invoice" else "credit-notes"
        return f"/{folder}/{document_id.lower()}"

    def url(self, kind: DocumentKind, document_id: str, issued_at: datetime) -> str:
        """The page's link of a document (deterministic: same document, same link)."""
        token = self.signer.sign_for(kind, document_id, issued_at, self.ttl)
        return f"{self._base}{self.path(kind, document_id)}?t={token}"
