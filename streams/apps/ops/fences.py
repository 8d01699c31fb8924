"""``invoicing fences list``: the partition fences (``partition_fences``), one row each.

Resetting a group's fences is :func:`streams.core.billing.fencing.reset_group`.
"""

from __future__ import annotations

from typing import Any

import psycopg

#: Keys of a fence row as :func:`list_fences` returns it, in column order.
FENCE_KEYS = ("group", "topic", "partition", "generation", "member", "updated")


def list_fences(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Every fence row as ``{group, topic, partition, generation, member, updated}``,
    ordered by group, topic and partition."""
    rows = conn.execute(
        "SELECT group_id, topic, partition, generation, member_id, updated_at FROM partition_fences "
        "ORDER BY 1, 2, 3"
    ).fetchall()
    return [dict(zip(FENCE_KEYS, r, strict=True)) for r in rows]
