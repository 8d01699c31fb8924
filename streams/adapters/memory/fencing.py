"""Twin of the fence tables of :mod:`streams.core.billing.fencing` (the
:class:`~streams.core.billing.ports.FenceStore` port over a
:class:`~streams.adapters.memory.database.MemoryConnection`): ``partition_fences``,
``lease_fences`` and ``close_requests`` in memory, with the same errors.

The rules kept: a partition claim moves only upward (a higher generation wins; the
same token again is a no-op; a lower generation, or an equal one of another member,
is refused with :class:`~streams.core.billing.fencing.ClaimRefused`) and commits in a
transaction of its own (a savepoint inside an open one, as psycopg's
``conn.transaction()``); a check refuses every token but the stored one with
:class:`~streams.core.billing.fencing.Fenced`. The check and the writes after it are
atomic: the twin's transaction holds the whole database until it ends, so a claim
waits for a write in flight (PostgreSQL: the check's ``FOR SHARE`` row lock). A lease
fence accepts a number not lower than the recorded one and records it; a close
request is inserted once per (customer, period), and read back.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from streams.adapters.memory.database import MemoryConnection
from streams.adapters.memory.store.tables import (
    CLOSE_REQUESTS,
    LEASE_FENCES,
    PARTITION_FENCES,
    CloseRequestRow,
    LeaseFenceRow,
    PartitionFenceRow,
    check_period,
)
from streams.core.billing.fencing import (
    ClaimRefused,
    CloseRequest,
    Fenced,
    FencingToken,
    LeaseFence,
    LeaseFenced,
    LeaseStoreError,
)
from streams.errors import InvoicingError

__all__ = [
    "check",
    "check_lease_fence",
    "check_many",
    "claim",
    "lease_fence_floor",
    "request_close",
    "request_closes",
    "reset_group",
]


def claim(conn: MemoryConnection, token: FencingToken) -> None:
    """Claim ``token``'s partition upward, in its own transaction (commits).

    Raises:
        ClaimRefused: the stored generation is higher, or equal with another member.
    """
    with conn.transaction(), conn.statement("fences.claim") as stmt:
        table = stmt.table(PARTITION_FENCES)
        key = (token.group_id, token.topic, token.partition)
        stored: PartitionFenceRow | None = table.get(key)
        if stored is None or stored.generation < token.generation:
            table[key] = PartitionFenceRow(
                token.group_id,
                token.topic,
                token.partition,
                token.generation,
                token.member_id,
                stmt.now,
            )
            return
        pair = (stored.generation, stored.member_id)
    if pair != (token.generation, token.member_id):
        raise ClaimRefused(token, pair)


def check(conn: MemoryConnection, token: FencingToken) -> None:
    """Inside the caller's transaction: verify the partition's fence still holds ``token``.

    Raises:
        Fenced: the row holds another token (or none).
    """
    with conn.statement("fences.check") as stmt:
        stored: PartitionFenceRow | None = stmt.table(PARTITION_FENCES).get(
            (token.group_id, token.topic, token.partition)
        )
    pair = (stored.generation, stored.member_id) if stored is not None else None
    if pair != (token.generation, token.member_id):
        raise Fenced(token, pair)


def check_many(conn: MemoryConnection, tokens: Sequence[FencingToken]) -> list[Fenced]:
    """:func:`check` of every token in one statement; returns the refusals (see
    :func:`streams.core.billing.fencing.check_many`)."""
    refused: list[Fenced] = []
    with conn.statement("fences.check_many") as stmt:
        table = stmt.table(PARTITION_FENCES)
        for token in tokens:
            stored: PartitionFenceRow | None = table.get(
                (token.group_id, token.topic, token.partition)
            )
            pair = (stored.generation, stored.member_id) if stored is not None else None
            if pair != (token.generation, token.member_id):
                refused.append(Fenced(token, pair))
    return refused


def reset_group(conn: MemoryConnection, group_id: str) -> int:
    """Delete every fence row of ``group_id``; returns how many (commits)."""
    with conn.transaction(), conn.statement("fences.reset_group") as stmt:
        table = stmt.table(PARTITION_FENCES)
        keys = [key for key in table if key[0] == group_id]
        for key in keys:
            del table[key]
        return len(keys)


def check_lease_fence(conn: MemoryConnection, lease_name: str, token: int, holder: str) -> None:
    """Accept this transaction's writes only if ``token`` is the highest fencing number
    seen for ``lease_name`` (recording it); equal numbers pass.

    Raises:
        LeaseFenced: a higher number is recorded.
        LeaseStoreError: the database failed (an injected failure, the twin down).
    """
    try:
        with conn.statement("fences.check_lease_fence") as stmt:
            table = stmt.table(LEASE_FENCES)
            current: LeaseFenceRow | None = table.get(lease_name)
            if current is None or current.fencing_token <= token:
                table[lease_name] = LeaseFenceRow(lease_name, token, holder, stmt.now)
                return
    except psycopg.Error as exc:
        raise LeaseStoreError(
            f"checking the fence of lease {lease_name!r} failed: {exc}",
            lease=lease_name,
            sqlstate=exc.sqlstate,
        ) from exc
    raise LeaseFenced(
        f"lease {lease_name!r}: fencing token {token} of {holder!r} is stale; "
        f"{current.holder!r} holds {current.fencing_token}",
        lease=lease_name,
        token=token,
        current_token=current.fencing_token,
        current_holder=current.holder,
    )


def lease_fence_floor(conn: MemoryConnection, lease_name: str) -> int:
    """The highest fencing number recorded for ``lease_name`` (0 if none).

    Raises:
        LeaseStoreError: the database failed.
    """
    try:
        with conn.statement("fences.lease_fence_floor") as stmt:
            current: LeaseFenceRow | None = stmt.table(LEASE_FENCES).get(lease_name)
    except psycopg.Error as exc:
        raise LeaseStoreError(
            f"reading the fence of lease {lease_name!r} failed: {exc}",
            lease=lease_name,
            sqlstate=exc.sqlstate,
        ) from exc
    return current.fencing_token if current is not None else 0


def request_close(
    conn: MemoryConnection,
    fence: LeaseFence,
    customer_id: str,
    billing_period: str,
    event_id: str,
) -> CloseRequest:
    """Inside the caller's transaction: the lease fence check, then the customer's
    ``close_requests`` row (inserted once; the stored one when it exists).

    Raises:
        LeaseFenced: a newer holder of the lease exists.
        LeaseStoreError: the database failed.
    """
    return request_closes(conn, fence, billing_period, [(customer_id, event_id)])[customer_id]


def request_closes(
    conn: MemoryConnection,
    fence: LeaseFence,
    billing_period: str,
    requests: Sequence[tuple[str, str]],
) -> dict[str, CloseRequest]:
    """:func:`request_close` of many customers under one fence check (see
    :func:`streams.core.billing.fencing.request_closes`).

    Raises:
        LeaseFenced: a newer holder of the lease exists.
        InvoicingError: an event id is already another customer's row.
    """
    check_lease_fence(conn, fence.lease_name, fence.fencing_token, fence.holder)
    found: dict[str, CloseRequest] = {}
    with conn.statement("fences.request_closes") as stmt:
        check_period(stmt, CLOSE_REQUESTS, billing_period)
        table = stmt.table(CLOSE_REQUESTS)
        before = dict(table)
        taken = {r.event_id for r in before.values()}
        for customer_id, event_id in requests:
            key = (customer_id, billing_period)
            row: CloseRequestRow | None = before.get(key)
            if row is not None:
                found[customer_id] = CloseRequest(False, row.requested_at, row.lease_fencing_token)
            elif event_id not in taken:
                table[key] = CloseRequestRow(
                    customer_id, billing_period, event_id, fence.fencing_token, stmt.now
                )
                taken.add(event_id)
                found[customer_id] = CloseRequest(True, stmt.now, fence.fencing_token)
    missing = [customer for customer, _ in requests if customer not in found]
    if missing:
        raise InvoicingError(
            f"close requests of {billing_period} not recorded for {len(missing)} customer(s) "
            f"(first: {missing[0]}): their marker event ids are already another row's"
        )
    return found
