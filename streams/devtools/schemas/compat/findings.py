"""What the compatibility check reports: its errors, a breaking change, a narrowing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streams.errors import InvoicingError


class CompatError(InvoicingError):
    """Root of this module's errors."""


class BaseUnavailable(CompatError):
    """The base version cannot be read (not a git repository, unknown ref, git failed)."""


class Narrowing(str):
    """A breaking change that adds or tightens one constraint of one field: its text,
    plus ``field`` (the path, ``""`` for the root), ``keyword`` (``maxLength``,
    ``pattern``, …) and ``new`` (the new value), which is what a documented
    exception (:class:`~streams.devtools.schemas.compat.policy.CompatException`) can accept. Compares and hashes as its text."""

    field: str
    keyword: str
    new: Any

    def __new__(cls, text: str, field: str, keyword: str, new: Any) -> Narrowing:
        made = super().__new__(cls, text)
        made.field, made.keyword, made.new = field, keyword, new
        return made


@dataclass(frozen=True)
class Incompatibility:
    """One breaking change: where (topic, message or file) and why."""

    topic: str
    message: str
    detail: str

    def __str__(self) -> str:
        return f"{self.topic} {self.message}: {self.detail}"
