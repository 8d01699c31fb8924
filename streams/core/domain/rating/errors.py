"""Exceptions of rating (pure domain, permanent: the same input fails again).

Tree::

    DomainError                  streams.core.domain.errors
    └── RatingError              rating refused its input (a caller's mistake)
        └── PriceBookError       a price book document that does not validate

Gaps in the *data* (usage of a metric the plan does not price, a customer
without a subscription, an unknown plan version, a currency mismatch) are not
exceptions: :func:`streams.core.domain.rating.rate` returns them as holds on the
rated invoice, so an invoice is held with its reasons, never billed as zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.core.domain.errors import DomainError


class RatingError(DomainError):
    """Rating refused its input: events of another period, duplicate pass-through
    lines, usage aggregated under another definition of a metric, a sum that
    cannot be held exactly. A bug of the caller, not a gap in the data."""


@dataclass(frozen=True)
class PriceBookIssue:
    """One error of a price book document.

    ``path`` names the value in the document (``plans[1].versions[0].charges[2]
    .tiers[3].up_to``; empty for the document itself), ``line`` its 1-based line
    in the YAML text when known.
    """

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path or "(document)"
        if self.line is not None:
            where = f"{where} (line {self.line})"
        return f"{where}: {self.message}"


class PriceBookError(RatingError):
    """A price book that does not validate; ``issues`` lists **every** error found,
    in document order, each with its path (and line)."""

    def __init__(self, issues: tuple[PriceBookIssue, ...], source: str = "price book") -> None:
        self.issues = issues
        self.source = source
        shown = "\n".join(f"  {issue}" for issue in issues)
        super().__init__(f"{source}: {len(issues)} error(s)\n{shown}")
