"""The published price book: immutable entries, their canonical content, and the book they
assemble into (pure, no I/O).

``invoicing plans publish FILE`` cuts a price book into **entries**, each published
once and for good (docs/design.md "Rating": plans have immutable versions):

================================  ==================================  ==================
entry                             event (``billing.price-book.v1``)   key
================================  ==================================  ==================
a billable metric                 :class:`BillableMetricPublished`    ``metric/<code>``
a plan version                    :class:`PlanVersionPublished`       ``plan/<code>/<n>``
================================  ==================================  ==================

An entry's **content** is its definition in canonical JSON (:func:`canonical`:
decimals without trailing zeros, so ``0.10`` and ``0.1`` are one price; keys
sorted); ``content_sha256`` is the SHA-256 of that text. Publishing an entry
whose key is already published with the same content is a no-op; with other
content it is refused (:func:`plan_publication`): a price change is a new plan
version, a metric redefinition a new metric code (a metric's definition decides
how already-stored usage aggregates, so it can never change under a published
version).

The book in force is the union of every published entry (:func:`assemble`):
PostgreSQL holds it for the invoice job and the replay
(:mod:`streams.core.billing.store.pricing`); the compacted topic carries it to other
readers (the usage view), who assemble it the same way from the records.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from enum import Enum
from typing import Any

from streams.core.domain.events import BillableMetricPublished, PlanVersionPublished
from streams.core.domain.money import canonical_decimal
from streams.core.domain.rating.book import (
    BillableMetric,
    PlanVersion,
    PriceBook,
)
from streams.core.domain.rating.book_yaml import price_book_from_data
from streams.core.domain.rating.errors import PriceBookError, PriceBookIssue

__all__ = [
    "Entry",
    "Publication",
    "assemble",
    "canonical",
    "content_sha256",
    "entries_of",
    "metric_key",
    "plan_key",
    "plan_publication",
]

Entry = BillableMetricPublished | PlanVersionPublished


def metric_key(code: str) -> str:
    """``metric/<code>``: the entry key of a billable metric."""
    return f"metric/{code}"


def plan_key(code: str, version: int) -> str:
    """``plan/<code>/<version>``: the entry key of a plan version."""
    return f"plan/{code}/{version}"


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return format(canonical_decimal(value), "f")
    if isinstance(value, Enum):
        return _plain(value.value)
    if isinstance(value, (date, datetime)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def canonical(model: BillableMetric | PlanVersion) -> dict[str, Any]:
    """The definition of a metric or plan version as plain JSON: decimals as canonical
    decimal strings, dates ISO, tuples as lists (what ``definition`` carries)."""
    plain: dict[str, Any] = _plain(model.model_dump())
    if plain.get("invoice_grace_hours", 0) is None:
        # absent stays absent: a version published before the field keeps its content hash
        del plain["invoice_grace_hours"]
    return plain


def content_sha256(definition: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the definition's canonical JSON text (sorted keys, no spaces)."""
    text = json.dumps(definition, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def entries_of(book: PriceBook, *, published_at: datetime) -> list[Entry]:
    """Every entry of ``book``: its metrics, then each plan's versions, in book order."""
    entries: list[Entry] = []
    for metric in book.metrics:
        definition = canonical(metric)
        entries.append(
            BillableMetricPublished(
                metric_code=metric.code,
                definition=definition,
                content_sha256=content_sha256(definition),
                published_at=published_at,
            )
        )
    for plan in book.plans:
        for version in plan.versions:
            definition = canonical(version)
            entries.append(
                PlanVersionPublished(
                    plan_code=plan.code,
                    plan_name=plan.name,
                    plan_version=version.version,
                    effective_from=version.effective_from,
                    currency=version.currency,
                    definition=definition,
                    content_sha256=content_sha256(definition),
                    published_at=published_at,
                )
            )
    return entries


def assemble(entries: Iterable[Entry], *, source: str = "published price book") -> PriceBook:
    """The price book of ``entries`` (any order; one per key): metrics by code, plans
    by code with their versions by number; a plan's name is its newest version's.

    Raises:
        PriceBookError: the entries do not make a valid book (e.g. a version whose
            ``effective_from`` is before an earlier version's), every issue listed;
            or two entries share a key.
    """
    metrics: dict[str, dict[str, Any]] = {}
    plans: dict[str, dict[int, PlanVersionPublished]] = {}
    for entry in entries:
        if isinstance(entry, BillableMetricPublished):
            if entry.metric_code in metrics:
                raise PriceBookError(
                    (PriceBookIssue("", f"entry {entry.record_key()} given twice"),), source
                )
            metrics[entry.metric_code] = dict(entry.definition)
        else:
            versions = plans.setdefault(entry.plan_code, {})
            if entry.plan_version in versions:
                raise PriceBookError(
                    (PriceBookIssue("", f"entry {entry.record_key()} given twice"),), source
                )
            versions[entry.plan_version] = entry
    data = {
        "schema_version": 1,
        "metrics": [metrics[code] for code in sorted(metrics)],
        "plans": [
            {
                "code": code,
                "name": versions[max(versions)].plan_name,
                "versions": [dict(versions[n].definition) for n in sorted(versions)],
            }
            for code, versions in sorted(plans.items())
        ],
    }
    return price_book_from_data(data, source=source)


@dataclass(frozen=True)
class Publication:
    """What publishing a book over the already published entries does.

    * ``new`` — entries to store and publish (not published before);
    * ``unchanged`` — entries already published with the same content (no-ops;
      published again on the topic, with their stored ``published_at``, so a rerun
      after a failed produce completes the topic);
    * ``refused`` — ``(key, reason)`` of entries already published with other
      content: the whole publication is refused when there is any;
    * ``book`` — the book in force after publishing (every stored and new entry),
      validated; None when refused.
    """

    new: tuple[Entry, ...]
    unchanged: tuple[Entry, ...]
    refused: tuple[tuple[str, str], ...]
    book: PriceBook | None

    @property
    def accepted(self) -> bool:
        return not self.refused


def plan_publication(
    book: PriceBook,
    published: Sequence[Entry],
    *,
    published_at: datetime,
    source: str = "price book",
) -> Publication:
    """Compare ``book``'s entries with the ``published`` ones (module docstring).

    Raises:
        PriceBookError: the union of the published entries and the new ones is not a
            valid book (e.g. a new version that goes back in ``effective_from``).
    """
    stored = {entry.record_key(): entry for entry in published}
    new: list[Entry] = []
    unchanged: list[Entry] = []
    refused: list[tuple[str, str]] = []
    for entry in entries_of(book, published_at=published_at):
        key = entry.record_key()
        before = stored.get(key)
        if before is None:
            new.append(entry)
        elif before.content_sha256 == entry.content_sha256:
            unchanged.append(before)
        else:
            what = "metric" if isinstance(entry, BillableMetricPublished) else "plan version"
            remedy = (
                "publish a new metric code"
                if isinstance(entry, BillableMetricPublished)
                else "publish the change as a new version"
            )
            refused.append(
                (
                    key,
                    f"{what} {key} is already published (since "
                    f"{before.published_at.isoformat()}) with other content "
                    f"(sha256 {before.content_sha256[:12]}…, this file {entry.content_sha256[:12]}…): "
                    f"published entries are immutable; {remedy}",
                )
            )
    if refused:
        return Publication(tuple(new), tuple(unchanged), tuple(refused), None)
    union = assemble([*published, *new], source=f"{source} with the published entries")
    return Publication(tuple(new), tuple(unchanged), (), union)
