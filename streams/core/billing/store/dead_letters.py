"""``dead_letters``: the records a consumer dead-lettered, by source coordinates (migration 0007).

Written after the dead-letter topic acknowledged the record, in the transaction
that moves past it (with its holds); read on every delivery of a batch, so that
a record is dead-lettered once and a record the database refused is not tried
again (:mod:`streams.core.billing.dead_letters`).

Every function runs in the caller's transaction (see :mod:`streams.core.billing.store`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import class_row

from streams.core.billing.rows import DeadLetterRecord
from streams.core.billing.store.text import safe_text

__all__ = ["record", "recorded"]


def recorded(
    conn: psycopg.Connection[Any], topic: str, partition: int, offsets: Iterable[int]
) -> dict[int, DeadLetterRecord]:
    """The dead letters already recorded for ``offsets`` of ``topic[partition]``, by offset."""
    wanted = sorted(set(offsets))
    if not wanted:
        return {}
    with conn.cursor(row_factory=class_row(DeadLetterRecord)) as cur:
        found = cur.execute(
            """
            SELECT source_topic, source_partition, source_offset, dlq_topic, kind, reason,
                   event_id, customers
              FROM dead_letters
             WHERE source_topic = %s AND source_partition = %s AND source_offset = ANY(%s)
            """,
            (topic, partition, wanted),
        ).fetchall()
    return {row.source_offset: row for row in found}


def record(conn: psycopg.Connection[Any], letters: Sequence[DeadLetterRecord]) -> None:
    """Record dead letters the topic acknowledged; a row already there is kept as it is."""
    if not letters:
        return
    with conn.cursor() as cur:
        cur.executemany(
            """
            INSERT INTO dead_letters (source_topic, source_partition, source_offset, dlq_topic,
                                      kind, reason, event_id, customers)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT (source_topic, source_partition, source_offset) DO NOTHING
            """,
            [
                (
                    letter.source_topic,
                    letter.source_partition,
                    letter.source_offset,
                    letter.dlq_topic,
                    letter.kind,
                    safe_text(letter.reason, 2000),
                    safe_text(letter.event_id, 256) if letter.event_id is not None else None,
                    [safe_text(c, 128) for c in letter.customers],
                )
                for letter in letters
            ],
        )
