"""Fencing tokens of partition owners, checked by the database on every write.

DESIGN "Ownership and fencing". A consumer-group member owns a partition from
the moment it is assigned; that ownership is a lease (session timeout,
``max.poll.interval.ms``) whose end the member cannot observe from inside. So
the database decides:

- On assignment the new owner **claims** the partition's row in
  ``partition_fences`` with its token ``(generation, member id)`` — only
  **upward**: a claim succeeds where the stored generation is lower (or the row
  already holds exactly this token); a claim that finds a higher or equal
  foreign token is refused and reported (:class:`ClaimRefused`).
- Every write transaction first reads the row ``FOR SHARE`` and aborts with
  :class:`Fenced` unless it still holds exactly the token it was assigned
  under. A stale owner therefore cannot commit once the new owner has claimed,
  even before the new owner writes anything; and a delayed claim from an old
  generation cannot take the row back.

The generation is the group generation id (classic protocol) or the member
epoch (KIP-848), parsed by :func:`streams.adapters.kafka.parse_group_metadata`.
A member keeps the token it acquired a partition under for as long as it keeps
the partition (cooperative-sticky), so partitions that never move are never
fenced by the rebalances of others.

Reference: M. Kleppmann, "How to do distributed locking" (2016) — fencing tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg


class FencingError(Exception):
    """Root of fencing errors."""


class Fenced(FencingError):
    """A write was refused: the partition's fence no longer holds our token.

    Permanent for this owner: it lost the partition; drop its work, do not retry.
    """

    def __init__(self, token: FencingToken, stored: tuple[int, str] | None) -> None:
        held = f"generation {stored[0]} member {stored[1]}" if stored else "no claim"
        super().__init__(
            f"fenced on {token.topic}[{token.partition}] (group {token.group_id}): we hold "
            f"generation {token.generation} member {token.member_id}, the fence holds {held}"
        )
        self.token = token
        self.stored = stored


class ClaimRefused(FencingError):
    """An assignment's claim found a newer (or equal, foreign) token: we are stale,
    or the group was reset (then an operator resets its fences: ``invoicing fences reset``)."""

    def __init__(self, token: FencingToken, stored: tuple[int, str]) -> None:
        super().__init__(
            f"claim of {token.topic}[{token.partition}] (group {token.group_id}) at generation "
            f"{token.generation} refused: the fence holds generation {stored[0]} member {stored[1]}"
        )
        self.token = token
        self.stored = stored


@dataclass(frozen=True)
class FencingToken:
    """Who may write for one partition: group, topic, partition, generation, member id."""

    group_id: str
    topic: str
    partition: int
    generation: int
    member_id: str


def claim(conn: psycopg.Connection[Any], token: FencingToken) -> None:
    """Claim ``token``'s partition upward, in its own transaction (commits).

    Idempotent for the same token.

    Raises:
        ClaimRefused: the stored generation is higher, or equal with another member.
    """
    with conn.transaction():
        row = conn.execute(
            """
            INSERT INTO partition_fences (group_id, topic, partition, generation, member_id, updated_at)
            VALUES (%s, %s, %s, %s, %s, now())
            ON CONFLICT (group_id, topic, partition) DO UPDATE
               SET generation = EXCLUDED.generation, member_id = EXCLUDED.member_id, updated_at = now()
             WHERE partition_fences.generation < EXCLUDED.generation
            RETURNING generation
            """,
            (token.group_id, token.topic, token.partition, token.generation, token.member_id),
        ).fetchone()
        if row is not None:
            return
        stored = conn.execute(
            "SELECT generation, member_id FROM partition_fences "
            "WHERE group_id = %s AND topic = %s AND partition = %s",
            (token.group_id, token.topic, token.partition),
        ).fetchone()
    if stored is None:  # deleted between the two statements: claim again
        claim(conn, token)
        return
    if (stored[0], stored[1]) != (token.generation, token.member_id):
        raise ClaimRefused(token, (int(stored[0]), str(stored[1])))


def check(conn: psycopg.Connection[Any], token: FencingToken) -> None:
    """Inside the caller's open transaction: hold the fence row ``FOR SHARE`` and
    verify it is still ours. Must be the first statement of every write transaction.

    Raises:
        Fenced: the row holds another token (or none).
    """
    row = conn.execute(
        "SELECT generation, member_id FROM partition_fences "
        "WHERE group_id = %s AND topic = %s AND partition = %s FOR SHARE",
        (token.group_id, token.topic, token.partition),
    ).fetchone()
    if row is None or (int(row[0]), str(row[1])) != (token.generation, token.member_id):
        raise Fenced(token, (int(row[0]), str(row[1])) if row else None)


def reset_group(conn: psycopg.Connection[Any], group_id: str) -> int:
    """Delete every fence row of ``group_id`` (operator command, after the group was
    deleted or its offsets expired and its generation restarted from the bottom).
    Returns the number of rows deleted. Run only while no member of the group runs."""
    with conn.transaction():
        cur = conn.execute("DELETE FROM partition_fences WHERE group_id = %s", (group_id,))
        return cur.rowcount
