"""``billable_metrics`` and ``plan_versions``: the published price book.

One row per immutable entry (:mod:`streams.core.domain.rating.published`): ``invoicing
plans publish`` inserts the new ones (:func:`insert_entries`, ``ON CONFLICT DO
NOTHING``; the publication compared contents first, under a lock, so a same key
with other content never gets here) and a trigger of migration 0005 refuses any
UPDATE or DELETE. The invoice job and the replay rate under the book of every
stored entry (:func:`published_book`).

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
"""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any

import psycopg
from psycopg.rows import args_row

from streams.core.domain.events import BillableMetricPublished, PlanVersionPublished
from streams.core.domain.rating import PriceBook
from streams.core.domain.rating.published import Entry, assemble

__all__ = [
    "book_fingerprint",
    "insert_entries",
    "lock_price_book",
    "published_book",
    "published_entries",
]

#: Key of the transaction-level advisory lock that serialises publications.
_PUBLISH_LOCK = 0x5052_4943_4500  # "PRICE"


def lock_price_book(conn: psycopg.Connection[Any]) -> None:
    """Serialise publications (``pg_advisory_xact_lock``, released at commit): two
    publishers of the same new key cannot both compare it as absent."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PUBLISH_LOCK,))


def _metric(
    metric_code: str, definition: dict[str, Any], content_sha256: str, published_at: datetime
) -> BillableMetricPublished:
    return BillableMetricPublished(
        metric_code=metric_code,
        definition=definition,
        content_sha256=content_sha256,
        published_at=published_at,
    )


def _version(
    plan_code: str,
    plan_name: str | None,
    plan_version: int,
    effective_from: date,
    currency: str,
    definition: dict[str, Any],
    content_sha256: str,
    published_at: datetime,
) -> PlanVersionPublished:
    return PlanVersionPublished(
        plan_code=plan_code,
        plan_name=plan_name,
        plan_version=plan_version,
        effective_from=effective_from,
        currency=currency.strip(),
        definition=definition,
        content_sha256=content_sha256,
        published_at=published_at,
    )


def book_fingerprint(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """``(metrics, plan versions)`` published: entries are insert-only (a trigger refuses
    UPDATE and DELETE), so equal counts mean the same book (a cache key)."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM billable_metrics), (SELECT count(*) FROM plan_versions)"
    ).fetchone()
    assert row is not None  # a SELECT of two scalars always returns one row
    return int(row[0]), int(row[1])


def published_entries(conn: psycopg.Connection[Any]) -> list[Entry]:
    """Every published entry: metrics by code, then plan versions by (plan, version)."""
    entries: list[Entry] = []
    with conn.cursor(row_factory=args_row(_metric)) as cur:
        entries.extend(
            cur.execute(
                "SELECT metric_code, definition, content_sha256, published_at "
                "FROM billable_metrics ORDER BY metric_code"
            ).fetchall()
        )
    with conn.cursor(row_factory=args_row(_version)) as cur:
        entries.extend(
            cur.execute(
                "SELECT plan_code, plan_name, plan_version, effective_from, currency, definition, "
                "content_sha256, published_at FROM plan_versions ORDER BY plan_code, plan_version"
            ).fetchall()
        )
    return entries


def published_book(conn: psycopg.Connection[Any]) -> PriceBook:
    """The price book in force: every published entry, assembled and validated (an
    empty book when nothing was published: pure pass-through customers need none).

    Raises:
        PriceBookError: the stored entries do not make a valid book (they were
            validated together when published: only a hand-edited database).
    """
    return assemble(published_entries(conn), source="published price book (PostgreSQL)")


def insert_entries(
    conn: psycopg.Connection[Any], entries: list[Entry], *, published_by: str
) -> int:
    """Insert entries not stored yet (``ON CONFLICT DO NOTHING``); returns how many.

    ``published_by`` and the entries' ``published_at`` are not sent: a trigger of migration
    0018 stamps ``session_user`` and ``now()`` (the pricing role may not name those
    columns); read the entries back (:func:`published_entries`) for the stored times.
    ``published_by`` stays in the signature for the store protocol (the memory twin
    records it)."""
    inserted = 0
    for entry in entries:
        definition = json.dumps(entry.definition, sort_keys=True)
        if isinstance(entry, BillableMetricPublished):
            cur = conn.execute(
                """
                INSERT INTO billable_metrics (metric_code, definition, content_sha256)
                VALUES (%s, %s, %s) ON CONFLICT DO NOTHING
                """,
                (entry.metric_code, definition, entry.content_sha256),
            )
        else:
            cur = conn.execute(
                """
                INSERT INTO plan_versions (plan_code, plan_version, plan_name, effective_from,
                    currency, definition, content_sha256)
                VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING
                """,
                (
                    entry.plan_code,
                    entry.plan_version,
                    entry.plan_name,
                    entry.effective_from,
                    entry.currency,
                    definition,
                    entry.content_sha256,
                ),
            )
        inserted += cur.rowcount
    return inserted
