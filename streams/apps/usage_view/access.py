"""Who may ask the usage view, and where a request may be forwarded (docs/usage-api.md,
"Authentication" and "Forwarding").

Pure rules (no I/O): the endpoint in :mod:`streams.apps.usage_view.app` applies them.

* A request needs ``Authorization: Bearer <API key>``: a live key of the edge's key
  store (the file ``ingest.api_keys_file``, shared by the edge and the view) with the
  ``usage:read`` scope. No or a wrong key: 401; a key without the scope: 403. A key
  limited to some customers (its ``customers`` list or ``customer_prefix``,
  docs/security.md "API keys") reads only those: 403 for any other
  (:func:`authorize_customer`).
* Forwarding to a partition's owner goes only to a member of the view's consumer group
  (a URL the group's assignment advertises), carries only :data:`FORWARDED_HEADERS`
  (the caller's bearer key, which the owner checks again, and ``Accept``) plus the hop
  header :data:`HOP_HEADER`; a request that already made its hop is answered by the
  instance it reached or refused with 508, never forwarded again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from yarl import URL

from streams.errors import InvoicingError

#: The scope a key needs to read usage (the key store's ``usage:read``).
READ_SCOPE = "usage:read"
#: Set on a forwarded request (value ``1``): its receiver never forwards it again.
HOP_HEADER = "X-Usage-View-Hop"
#: The only caller headers a forwarded request carries (cookies, proxy credentials and
#: any other header are dropped).
FORWARDED_HEADERS = ("Authorization", "Accept")


class Key(Protocol):
    """A verified key (the edge's ``ApiKey``)."""

    @property
    def key_id(self) -> str: ...

    def allows(self, scope: str) -> bool: ...

    def may_read(self, customer_id: str) -> bool: ...


class KeyStore(Protocol):
    """The key store (the edge's ``ApiKeyFile``): the live key a token is, or ``None``."""

    def verify(self, token: str) -> Key | None: ...


class Refused(InvoicingError):
    """A request the view answers with a problem: ``status``, ``title``, ``detail``."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status, self.title, self.detail = status, title, detail


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (scheme case-insensitive), else ``None``."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def authorize(headers: Mapping[str, str], keys: KeyStore) -> Key:
    """The caller's key, when it may read usage.

    Raises:
        Refused: 401 no bearer key, or an unknown/revoked/malformed one; 403 a live key
            without :data:`READ_SCOPE`.
    """
    token = bearer_token(headers)
    if token is None:
        raise Refused(401, "Unauthorized", "send Authorization: Bearer <API key>")
    key = keys.verify(token)
    if key is None:
        raise Refused(401, "Unauthorized", "unknown or revoked API key")
    if not key.allows(READ_SCOPE):
        raise Refused(403, "Forbidden", f"key {key.key_id} has no {READ_SCOPE!r} scope")
    return key


def authorize_customer(key: Key, customer_id: str) -> None:
    """Refuse ``key`` reading ``customer_id`` when its customer restriction excludes it.

    Raises:
        Refused: 403 ``customer_id`` is outside the key's customers or prefix.
    """
    if not key.may_read(customer_id):
        raise Refused(403, "Forbidden", f"key {key.key_id} may not read customer {customer_id!r}")


def ident(url: URL | str) -> tuple[str, int]:
    """``(host, port)`` of ``url`` (port 80 when absent), how instances are compared."""
    u = URL(url) if isinstance(url, str) else url
    return (u.host or "", int(u.port or 80))


def forward_target(
    owner: URL, *, me: URL | str, members: Iterable[str], hop: str | None
) -> URL | None:
    """Where to send a request whose key the group's assignment places at ``owner``:
    ``None`` to answer here (``owner`` is this instance ``me``), else the owner's base URL.

    Raises:
        Refused: 508 the request already made its hop (``hop`` set) and this instance is
            not the owner (the group is rebalancing: the caller retries); 502 ``owner`` is
            not a member of the group (``members``: the URLs its assignment advertises)
            or not ``http``.
    """
    if ident(owner) == ident(me):
        return None
    if hop is not None:
        raise Refused(
            508,
            "Loop detected",
            f"forwarded once already and {ident(me)} does not own the key; retry shortly",
        )
    if owner.scheme != "http" or ident(owner) not in {ident(m) for m in members}:
        raise Refused(502, "Owner not in group", f"{owner} is not an instance of the view")
    return URL.build(scheme="http", host=owner.host or "", port=owner.port)


def forwarded_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of the forwarded request: :data:`FORWARDED_HEADERS` present in the
    caller's ``headers``, and ``HOP_HEADER: 1``."""
    out = {name: headers[name] for name in FORWARDED_HEADERS if name in headers}
    out[HOP_HEADER] = "1"
    return out
