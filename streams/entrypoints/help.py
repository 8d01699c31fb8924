"""What ``invoicing … --help`` shows, beyond each command's own text.

- A flag (``--dry-run``, ``--json``, ``--help``) takes no value, so its help shows no
  type. typer 0.29's rich help prints ``<bool>`` beside every flag, as if it took one
  (``TyperOption.display_type_rich`` returns the type of any option); :func:`install`
  makes it return None for a flag. Options that take a value keep their type.
- ``--version`` prints the installed package's version (:func:`version_callback`).

Checked by ``tests/unit/test_cli_help.py``, which renders every command's help.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import typer
from typer.core import TyperOption

#: The distribution whose version ``--version`` prints (pyproject.toml ``[project] name``).
DISTRIBUTION = "invoicing-pipeline"

_type_of_option = TyperOption.display_type_rich


def _type_unless_flag(self: TyperOption, ctx: Any) -> str | None:
    """The option's type as help shows it; None for a flag (it takes no value)."""
    if self.is_flag and not self.count:
        return None
    return _type_of_option(self, ctx)


def install() -> None:
    """Make rich help show no type beside flags (idempotent)."""
    TyperOption.display_type_rich = _type_unless_flag  # type: ignore[method-assign]


def package_version() -> str:
    """The installed version of :data:`DISTRIBUTION`, ``unknown`` when not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def version_callback(value: bool) -> None:
    """``--version``: print ``invoicing <version>`` and exit 0."""
    if value:
        typer.echo(f"invoicing {package_version()}")
        raise typer.Exit(0)
