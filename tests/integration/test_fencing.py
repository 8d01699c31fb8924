"""The database's fencing of partition owners (DESIGN "Ownership and fencing"), on the
real PostgreSQL: claims only move upward, a stale token's write is refused, and a
claim waits for a write already in flight instead of slipping under it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from streams.billing import fencing
from streams.billing.fencing import ClaimRefused, Fenced, FencingToken
from streams.settings import Settings


@pytest.fixture
def conn(settings: Settings, unique: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as c:
        yield c
        c.execute("DELETE FROM partition_fences WHERE group_id = %s", (f"g-{unique}",))


def _token(unique: str, generation: int, member: str, partition: int = 3) -> FencingToken:
    return FencingToken(f"g-{unique}", "billing.account-events.v1", partition, generation, member)


def _stored(conn: psycopg.Connection[Any], token: FencingToken) -> tuple[int, str] | None:
    row = conn.execute(
        "SELECT generation, member_id FROM partition_fences "
        "WHERE group_id = %s AND topic = %s AND partition = %s",
        (token.group_id, token.topic, token.partition),
    ).fetchone()
    return (int(row[0]), str(row[1])) if row else None


def test_claims_move_only_upward(conn: psycopg.Connection[Any], unique: str) -> None:
    a5 = _token(unique, 5, "member-a")
    fencing.claim(conn, a5)
    fencing.claim(conn, a5)  # the same token again: idempotent
    assert _stored(conn, a5) == (5, "member-a")

    with pytest.raises(ClaimRefused, match="generation 4 refused"):
        fencing.claim(conn, _token(unique, 4, "member-b"))  # a delayed, older claim
    with pytest.raises(ClaimRefused, match="holds generation 5 member member-a"):
        fencing.claim(conn, _token(unique, 5, "member-b"))  # equal generation, foreign
    assert _stored(conn, a5) == (5, "member-a")

    fencing.claim(conn, _token(unique, 7, "member-b"))
    assert _stored(conn, a5) == (7, "member-b")
    # other partitions of the group are untouched
    assert _stored(conn, _token(unique, 0, "x", partition=4)) is None


def test_a_stale_token_cannot_write(conn: psycopg.Connection[Any], unique: str) -> None:
    old, new = _token(unique, 5, "member-a"), _token(unique, 6, "member-b")
    with pytest.raises(Fenced, match="no claim"), conn.transaction():
        fencing.check(conn, old)  # nobody claimed the partition yet
    fencing.claim(conn, old)
    with conn.transaction():
        fencing.check(conn, old)
    fencing.claim(conn, new)
    held = "fence holds generation 6 member member-b"
    with pytest.raises(Fenced, match=held), conn.transaction():
        fencing.check(conn, old)
    with conn.transaction():
        fencing.check(conn, new)


def test_a_claim_waits_for_the_write_in_flight(
    settings: Settings, conn: psycopg.Connection[Any], unique: str
) -> None:
    """The check holds the fence row FOR SHARE until the writer commits: the new owner's
    claim is serialised after it, so the old owner's write is either wholly before the
    claim or refused; it never lands after a claim it did not see."""
    old, new = _token(unique, 5, "member-a"), _token(unique, 6, "member-b")
    fencing.claim(conn, old)
    claimed = threading.Event()
    errors: list[BaseException] = []

    def new_owner() -> None:
        try:
            with psycopg.connect(settings.postgres.dsn("owner"), autocommit=True) as c2:
                fencing.claim(c2, new)
            claimed.set()
        except BaseException as exc:  # reported below
            errors.append(exc)

    with psycopg.connect(settings.postgres.dsn("owner")) as writer:
        with writer.transaction():
            fencing.check(writer, old)
            thread = threading.Thread(target=new_owner, daemon=True)
            thread.start()
            assert not claimed.wait(1.0), "the claim did not wait for the write in flight"
        # the old owner's transaction committed; only now does the claim go through
        assert claimed.wait(10.0), f"the claim never completed: {errors}"
        thread.join(5)
        assert not errors
        with pytest.raises(Fenced), writer.transaction():
            fencing.check(writer, old)
    assert _stored(conn, old) == (6, "member-b")


def test_reset_group_deletes_only_that_groups_fences(
    conn: psycopg.Connection[Any], unique: str
) -> None:
    fencing.claim(conn, _token(unique, 9, "member-a", partition=0))
    fencing.claim(conn, _token(unique, 9, "member-a", partition=1))
    other = FencingToken(f"other-{unique}", "billing.account-events.v1", 0, 1, "m")
    fencing.claim(conn, other)
    try:
        assert fencing.reset_group(conn, f"g-{unique}") == 2
        fencing.claim(conn, _token(unique, 1, "member-c", partition=0))  # from the bottom again
        assert _stored(conn, other) == (1, "m")
    finally:
        fencing.reset_group(conn, f"other-{unique}")
