"""The three fences: how the database refuses a writer whose ownership has ended.

docs/design.md "The incident": a lock with an expiry is a lease; it can end while its holder still
works, and the holder cannot tell. So exclusivity is an optimisation and the
**database** decides what gets written: every write transaction of an owner
first checks, inside that transaction, a fencing token the owner was given when
its ownership began, and a stale token is refused (M. Kleppmann, "How to do
distributed locking", 2016). Three fences, one per kind of ownership:

=====================  =======================================  ================================
fence                  who holds it, and when it applies        table, check, refusal
=====================  =======================================  ================================
**partition fence**    an invoicing worker, per Kafka           ``partition_fences``;
                       partition it was assigned: every         :func:`claim` upward on
                       write of the worker (usage batches,      assignment, :func:`check`
                       holds, the invoice job's issuance,       ``FOR SHARE`` as the first
                       close records)                           statement; :class:`Fenced`,
                                                                :class:`ClaimRefused`
**lease fence**        a singleton job holding a Redis lease    ``lease_fences``;
                       (:class:`streams.adapters.lease.Lease`): :func:`check_lease_fence`
                       ``close-period`` (its close requests)    upserts upward as the first
                       and ``replay`` (run state, results and   statement;
                       every correction it issues)              :class:`LeaseFenced`
**close request**      ``close-period``, per (customer,         ``close_requests``;
                       period), under its lease fence, before   :func:`request_close` (lease
                       it produces the customer's close         fence check, then the row), so
                       marker                                   a marker is sent only for a
                                                                request a live holder recorded
=====================  =======================================  ================================

**Partition fence.** A consumer-group member owns a partition from the moment it
is assigned; that ownership is a lease (session timeout,
``max.poll.interval.ms``) whose end the member cannot observe from inside. Its
token is ``(generation, member id)``: the group generation id (classic
protocol) or the member epoch (KIP-848), parsed by
:func:`streams.adapters.kafka.parse_group_metadata`.

- On assignment the new owner **claims** the partition's row with its token —
  only **upward**: a claim succeeds where the stored generation is lower (or the
  row already holds exactly this token); a claim that finds a higher or equal
  foreign token is refused and reported (:class:`ClaimRefused`).
- Every write transaction first reads the row ``FOR SHARE`` and aborts with
  :class:`Fenced` unless it still holds exactly the token it was assigned
  under. A stale owner therefore cannot commit once the new owner has claimed,
  even before the new owner writes anything; and a delayed claim from an old
  generation cannot take the row back.
- A member keeps the token it acquired a partition under for as long as it
  keeps the partition (cooperative-sticky), so partitions that never move are
  never fenced by the rebalances of others. A group deleted (or whose offsets
  expired) restarts its generations low: every claim is refused until an
  operator runs :func:`reset_group` (``invoicing fences reset``).

**Lease fence.** The Redis side (acquire, renew, release, the ``INCR`` fencing
number) is :mod:`streams.adapters.lease`; the database side is here.
:func:`check_lease_fence` upserts the lease's ``lease_fences`` row only upward
inside the caller's transaction and raises :class:`LeaseFenced` when a higher
number is recorded; the upsert locks the row until the transaction ends, so a
newer holder's first write waits for an older holder's open transaction and
then refuses that holder everything after. :func:`lease_fence_floor` is the
highest number recorded, passed to ``Lease.acquire(floor=…)`` so that a Redis
that lost its counter still hands out a number the database accepts.

**Close request.** ``close-period`` records ``close_requests(customer_id,
billing_period, event_id, lease_fencing_token)`` in one lease-fenced
transaction before producing that customer's close marker
(:func:`request_close`); a rerun finds the stored row and re-sends the same
marker with the stored time and number, so every resend carries the same data
under the same id.

The invoice records which fence wrote it: ``invoices.fence_group /
fence_generation / fence_member`` for a partition fence, ``lease_fencing_token``
for a lease (the replay's, or the close-period lease a worker's marker carried).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import psycopg
from psycopg.rows import class_row, scalar_row

from streams.core.billing.lease_errors import LeaseFenced, LeaseStoreError
from streams.errors import InvoicingError

__all__ = [
    "ClaimRefused",
    "CloseRequest",
    "Fence",
    "Fenced",
    "FencingError",
    "FencingToken",
    "HeldLease",
    "LeaseFence",
    "LeaseFenced",
    "LeaseStoreError",
    "check",
    "check_lease_fence",
    "check_many",
    "claim",
    "lease_fence_floor",
    "request_close",
    "request_closes",
    "reset_group",
]


class FencingError(InvoicingError):
    """Root of the partition fence's errors (the lease fence's are
    :class:`~streams.adapters.lease.LeaseError`\\ s: :class:`LeaseFenced`, :class:`LeaseStoreError`)."""


# --------------------------------------------------------------------------- partition fence


@dataclass(frozen=True)
class FencingToken:
    """Who may write for one partition: group, topic, partition, generation, member id."""

    group_id: str
    topic: str
    partition: int
    generation: int
    member_id: str

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """:func:`check` this token (the :class:`Fence` protocol)."""
        check(conn, self)


class Fenced(FencingError):
    """A write was refused: the partition's fence no longer holds our token.

    Permanent for this owner: it lost the partition; drop its work, do not retry.
    ``stored`` is the (generation, member id) the fence holds, None when it holds none.
    """

    def __init__(self, token: FencingToken, stored: tuple[int, str] | None) -> None:
        held = "no claim"
        if stored is not None:
            generation, member = stored
            held = f"generation {generation} member {member}"
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
        generation, member = stored
        super().__init__(
            f"claim of {token.topic}[{token.partition}] (group {token.group_id}) at generation "
            f"{token.generation} refused: the fence holds generation {generation} member {member}"
        )
        self.token = token
        self.stored = stored


@dataclass(frozen=True)
class _Claim:
    generation: int
    member_id: str

    @property
    def pair(self) -> tuple[int, str]:
        return (int(self.generation), str(self.member_id))


def claim(conn: psycopg.Connection[Any], token: FencingToken) -> None:
    """Claim ``token``'s partition upward, in its own transaction (commits).

    Idempotent for the same token.

    Raises:
        ClaimRefused: the stored generation is higher, or equal with another member.
    """
    with conn.transaction(), conn.cursor(row_factory=class_row(_Claim)) as cur:
        won = cur.execute(
            """
            INSERT INTO partition_fences (group_id, topic, partition, generation, member_id, updated_at)
            VALUES (%s, %s, %s, %s, %s, now())
            ON CONFLICT (group_id, topic, partition) DO UPDATE
               SET generation = EXCLUDED.generation, member_id = EXCLUDED.member_id, updated_at = now()
             WHERE partition_fences.generation < EXCLUDED.generation
            RETURNING generation, member_id
            """,
            (token.group_id, token.topic, token.partition, token.generation, token.member_id),
        ).fetchone()
        if won is not None:
            return
        stored = cur.execute(
            "SELECT generation, member_id FROM partition_fences "
            "WHERE group_id = %s AND topic = %s AND partition = %s",
            (token.group_id, token.topic, token.partition),
        ).fetchone()
    if stored is None:  # deleted between the two statements: claim again
        claim(conn, token)
        return
    if stored.pair != (token.generation, token.member_id):
        raise ClaimRefused(token, stored.pair)


def check(conn: psycopg.Connection[Any], token: FencingToken) -> None:
    """Inside the caller's open transaction: hold the fence row ``FOR SHARE`` and
    verify it is still ours. Must be the first statement of every write transaction, or
    folded into its first write (the invoice's insert with ``checked=``:
    :func:`streams.core.billing.store.invoices.insert_invoice`).

    Raises:
        Fenced: the row holds another token (or none).
    """
    with conn.cursor(row_factory=class_row(_Claim)) as cur:
        stored = cur.execute(
            "SELECT generation, member_id FROM partition_fences "
            "WHERE group_id = %s AND topic = %s AND partition = %s FOR SHARE",
            (token.group_id, token.topic, token.partition),
        ).fetchone()
    if stored is None or stored.pair != (token.generation, token.member_id):
        raise Fenced(token, stored.pair if stored else None)


@dataclass(frozen=True)
class _PartitionClaim:
    partition: int
    generation: int
    member_id: str


def check_many(conn: psycopg.Connection[Any], tokens: Sequence[FencingToken]) -> list[Fenced]:
    """:func:`check` for the partitions of a poll batch in one statement (one group and
    topic): holds their fence rows ``FOR SHARE`` and returns the refusals, one
    :class:`Fenced` per token whose row holds another token or none. Must be the first
    statement of the batch's transaction; the caller writes only the effects of the
    partitions not refused. Raises nothing for a refusal (psycopg errors propagate)."""
    if not tokens:
        return []
    first = tokens[0]
    if any((t.group_id, t.topic) != (first.group_id, first.topic) for t in tokens):
        raise ValueError("check_many takes the tokens of one group and topic")
    with conn.cursor(row_factory=class_row(_PartitionClaim)) as cur:
        stored = {
            row.partition: (int(row.generation), str(row.member_id))
            for row in cur.execute(
                "SELECT partition, generation, member_id FROM partition_fences "
                "WHERE group_id = %s AND topic = %s AND partition = ANY(%s) "
                "ORDER BY partition FOR SHARE",
                (first.group_id, first.topic, [t.partition for t in tokens]),
            )
        }
    return [
        Fenced(token, stored.get(token.partition))
        for token in tokens
        if stored.get(token.partition) != (token.generation, token.member_id)
    ]


def reset_group(conn: psycopg.Connection[Any], group_id: str) -> int:
    """Delete every fence row of ``group_id`` (operator command, after the group was
    deleted or its offsets expired and its generation restarted from the bottom).
    Returns the number of rows deleted. Run only while no member of the group runs."""
    with conn.transaction():
        cur = conn.execute("DELETE FROM partition_fences WHERE group_id = %s", (group_id,))
        return cur.rowcount


# --------------------------------------------------------------------------- lease fence


_LEASE_UPSERT = """
INSERT INTO lease_fences (lease_name, fencing_token, holder, updated_at)
VALUES (%(name)s, %(token)s, %(holder)s, now())
ON CONFLICT (lease_name) DO UPDATE
   SET fencing_token = EXCLUDED.fencing_token,
       holder = EXCLUDED.holder,
       updated_at = EXCLUDED.updated_at
 WHERE lease_fences.fencing_token <= EXCLUDED.fencing_token
RETURNING fencing_token
"""


@dataclass(frozen=True)
class _LeaseRecord:
    fencing_token: int
    holder: str


def check_lease_fence(
    conn: psycopg.Connection[Any], lease_name: str, token: int, holder: str
) -> None:
    """Accept this transaction's writes only if ``token`` is the highest fencing number seen.

    Runs inside the caller's transaction (it neither begins nor commits): the
    ``lease_fences`` row of ``lease_name`` is upserted only upward and stays
    locked until the caller's transaction ends, so the caller's writes commit
    before a newer holder's first check, or not at all. Equal numbers pass (the
    same holder's many transactions).

    Args:
        conn: a psycopg connection in a transaction (or one that opens one).
        lease_name: the lease's name (``Lease.name``).
        token: the holder's fencing number (``Lease.fencing_token``).
        holder: the holder's name, recorded with the number.

    Raises:
        LeaseFenced: a higher number is recorded; roll the transaction back.
        LeaseStoreError: a database error (SQLSTATE kept).
    """
    try:
        with conn.cursor(row_factory=scalar_row) as cur:
            accepted = cur.execute(
                _LEASE_UPSERT, {"name": lease_name, "token": token, "holder": holder}
            ).fetchone()
        if accepted is not None:
            return
        with conn.cursor(row_factory=class_row(_LeaseRecord)) as cur:
            current = cur.execute(
                "SELECT fencing_token, holder FROM lease_fences WHERE lease_name = %s",
                (lease_name,),
            ).fetchone()
    except psycopg.Error as exc:
        raise LeaseStoreError(
            f"checking the fence of lease {lease_name!r} failed: {exc}",
            lease=lease_name,
            sqlstate=exc.sqlstate,
        ) from exc
    assert current is not None  # the upsert found a conflicting row, which is locked by now
    raise LeaseFenced(
        f"lease {lease_name!r}: fencing token {token} of {holder!r} is stale; "
        f"{current.holder!r} holds {int(current.fencing_token)}",
        lease=lease_name,
        token=token,
        current_token=int(current.fencing_token),
        current_holder=str(current.holder),
    )


def lease_fence_floor(conn: psycopg.Connection[Any], lease_name: str) -> int:
    """The highest fencing number the database recorded for ``lease_name`` (0 if none).

    Pass it as ``Lease.acquire(..., floor=…)`` so that a Redis that lost its
    counter still hands out a number the database accepts.

    Raises:
        LeaseStoreError: a database error (SQLSTATE kept).
    """
    try:
        with conn.cursor(row_factory=scalar_row) as cur:
            recorded = cur.execute(
                "SELECT fencing_token FROM lease_fences WHERE lease_name = %s", (lease_name,)
            ).fetchone()
    except psycopg.Error as exc:
        raise LeaseStoreError(
            f"reading the fence of lease {lease_name!r} failed: {exc}",
            lease=lease_name,
            sqlstate=exc.sqlstate,
        ) from exc
    return int(recorded) if recorded is not None else 0


class HeldLease(Protocol):
    """What a lease fence needs from a lease (:class:`streams.adapters.lease.Lease` has it)."""

    @property
    def name(self) -> str: ...
    @property
    def fencing_token(self) -> int: ...
    @property
    def holder(self) -> str: ...


@dataclass(frozen=True)
class LeaseFence:
    """A lease holder's fence: the lease name, its fencing number and the holder's name."""

    lease_name: str
    fencing_token: int
    holder: str

    @classmethod
    def of(cls, lease: HeldLease) -> LeaseFence:
        """The fence of a held lease."""
        return cls(lease.name, lease.fencing_token, lease.holder)

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """:func:`check_lease_fence` with this fence (the :class:`Fence` protocol)."""
        check_lease_fence(conn, self.lease_name, self.fencing_token, self.holder)


class Fence(Protocol):
    """A fence a write transaction checks first: :class:`FencingToken` (a partition)
    or :class:`LeaseFence` (a lease). ``check`` runs inside the caller's open
    transaction and raises (:class:`Fenced`, :class:`LeaseFenced`) when stale."""

    def check(self, conn: psycopg.Connection[Any]) -> None: ...


# --------------------------------------------------------------------------- close requests


@dataclass(frozen=True)
class CloseRequest:
    """A ``close_requests`` row: ``new`` when this call inserted it; ``requested_at``
    (UTC) and ``lease_fencing_token`` are the stored ones (the first request's)."""

    new: bool
    requested_at: datetime
    lease_fencing_token: int


def request_close(
    conn: psycopg.Connection[Any],
    fence: LeaseFence,
    customer_id: str,
    billing_period: str,
    event_id: str,
) -> CloseRequest:
    """Inside the caller's transaction: the lease fence check, then the customer's
    ``close_requests`` row (``ON CONFLICT DO NOTHING``; the stored row when it exists):
    :func:`request_closes` of one customer.

    Raises:
        LeaseFenced: a newer holder of the close-period lease exists.
        InvoicingError: the event id is already another customer's row.
        LeaseStoreError, psycopg.Error: the database failed.
    """
    return request_closes(conn, fence, billing_period, [(customer_id, event_id)])[customer_id]


@dataclass(frozen=True)
class _BatchRequested:
    customer_id: str
    new: bool
    requested_at: datetime
    lease_fencing_token: int


def request_closes(
    conn: psycopg.Connection[Any],
    fence: LeaseFence,
    billing_period: str,
    requests: Sequence[tuple[str, str]],
) -> dict[str, CloseRequest]:
    """:func:`request_close` for many customers at once, inside the caller's transaction:
    one lease fence check, then one statement that inserts every ``(customer id, event
    id)`` of ``requests`` not requested yet (``ON CONFLICT DO NOTHING``) and returns, per
    customer, the row as stored (the inserted one, or the one an earlier run stored).
    Customer ids must be distinct.

    Returns:
        customer id → :class:`CloseRequest`, one per request.

    Raises:
        LeaseFenced: a newer holder of the close-period lease exists.
        InvoicingError: a request's event id is already another customer's row (nothing
            can be stored for it; an integrity problem, never retried).
        LeaseStoreError, psycopg.Error: the database failed.
    """
    fence.check(conn)
    if not requests:
        return {}
    customers = [customer for customer, _ in requests]
    event_ids = [event_id for _, event_id in requests]
    with conn.cursor(row_factory=class_row(_BatchRequested)) as cur:
        # The main query's snapshot predates the CTE's insert: the join on close_requests
        # finds exactly the rows an earlier run stored.
        rows = cur.execute(
            """
            WITH wanted AS (
                SELECT * FROM unnest(%(customers)s::text[], %(event_ids)s::text[])
                    AS w (customer_id, event_id)
            ), inserted AS (
                INSERT INTO close_requests (customer_id, billing_period, event_id, lease_fencing_token)
                SELECT customer_id, %(period)s, event_id, %(token)s FROM wanted
                ON CONFLICT DO NOTHING
                RETURNING customer_id, requested_at, lease_fencing_token
            )
            SELECT w.customer_id, i.customer_id IS NOT NULL AS new,
                   coalesce(i.requested_at, c.requested_at) AS requested_at,
                   coalesce(i.lease_fencing_token, c.lease_fencing_token) AS lease_fencing_token
              FROM wanted w
              LEFT JOIN inserted i ON i.customer_id = w.customer_id
              LEFT JOIN close_requests c
                ON c.customer_id = w.customer_id AND c.billing_period = %(period)s
            """,
            {
                "customers": customers,
                "event_ids": event_ids,
                "period": billing_period,
                "token": fence.fencing_token,
            },
        ).fetchall()
    found = {
        row.customer_id: CloseRequest(row.new, row.requested_at, int(row.lease_fencing_token))
        for row in rows
        if row.requested_at is not None
    }
    missing = [customer for customer in customers if customer not in found]
    if missing:  # an event id taken by another customer's row: an integrity problem
        raise InvoicingError(
            f"close requests of {billing_period} not recorded for {len(missing)} customer(s) "
            f"(first: {missing[0]}): their marker event ids are already another row's"
        )
    return found
