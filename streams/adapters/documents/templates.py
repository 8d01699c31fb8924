"""The document templates (Jinja2, autoescaped) and their filters.

One environment loads ``templates/`` of this package: ``_document.html.j2`` (the body of
a document: summary, lines, totals) is imported by ``email.html.j2`` (the email's HTML
alternative), ``document.html.j2`` (the PDF) and ``page.html.j2`` (the hosted page), so
the three show a document the same way. ``email.txt.j2`` is the plain-text alternative.

Escaping: every template whose name ends in ``.html.j2`` is autoescaped (text content and
attribute values, quotes included); ``.txt.j2`` is not (text/plain has no markup).
``StrictUndefined``: a template that names a missing variable fails, never prints "".

Filters (the rules of :mod:`streams.core.domain.formatting`): ``money(currency)``,
``exact(currency)``, ``quantity``, ``rate``, ``utc`` (``2026-11-01 00:05 UTC``).

Errors: :class:`~streams.core.domain.money.UnknownCurrency` /
:class:`~streams.core.domain.money.InvalidAmount` from a filter;
:class:`jinja2.TemplateError` for a template bug.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from importlib.resources import files
from typing import Any

import jinja2

from streams.core.domain.formatting import (
    format_exact,
    format_money,
    format_quantity,
    format_rate,
)

__all__ = ["environment", "render", "stylesheet"]


def _utc(value: datetime) -> str:
    """A time in UTC, whatever zone it comes in (a database session's ``TimeZone`` decides
    the zone psycopg returns, and must not change what a document says)."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _autoescape(name: str | None) -> bool:
    return name is not None and name.endswith(".html.j2")


@cache
def environment() -> jinja2.Environment:
    """The one template environment (built once per process)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("streams.adapters.documents", "templates"),
        autoescape=_autoescape,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
    )
    env.filters.update(
        money=format_money,
        exact=format_exact,
        quantity=format_quantity,
        rate=format_rate,
        utc=_utc,
    )
    return env


@cache
def stylesheet() -> str:
    """The document style sheet (``templates/document.css``), inlined by every template."""
    return (files("streams.adapters.documents") / "templates" / "document.css").read_text("utf-8")


def render(name: str, **context: Any) -> str:
    """Template ``name`` rendered with ``context`` (and ``css``, the style sheet, unless
    ``context`` names its own)."""
    context.setdefault("css", stylesheet())
    return environment().get_template(name).render(**context)
