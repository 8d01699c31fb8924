"""Finding 4, the key file's lock (docs/security.md "The ingest edge"): ``create`` and
``revoke`` read the key file, change it and write it back. The lock was per process (a
``threading.Lock`` of the instance), so a ``revoke`` by one process between another's read
and write was lost: the revoked key worked again. Now the change holds an exclusive
``flock`` of ``<file>.lock``.

Two instances on one file stand for two processes (each has its own lock and cache). The
``revoke`` runs on a thread while the ``create`` is between its read and its write; the
``create`` waits at most a second for it (the fixed ``revoke`` is blocked on the flock until
the ``create`` saved, so it never finishes in that second), then saves.

Before the fix the revoked key verified again afterwards.
"""

from __future__ import annotations

import threading
from pathlib import Path

from streams.apps.ingest.keys import ApiKey, ApiKeyFile


def test_a_revocation_beside_a_create_is_never_lost(tmp_path: Path) -> None:
    path = tmp_path / "api-keys.json"
    edge, cli = ApiKeyFile(path), ApiKeyFile(path)
    victim_id, victim = cli.create("leaked")
    assert edge.verify(victim) is not None
    revoker = threading.Thread(target=lambda: cli.revoke(victim_id))
    save = edge._save

    def save_after_a_concurrent_revoke(keys: dict[str, ApiKey]) -> None:
        revoker.start()
        revoker.join(timeout=1.0)
        save(keys)

    edge._save = save_after_a_concurrent_revoke  # type: ignore[method-assign]
    created_id, created = edge.create("new client")
    revoker.join()
    for reader in (ApiKeyFile(path), edge, cli):
        assert reader.verify(victim) is None, "the revocation was lost"
        assert reader.verify(created) is not None, "the created key was lost"
    assert {k.key_id for k in ApiKeyFile(path).list()} == {victim_id, created_id}
