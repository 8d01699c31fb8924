"""Twin of :mod:`streams.core.billing.store.dead_letters`: ``dead_letters`` in memory (the
:class:`~streams.core.billing.ports.DeadLetterStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`): one row per source
record (topic, partition, offset), ``ON CONFLICT DO NOTHING`` (the first row stays).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import DEAD_LETTERS
from streams.core.billing.rows import DeadLetterRecord
from streams.core.billing.store.text import safe_text

__all__ = ["record", "recorded"]

_KINDS = frozenset({"invalid", "conflict", "rejected", "unwritable"})


def recorded(
    conn: MemoryConnection, topic: str, partition: int, offsets: Iterable[int]
) -> dict[int, DeadLetterRecord]:
    """The dead letters already recorded for ``offsets`` of ``topic[partition]``, by offset."""
    wanted = set(offsets)
    if not wanted:
        return {}
    with conn.statement("dead_letters.recorded") as stmt:
        table = stmt.table(DEAD_LETTERS)
        found: dict[int, DeadLetterRecord] = {}
        for offset in wanted:
            row = table.get((topic, partition, offset))
            if row is not None:
                found[offset] = row
        return found


def record(conn: MemoryConnection, letters: Sequence[DeadLetterRecord]) -> None:
    """Record dead letters the topic acknowledged; a row already there is kept as it is."""
    if not letters:
        return
    with conn.statement("dead_letters.record") as stmt:
        table = stmt.table(DEAD_LETTERS)
        for letter in letters:
            if letter.kind not in _KINDS:
                raise stmt.check_violation("dead_letters_kind_check", f"kind {letter.kind!r}")
            key = (letter.source_topic, letter.source_partition, letter.source_offset)
            if key in table:
                continue
            table[key] = DeadLetterRecord(
                letter.source_topic,
                letter.source_partition,
                letter.source_offset,
                letter.dlq_topic,
                letter.kind,
                safe_text(letter.reason, 2000),
                safe_text(letter.event_id, 256) if letter.event_id is not None else None,
                [safe_text(c, 128) for c in letter.customers],
            )
