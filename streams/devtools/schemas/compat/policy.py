"""Documented narrowings: the exceptions that accept a tightened constraint without a new version.

``schemas/compat-exceptions.yaml`` lists them (:func:`load_exceptions`); each accepts
exactly the (topic, message, field, keyword, new value) it names, so any other narrowing
is refused again. Why such an exception exists and how it is verified:
docs/contract.md "Narrowing an existing topic version".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from streams.devtools.schemas.compat.findings import CompatError, Incompatibility, Narrowing


@dataclass(frozen=True)
class CompatException:
    """A documented narrowing accepted without a new topic version (``schemas/compat-exceptions.yaml``).

    ``accept`` maps (topic, message, field, keyword) to the exact new value accepted:
    a later change to another value, another field or another keyword is refused
    again. ``reason`` says why existing records are not broken by it and
    ``verified_by`` how that was (and is to be) checked.
    """

    id: str
    reason: str
    verified_by: str
    accept: Mapping[tuple[str, str, str, str], Any]

    def accepts(self, problem: Incompatibility) -> bool:
        detail = problem.detail
        if not isinstance(detail, Narrowing):
            return False
        key = (problem.topic, problem.message, detail.field, detail.keyword)
        return key in self.accept and self.accept[key] == detail.new


EXCEPTIONS_FILE = "compat-exceptions.yaml"


def load_exceptions(path: Path) -> list[CompatException]:
    """The exceptions declared in ``path`` (none when it does not exist).

    Format (YAML)::

        exceptions:
          - id: <name>
            reason: <why existing records stay valid>
            verified_by: <how that is checked>
            values: {<name>: <value>, ...}          # named values, used below by name
            accept:
              <topic>: {<message>: {<field path>: {<keyword>: <value or value name>}}}

    Raises:
        CompatError: the file is not YAML of that shape.
    """
    if not path.is_file():
        return []
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        found = []
        for entry in document.get("exceptions") or ():
            names: Mapping[str, Any] = entry.get("values") or {}
            accept: dict[tuple[str, str, str, str], Any] = {}
            for topic, messages in (entry.get("accept") or {}).items():
                for message, fields in messages.items():
                    for field_path, keywords in fields.items():
                        for keyword, value in keywords.items():
                            resolved = names.get(value, value) if isinstance(value, str) else value
                            accept[(topic, message, field_path, keyword)] = resolved
            found.append(
                CompatException(
                    id=str(entry["id"]),
                    reason=str(entry.get("reason", "")),
                    verified_by=str(entry.get("verified_by", "")),
                    accept=accept,
                )
            )
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise CompatError(f"{path} is not a compatibility exceptions file: {exc!r}") from exc
    return found


def propose_exceptions(problems: Iterable[Incompatibility]) -> dict[str, Any]:
    """The ``accept`` block (topic → message → field → keyword → value) that would accept
    the narrowings among ``problems``: a starting point for a documented exception."""
    accept: dict[str, Any] = {}
    for problem in problems:
        detail = problem.detail
        if isinstance(detail, Narrowing):
            fields = accept.setdefault(problem.topic, {}).setdefault(problem.message, {})
            fields.setdefault(detail.field, {})[detail.keyword] = detail.new
    return accept
