"""Shipped default credentials must not leave a laptop (docs/security.md "Defaults").

Every login of the local stack has its user name for a password and Redis has none; on
loopback that is what the local stack uses, beyond it anyone who has read this
repository can log in. A process refuses, when it opens a PostgreSQL login or a Redis
client, a default credential of *that* login while any service address is not
loopback (:func:`refuse_default_credentials`, called by :mod:`streams.bootstrap.clients`).
Checking at use, not when the settings load, lets a container hold the password of its
own login only (a Kubernetes pod gets one Secret, deploy/k8s).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from streams.errors import InvoicingError
from streams.settings import DEFAULT_LOGINS, DatabaseRole, Settings

__all__ = [
    "DefaultCredentialsRefused",
    "default_password_exposures",
    "is_loopback",
    "refuse_default_credentials",
    "service_addresses",
]


class DefaultCredentialsRefused(InvoicingError, ValueError):
    """A process was about to log in with a shipped default credential while a service
    address is not loopback; the message names each login (never a password)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 with or without brackets) is this
    machine's loopback: ``localhost``, 127.0.0.0/8 or ``::1``. ``0.0.0.0`` (every
    interface) and any other name are not."""
    name = host.strip().strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _url_host(url: str) -> str:
    return urlsplit(url if "//" in url else f"//{url}").hostname or ""


def service_addresses(settings: Settings) -> dict[str, str]:
    """Every address the processes bind or connect to: what → host."""
    out = {
        "postgres.host": settings.postgres.host,
        "redis.url": _url_host(settings.redis.url.get_secret_value()),
        "connect.url": _url_host(settings.connect.url),
        "tax.url": _url_host(settings.tax.url),
        "smtp.host": settings.smtp.host,
        "ingest.host": settings.ingest.host,
        "view.host": settings.view.host,
        "portal.host": settings.portal.host,
    }
    for n, server in enumerate(settings.kafka.bootstrap_servers.split(",")):
        if server.strip():
            out[f"kafka.bootstrap_servers[{n}]"] = _url_host(server.strip())
    return out


def default_password_exposures(
    settings: Settings, roles: Iterable[str] | None = None, *, redis: bool = True
) -> list[str]:
    """What of ``roles`` (logins of :data:`~streams.settings.DEFAULT_LOGINS`; None: every
    one) and, with ``redis``, the Redis URL keeps a shipped default while some service
    address is not loopback (empty when every address is loopback, or no default is left).

    A default is a login whose password equals its user name or any of the shipped user
    names (:data:`DEFAULT_LOGINS`: the local stack sets each password to its user name),
    and Redis without a password (none in its URL, no ``redis.password``). On loopback they are what the local stack uses;
    beyond it anyone who reads this repository can log in (docs/security.md "Defaults").
    """
    remote = sorted(
        what for what, host in service_addresses(settings).items() if not is_loopback(host)
    )
    if not remote:
        return []
    shipped = set(DEFAULT_LOGINS.values())
    found = []
    for name in DEFAULT_LOGINS if roles is None else roles:
        role: DatabaseRole = getattr(settings.postgres, name)
        password = role.password.get_secret_value()
        if password == role.user or password in shipped:
            found.append(f"postgres.{name} ({role.user}) has its default password")
    if (
        redis
        and urlsplit(settings.redis.url.get_secret_value()).password is None
        and settings.redis.password is None
    ):
        found.append("redis.url has no password")
    if not found:
        return []
    return [*found, "while not on loopback: " + ", ".join(remote)]


def refuse_default_credentials(
    settings: Settings, roles: Iterable[str] = (), *, redis: bool = False
) -> None:
    """Refuse to use a default credential of ``roles`` (and of Redis, with ``redis``)
    while a service address is not loopback, unless ``stack.allow_default_passwords``
    (a private network of throwaway containers: docker-compose.yml).

    Raises:
        DefaultCredentialsRefused: the message names every such login and the
            addresses that are not loopback.
    """
    exposed = default_password_exposures(settings, tuple(roles), redis=redis)
    if exposed and not settings.stack.allow_default_passwords:
        raise DefaultCredentialsRefused(
            "default passwords refused: "
            + "; ".join(exposed)
            + ". Set a password of its own for each login "
            "(INVOICING_POSTGRES__<ROLE>__PASSWORD) and for Redis (in INVOICING_REDIS__URL), "
            "or keep every service on loopback (docs/security.md)"
        )
