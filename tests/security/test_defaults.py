"""Finding 8, defaults that should not leave a laptop (docs/security.md "Defaults", "Redis"):
every shipped login's password equals its user name, so beyond loopback anyone who read
this repository could log in. A process now refuses to open a login (or Redis) that keeps
its default, with a message naming each one, when any service address is not loopback
(streams/settings/credentials.py, called where pools, connections and Redis clients are
made); Redis gets a memory limit at which it refuses writes rather than evict a lease.

Before the fix every login below was used, and redis.conf had no ``maxmemory``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streams import bootstrap
from streams.devtools.stack.layout import Layout
from streams.devtools.stack.services import prepare_redis
from streams.settings import DEFAULT_LOGINS, Settings
from streams.settings.credentials import DefaultCredentialsRefused, refuse_default_credentials


def refuse_all(settings: Settings) -> None:
    refuse_default_credentials(settings, DEFAULT_LOGINS, redis=True)


REMOTE = [
    ("INVOICING_POSTGRES__HOST", "10.1.2.3"),
    ("INVOICING_POSTGRES__HOST", "db.internal"),
    ("INVOICING_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:19092,kafka-2:9092"),
    ("INVOICING_REDIS__URL", "redis://cache.internal:6379/0"),
    ("INVOICING_INGEST__HOST", "0.0.0.0"),
    ("INVOICING_PORTAL__HOST", "::"),
    ("INVOICING_SMTP__HOST", "smtp.example.com"),
]


def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("INVOICING_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(("name", "value"), REMOTE)
def test_default_passwords_are_refused_beyond_loopback(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    _clean(monkeypatch)
    monkeypatch.setenv(name, value)
    with pytest.raises(DefaultCredentialsRefused, match="default passwords refused") as raised:
        refuse_all(Settings())
    message = str(raised.value)
    assert "postgres.worker (invoicing_worker_login) has its default password" in message
    assert "invoicing_worker_login" in message  # the user name, never a password
    for role in DEFAULT_LOGINS:
        assert f"postgres.{role} " in message


def test_a_password_equal_to_the_user_name_or_a_shipped_one_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _clean(monkeypatch)
    monkeypatch.setenv("INVOICING_POSTGRES__HOST", "10.1.2.3")
    monkeypatch.setenv("INVOICING_REDIS__URL", "redis://:s3cret-redis@10.1.2.4:6379/0")
    for role in DEFAULT_LOGINS:
        monkeypatch.setenv(f"INVOICING_POSTGRES__{role.upper()}__PASSWORD", f"own-{role}-pw-1")
    refuse_all(Settings())  # every login has a password of its own: accepted
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__USER", "billing_worker")
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__PASSWORD", "billing_worker")
    with pytest.raises(DefaultCredentialsRefused, match=r"postgres\.worker \(billing_worker\)"):
        refuse_all(Settings())
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__PASSWORD", "debezium")  # another default
    with pytest.raises(DefaultCredentialsRefused, match=r"postgres\.worker"):
        refuse_all(Settings())
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__PASSWORD", "own-worker-pw-1")
    monkeypatch.setenv("INVOICING_REDIS__URL", "redis://10.1.2.4:6379/0")
    with pytest.raises(DefaultCredentialsRefused, match=r"redis\.url has no password"):
        refuse_all(Settings())


def test_a_process_needs_only_its_own_logins_password(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod holds the Secret of its own login only (deploy/k8s): the worker's pool opens
    with the worker's password set, while the email login, still a default, is refused —
    before any connection is tried."""
    _clean(monkeypatch)
    monkeypatch.setenv("INVOICING_POSTGRES__HOST", "10.1.2.3")
    monkeypatch.setenv("INVOICING_POSTGRES__WORKER__PASSWORD", "own-worker-pw-1")
    settings = Settings()
    refuse_default_credentials(settings, ("worker",))
    with pytest.raises(DefaultCredentialsRefused, match=r"postgres\.email "):
        bootstrap.connection(settings, role="email", connect_timeout_s=1)
    with pytest.raises(DefaultCredentialsRefused, match=r"postgres\.email "):
        bootstrap.postgres_pool(settings, role="email")
    with pytest.raises(DefaultCredentialsRefused, match=r"redis\.url has no password"):
        bootstrap.redis_client(settings)


def test_the_local_stack_on_loopback_keeps_its_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    _clean(monkeypatch)
    refuse_all(Settings())
    monkeypatch.setenv("INVOICING_POSTGRES__HOST", "localhost")
    monkeypatch.setenv("INVOICING_INGEST__HOST", "::1")
    refuse_all(Settings())
    monkeypatch.setenv("INVOICING_POSTGRES__HOST", "postgres")  # compose's private network
    monkeypatch.setenv("INVOICING_STACK__ALLOW_DEFAULT_PASSWORDS", "true")
    refuse_all(Settings())


def test_redis_refuses_writes_at_its_limit_rather_than_evict_a_lease(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.conf.mkdir(parents=True)
    prepare_redis(layout, Settings())
    conf = dict(
        line.split(" ", 1) for line in (layout.conf / "redis.conf").read_text().splitlines() if line
    )
    assert conf.get("maxmemory") == "256mb"
    assert conf.get("maxmemory-policy") == "noeviction"
