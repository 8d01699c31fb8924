"""The settings as rows: the reference of every key (``docs/configuration.md``) and the
effective configuration of a process (``invoicing config show``), secrets masked.

One walk over :class:`~streams.settings.Settings` serves both: a row per leaf field,
with its dotted key (``postgres.worker.password``), its environment variable
(``INVOICING_POSTGRES__WORKER__PASSWORD``: prefix ``INVOICING_``, ``__`` between
levels), its type as written in the code, its default and its description (the
field's ``description=``). A nested model (a section, a :class:`DatabaseRole`) is
walked into, never shown as one value.

Masking: a field is secret when its type holds :class:`~pydantic.SecretStr`; its value
is never shown, only whether it is set (``***``), except a secret URL (``redis.url``),
shown with its user and password replaced by ``***`` (``redis://***@host:6379/0``).
A unit test keeps every field named like a secret (password, secret, token) a
``SecretStr``, so that this rule covers them.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from streams.settings import Settings

#: Environment prefix and nesting delimiter of :class:`Settings` (its ``model_config``).
ENV_PREFIX = str(Settings.model_config.get("env_prefix", ""))
ENV_DELIMITER = str(Settings.model_config.get("env_nested_delimiter", "__"))

#: What a secret's value is shown as.
MASK = "***"


@dataclass(frozen=True)
class KeyDoc:
    """One leaf setting, as the reference shows it.

    ``key`` dotted (``kafka.bootstrap_servers``); ``env`` its variable; ``type`` as in
    the code (``int``, ``Path | None``, ``"classic" | "consumer"``); ``default`` shown
    (secrets masked; a computed default is described); ``secret`` whether the value
    is masked; ``description`` the field's ``description=``.
    """

    section: str
    key: str
    env: str
    type: str
    default: str
    secret: bool
    description: str


@dataclass(frozen=True)
class EffectiveValue:
    """One leaf setting of a loaded :class:`Settings`: ``value`` as shown (masked when
    ``secret``), ``given`` whether it came from the environment rather than the default."""

    key: str
    env: str
    value: str
    secret: bool
    given: bool


def type_name(annotation: Any) -> str:
    """A type as written in the code: ``int``, ``Path | None``, ``tuple[SecretStr, ...]``,
    ``"rocksdb" | "memory"`` for a ``Literal``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " | ".join(
            f'"{arg}"' if isinstance(arg, str) else repr(arg) for arg in get_args(annotation)
        )
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in get_args(annotation))
    if origin is dict:
        key, value = get_args(annotation)
        return f"dict[{type_name(key)}, {type_name(value)}]"
    if origin is tuple:
        args = get_args(annotation)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return f"tuple[{', '.join(type_name(arg) for arg in args)}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


def is_secret(annotation: Any) -> bool:
    """Whether ``annotation`` is or holds :class:`SecretStr` (``SecretStr | None``, tuples)."""
    if annotation is SecretStr:
        return True
    return any(is_secret(arg) for arg in get_args(annotation))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model class ``annotation`` is (walked into), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def mask_url(url: str) -> str:
    """``url`` with any user name and password replaced by ``***`` (as
    :meth:`~streams.settings.RedisSettings.display_url`)."""
    parsed = urlsplit(url)
    if parsed.username is None and parsed.password is None:
        return url
    netloc = f"{MASK}@{parsed.hostname or ''}" + (f":{parsed.port}" if parsed.port else "")
    return parsed._replace(netloc=netloc).geturl()


def show_value(value: Any, *, secret: bool, name: str) -> str:
    """``value`` as shown: ``(unset)`` for None, ``""`` quoted, a secret as ``***``
    (a secret URL field, ``name`` ``url``, with only its credentials masked; a tuple
    of secrets as their count), anything else as ``str``."""
    if value is None:
        return "(unset)"
    if secret:
        if isinstance(value, tuple):
            if not value:
                return "()"
            return f"({len(value)} {'secret' if len(value) == 1 else 'secrets'})"
        if name == "url" and isinstance(value, SecretStr):
            return mask_url(value.get_secret_value())
        return MASK
    if isinstance(value, str) and value == "":
        return '""'
    if isinstance(value, tuple):
        return ", ".join(str(item) for item in value) if value else "()"
    if isinstance(value, Path):
        return str(value)
    return str(value)


def _first_sentence(text: str | None) -> str:
    """The first sentence of a docstring, on one line, RST literals as Markdown's."""
    if not text:
        return ""
    flat = " ".join(text.split())
    sentence = flat.split(". ")[0].rstrip(".")
    return sentence.replace("``", "`")


def _walk_fields(
    model: type[BaseModel], prefix: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], FieldInfo, Any, str]]:
    """``(path, field, default, description)`` of every leaf field under ``model``, in code
    order. A nested model's default instance gives its fields' defaults (a login's user
    name), and below a section the parent field's description leads the leaf's
    (``postgres.worker.user``: "Login of the invoicing worker: user name.")."""
    for name, info in model.model_fields.items():
        path = (*prefix, name)
        nested = _model_of(info.annotation)
        if nested is None:
            yield path, info, info.default, info.description or ""
            continue
        for sub_path, sub_info, sub_default, sub_description in _walk_fields(nested, path):
            default = sub_default
            holder: Any = info.default
            for part in sub_path[len(path) :]:
                holder = getattr(holder, part, PydanticUndefined)
            if holder is not PydanticUndefined and sub_info.default_factory is None:
                default = holder
            description = sub_description
            if prefix and info.description:
                description = f"{info.description.rstrip('.')}: {sub_description}"
            yield sub_path, sub_info, default, description


def env_name(path: tuple[str, ...]) -> str:
    """``("postgres", "worker", "password")`` → ``INVOICING_POSTGRES__WORKER__PASSWORD``."""
    return ENV_PREFIX + ENV_DELIMITER.join(part.upper() for part in path)


def reference() -> list[KeyDoc]:
    """One :class:`KeyDoc` per leaf setting of :class:`Settings`, in code order.

    A required field (no default) shows ``(required)``; a computed one
    (``default_factory``) shows ``computed: `` and the first sentence of the factory's
    docstring, so that the reference reads the same on every machine.
    """
    rows: list[KeyDoc] = []
    for path, info, default, description in _walk_fields(Settings, ()):
        secret = is_secret(info.annotation)
        if default is PydanticUndefined:
            factory = info.default_factory
            if factory is not None:
                shown = f"computed: {_first_sentence(factory.__doc__) or 'at load time'}"
            else:
                shown = "(required)"
        else:
            shown = show_value(default, secret=secret, name=path[-1])
        rows.append(
            KeyDoc(
                section=path[0],
                key=".".join(path),
                env=env_name(path),
                type=type_name(info.annotation),
                default=shown,
                secret=secret,
                description=description,
            )
        )
    return rows


def effective(settings: Settings) -> list[EffectiveValue]:
    """The value of every leaf setting of ``settings`` as shown (secrets masked), and
    whether the environment gave it (the field is in its model's ``model_fields_set``)."""
    rows: list[EffectiveValue] = []
    for path, info, _default, _description in _walk_fields(Settings, ()):
        holder: Any = settings
        given = True
        for part in path[:-1]:
            given = given and part in holder.model_fields_set
            holder = getattr(holder, part)
        given = given and path[-1] in holder.model_fields_set
        secret = is_secret(info.annotation)
        rows.append(
            EffectiveValue(
                key=".".join(path),
                env=env_name(path),
                value=show_value(getattr(holder, path[-1]), secret=secret, name=path[-1]),
                secret=secret,
                given=given,
            )
        )
    return rows


def section_docs() -> dict[str, str]:
    """Each section's name → the first sentence of its class docstring."""
    out: dict[str, str] = {}
    for name, info in Settings.model_fields.items():
        model = _model_of(info.annotation)
        out[name] = _first_sentence(model.__doc__ if model else info.description)
    return out


#: Time a stopping worker needs beyond its jobs: commit offsets, leave the group, flush
#: the dead-letter producer (seconds; a margin, not a measurement).
STOP_OVERHEAD_S = 15.0


def tax_request_bound_s(settings: Settings) -> float:
    """The longest one tax request can take with its retries (seconds): ``max_attempts``
    attempts of at most ``connect_timeout_s + read_timeout_s`` each, and between two of
    them at most ``backoff_max_s`` plus the jitter (``backoff_initial_s``) of
    :mod:`streams.adapters.tax.client`'s ``wait_exponential_jitter``."""
    tax = settings.tax
    attempts = tax.max_attempts
    per_attempt = tax.connect_timeout_s + tax.read_timeout_s
    waits = max(attempts - 1, 0) * (tax.backoff_max_s + tax.backoff_initial_s)
    return attempts * per_attempt + waits


def invoicing_stop_bound_s(settings: Settings) -> float:
    """The longest an invoicing worker takes to stop after SIGTERM (seconds): running
    jobs get ``worker.shutdown_grace_s``, then are cancelled, which takes effect before
    their next tax call or write, so a job in a tax request finishes that request with
    its retries (:func:`tax_request_bound_s`); then :data:`STOP_OVERHEAD_S`.

    A pod's ``terminationGracePeriodSeconds`` at least this long lets the worker stop
    cleanly (commit, LeaveGroup) instead of being killed; a kill is still safe (the
    fences and the commit order hold), only slower to recover.
    """
    return settings.worker.shutdown_grace_s + tax_request_bound_s(settings) + STOP_OVERHEAD_S


def email_stop_bound_s(settings: Settings) -> float:
    """The longest the email sender takes to stop after SIGTERM (seconds): the message in
    flight (connect and send, each up to ``smtp.timeout_s``), then
    :data:`STOP_OVERHEAD_S`."""
    return 2 * settings.smtp.timeout_s + STOP_OVERHEAD_S
