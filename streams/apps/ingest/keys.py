"""API keys of the ingest edge, hashed at rest in one JSON file.

A key is ``ik_<key id>.<secret>`` (the id: 8 hex characters; the secret: 32 random
bytes, URL-safe base64). The file keeps, per key id, the **SHA-256 of the whole
key**, a name, and the creation and revocation times (UTC) — never the key, which
``invoicing keys create`` prints once. A fast hash is the right one here: the
keys are random with 256 bits of entropy, so there is nothing to guess (a slow
password hash such as scrypt protects low-entropy passwords, and would cost every
request milliseconds). Comparison is constant-time (:func:`hmac.compare_digest`).

The file is written atomically (temporary file + rename, mode 0600) and the edge
re-reads it when its modification time changes, so a revocation takes effect on
the next request without a restart. Several edge instances share the file (a
mounted secret in production). A change (``create``, ``revoke``) reads the file and
writes it back under an exclusive ``flock`` of ``<file>.lock`` beside it, so two
processes changing keys at once never lose one change (a ``create`` beside a
``revoke`` used to be able to write the key file back without the revocation;
docs/security.md "The ingest edge").

**Scope** (docs/security.md "API keys"): each key may carry permissions, every one
"anything" when absent: ``event_types`` (the CloudEvents types it may send),
``customers`` (a list of customer ids) or ``customer_prefix`` (an id prefix, e.g.
``eu-``; never both), ``sources`` (the CloudEvents ``source`` values it may send), and
``rate_limit`` (requests per window in the ``limits`` library's notation, e.g.
``100/second``; absent: the edge's default). :meth:`ApiKey.refusal` says which
permission an event falls outside. Keys written before restrictions existed have none: they
keep full access until rotated with a scope (``invoicing keys rotate``). ``rotate``
creates a key with the same name and scope, revokes the old one, and records
``rotated_from``.

**Scopes** (docs/usage-api.md, "Authentication"): besides those restrictions each key
carries what it may do at all — ``ingest`` (``POST /v1/events`` at the edge) and
``usage:read`` (``GET /v1/customers/{id}/usage`` at the usage view). A key stored
before scopes existed has none and gets :data:`DEFAULT_SCOPES` (``ingest`` only), so
existing edge keys keep working and read nothing. A read key's ``customers`` or
``customer_prefix`` limit which customers it may read (:meth:`ApiKey.may_read`);
``rotate`` keeps the scopes.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import os
import secrets
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from streams.errors import InvoicingError

#: What a key may do (docs/usage-api.md, "Authentication").
SCOPE_INGEST = "ingest"
SCOPE_USAGE_READ = "usage:read"
SCOPES = (SCOPE_INGEST, SCOPE_USAGE_READ)
#: The scopes of a key stored without any (written before scopes existed).
DEFAULT_SCOPES: tuple[str, ...] = (SCOPE_INGEST,)


class ApiKeyError(InvoicingError):
    """Root of the API key errors."""


class UnknownKey(ApiKeyError):
    """No key of that id in the file."""


class InvalidScope(ApiKeyError):
    """A scope that cannot be stored (a customer list and a prefix at once, an empty list,
    a rate limit ``limits`` cannot parse)."""


class UnknownScope(InvalidScope):
    """A scope not in :data:`SCOPES`, or none at all."""


@dataclass(frozen=True)
class ApiKey:
    """One stored key: its id, name, SHA-256 (hex), times (ISO 8601, UTC), restrictions
    (each ``None``: unrestricted; module docstring) and scopes (default
    :data:`DEFAULT_SCOPES`)."""

    key_id: str
    name: str
    sha256: str
    created_at: str
    revoked_at: str | None = None
    event_types: tuple[str, ...] | None = None
    customers: tuple[str, ...] | None = None
    customer_prefix: str | None = None
    sources: tuple[str, ...] | None = None
    rate_limit: str | None = None
    rotated_from: str | None = None
    scopes: tuple[str, ...] = DEFAULT_SCOPES

    @classmethod
    def from_json(cls, item: dict[str, object]) -> ApiKey:
        """A key as the file holds it (lists become tuples; no ``scopes``:
        :data:`DEFAULT_SCOPES`; unknown fields are an error)."""
        fields = dict(item)
        if fields.get("scopes") is None:
            fields.pop("scopes", None)
        for name in ("event_types", "customers", "sources", "scopes"):
            value = fields.get(name)
            if isinstance(value, list):
                fields[name] = tuple(str(v) for v in value)
        return cls(**fields)  # type: ignore[arg-type]

    def allows(self, scope: str) -> bool:
        """Whether this key carries ``scope`` (one of :data:`SCOPES`)."""
        return scope in self.scopes

    def may_read(self, customer_id: str) -> bool:
        """Whether this key's customer restriction (``customers`` or ``customer_prefix``)
        lets it read ``customer_id``'s usage; the scope ``usage:read`` is checked apart."""
        if self.customers is not None and customer_id not in self.customers:
            return False
        return self.customer_prefix is None or customer_id.startswith(self.customer_prefix)

    def refusal(self, event_type: str, customer_id: str, source: str) -> str | None:
        """Why this key may not send an event of ``event_type`` for ``customer_id`` from
        ``source`` (the permission it falls outside, naming the value), or ``None``."""
        if self.event_types is not None and event_type not in self.event_types:
            return f"type {event_type!r} is not one of this key's types ({', '.join(self.event_types)})"
        if self.customers is not None and customer_id not in self.customers:
            return f"customer {customer_id!r} is not one of this key's customers"
        if self.customer_prefix is not None and not customer_id.startswith(self.customer_prefix):
            return f"customer {customer_id!r} does not start with this key's prefix {self.customer_prefix!r}"
        if self.sources is not None and source not in self.sources:
            return f"source {source!r} is not one of this key's sources"
        return None

    def scope_text(self) -> str:
        """The scope in one line, for ``invoicing keys list``."""
        parts = [
            "types " + (",".join(self.event_types) if self.event_types is not None else "*"),
            "customers "
            + (
                ",".join(self.customers)
                if self.customers is not None
                else f"{self.customer_prefix}*"
                if self.customer_prefix is not None
                else "*"
            ),
            "sources " + (",".join(self.sources) if self.sources is not None else "*"),
        ]
        if self.rate_limit is not None:
            parts.append(f"rate {self.rate_limit}")
        return "; ".join(parts)


def check_scope(
    *,
    scopes: Sequence[str] = DEFAULT_SCOPES,
    customers: Sequence[str] | None,
    customer_prefix: str | None,
    event_types: Sequence[str] | None,
    sources: Sequence[str] | None,
    rate_limit: str | None,
) -> None:
    """Refuse a scope that cannot be stored.

    Raises:
        UnknownScope: a scope not in :data:`SCOPES`, or none.
        InvalidScope: customers and a prefix at once, an empty list or prefix, or a rate
            limit the ``limits`` library cannot parse.
    """
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise UnknownScope(f"scopes {unknown or '(none)'}: each must be one of {SCOPES}")
    if customers is not None and customer_prefix is not None:
        raise InvalidScope("give a customer list or a customer prefix, not both")
    for label, values in (
        ("customers", customers),
        ("event types", event_types),
        ("sources", sources),
    ):
        if values is not None and not values:
            raise InvalidScope(f"an empty list of {label} would refuse everything; omit it for all")
    if customer_prefix == "":
        raise InvalidScope("an empty customer prefix is every customer; omit it")
    if rate_limit is not None:
        from limits import parse

        try:
            parse(rate_limit)
        except ValueError as exc:
            raise InvalidScope(f"rate limit {rate_limit!r}: {exc}") from None


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class ApiKeyFile:
    """The key file at ``path`` (created on the first ``create``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._keys: dict[str, ApiKey] = {}

    def _load(self, *, fresh: bool = False) -> dict[str, ApiKey]:
        """The keys, re-read when the file changed (``fresh``: always)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._keys = None, {}
            return self._keys
        stamp = (st.st_mtime_ns, st.st_size)
        if fresh or stamp != self._stamp:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._keys = {item["key_id"]: ApiKey.from_json(item) for item in data.get("keys", [])}
            self._stamp = stamp
        return self._keys

    def _save(self, keys: dict[str, ApiKey]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + f".{os.getpid()}.tmp")
        body = {
            "format": "invoicing api keys, sha256 of the key",
            "keys": [asdict(k) for k in keys.values()],
        }
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=2)
        os.replace(tmp, self.path)
        self._stamp = None

    @contextmanager
    def _changing(self) -> Iterator[dict[str, ApiKey]]:
        """The keys as the file holds them now, under this instance's lock and an exclusive
        ``flock`` of ``<file>.lock`` (every process's), held until the block has saved."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with self._lock, open(lock_path, "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield dict(self._load(fresh=True))
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def create(
        self,
        name: str,
        *,
        scopes: Sequence[str] = DEFAULT_SCOPES,
        event_types: Sequence[str] | None = None,
        customers: Sequence[str] | None = None,
        customer_prefix: str | None = None,
        sources: Sequence[str] | None = None,
        rate_limit: str | None = None,
    ) -> tuple[str, str]:
        """A new key for ``name`` with ``scopes`` (what it may do) and these restrictions
        (each ``None``: unrestricted): ``(key id, the key)``; only its hash is written.

        Raises:
            UnknownScope, InvalidScope: see :func:`check_scope`.
        """
        check_scope(
            scopes=scopes,
            customers=customers,
            customer_prefix=customer_prefix,
            event_types=event_types,
            sources=sources,
            rate_limit=rate_limit,
        )
        template = ApiKey(
            "",
            name,
            "",
            "",
            event_types=None if event_types is None else tuple(event_types),
            customers=None if customers is None else tuple(customers),
            customer_prefix=customer_prefix,
            sources=None if sources is None else tuple(sources),
            rate_limit=rate_limit,
            scopes=tuple(scopes),
        )
        with self._changing() as keys:
            key_id, token = self._add(keys, template)
            self._save(keys)
            return key_id, token

    @staticmethod
    def _add(keys: dict[str, ApiKey], template: ApiKey) -> tuple[str, str]:
        key_id = secrets.token_hex(4)
        while key_id in keys:
            key_id = secrets.token_hex(4)
        token = f"ik_{key_id}.{secrets.token_urlsafe(32)}"
        keys[key_id] = replace(
            template, key_id=key_id, sha256=_hash(token), created_at=_now(), revoked_at=None
        )
        return key_id, token

    def rotate(self, key_id: str) -> tuple[str, str]:
        """A new key with ``key_id``'s name and scope, ``key_id`` revoked, in one change:
        ``(new key id, the new key)``.

        Raises:
            UnknownKey: no such key id, or it is revoked already.
        """
        with self._changing() as keys:
            old = keys.get(key_id)
            if old is None or old.revoked_at is not None:
                raise UnknownKey(f"no live API key {key_id!r} in {self.path}")
            new_id, token = self._add(keys, replace(old, rotated_from=key_id))
            keys[key_id] = replace(old, revoked_at=_now())
            self._save(keys)
            return new_id, token

    def revoke(self, key_id: str) -> None:
        """Revoke ``key_id`` (kept in the file, marked revoked).

        Raises:
            UnknownKey: no such key id.
        """
        with self._changing() as keys:
            if key_id not in keys:
                raise UnknownKey(f"no API key {key_id!r} in {self.path}")
            key = keys[key_id]
            keys[key_id] = replace(key, revoked_at=key.revoked_at or _now())
            self._save(keys)

    def list(self) -> list[ApiKey]:
        with self._lock:
            return sorted(self._load().values(), key=lambda k: k.created_at)

    def verify(self, token: str) -> ApiKey | None:
        """The live key ``token`` is, or ``None`` (unknown, wrong, revoked, malformed: keys
        are ASCII, and a header that was not UTF-8 arrives with surrogates, which do not
        encode)."""
        if not token.isascii() or not token.startswith("ik_") or "." not in token:
            return None
        key_id = token[3:].split(".", 1)[0]
        with self._lock:
            key = self._load().get(key_id)
        if key is None or key.revoked_at is not None:
            return None
        return key if hmac.compare_digest(key.sha256, _hash(token)) else None
