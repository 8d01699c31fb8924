"""API keys of the ingest edge, hashed at rest in one JSON file.

A key is ``ik_<key id>.<secret>`` (the id: 8 hex characters; the secret: 32 random
bytes, URL-safe base64). The file keeps, per key id, the **SHA-256 of the whole
key**, a name, and the creation and revocation times (UTC) — never the key, which
``invoicing api-keys create`` prints once. A fast hash is the right one here: the
keys are random with 256 bits of entropy, so there is nothing to guess (a slow
password hash such as scrypt protects low-entropy passwords, and would cost every
request milliseconds). Comparison is constant-time (:func:`hmac.compare_digest`).

The file is written atomically (temporary file + rename, mode 0600) and the edge
re-reads it when its modification time changes, so a revocation takes effect on
the next request without a restart. Several edge instances share the file (a
mounted secret in production).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path


class ApiKeyError(Exception):
    """Root of the API key errors."""


class UnknownKey(ApiKeyError):
    """No key of that id in the file."""


@dataclass(frozen=True)
class ApiKey:
    """One stored key: its id, name, SHA-256 (hex) and times (ISO 8601, UTC)."""

    key_id: str
    name: str
    sha256: str
    created_at: str
    revoked_at: str | None = None


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

    def _load(self) -> dict[str, ApiKey]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._keys = None, {}
            return self._keys
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self._keys = {item["key_id"]: ApiKey(**item) for item in data.get("keys", [])}
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

    def create(self, name: str) -> tuple[str, str]:
        """A new key for ``name``: ``(key id, the key)``; only its hash is written."""
        with self._lock:
            keys = dict(self._load())
            key_id = secrets.token_hex(4)
            while key_id in keys:
                key_id = secrets.token_hex(4)
            token = f"ik_{key_id}.{secrets.token_urlsafe(32)}"
            keys[key_id] = ApiKey(key_id, name, _hash(token), _now())
            self._save(keys)
            return key_id, token

    def revoke(self, key_id: str) -> None:
        """Revoke ``key_id`` (kept in the file, marked revoked).

        Raises:
            UnknownKey: no such key id.
        """
        with self._lock:
            keys = dict(self._load())
            if key_id not in keys:
                raise UnknownKey(f"no API key {key_id!r} in {self.path}")
            key = keys[key_id]
            keys[key_id] = ApiKey(
                key.key_id, key.name, key.sha256, key.created_at, key.revoked_at or _now()
            )
            self._save(keys)

    def list(self) -> list[ApiKey]:
        with self._lock:
            return sorted(self._load().values(), key=lambda k: k.created_at)

    def verify(self, token: str) -> ApiKey | None:
        """The live key ``token`` is, or ``None`` (unknown, wrong, revoked, malformed)."""
        if not token.startswith("ik_") or "." not in token:
            return None
        key_id = token[3:].split(".", 1)[0]
        with self._lock:
            key = self._load().get(key_id)
        if key is None or key.revoked_at is not None:
            return None
        return key if hmac.compare_digest(key.sha256, _hash(token)) else None
