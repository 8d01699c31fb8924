"""Contract of the :class:`~streams.core.billing.ports.FenceStore` port: the partition fence
(claims only upward, a stale token's write refused, a claim waits for the write in
flight), the lease fence and close requests (docs/design.md "Ownership and fencing").

Run on the twin (:mod:`streams.adapters.memory.fencing`) and on PostgreSQL
(:mod:`streams.core.billing.fencing`, a sandbox database). Folded in from
``tests/integration/test_fencing.py`` (its four tests; the fence row is read through
the port: a check that passes holds exactly that token, a refused one says what the
fence holds).
"""

from __future__ import annotations

import threading

import pytest

from streams.core.billing.fencing import ClaimRefused, Fenced, FencingToken, LeaseFence, LeaseFenced
from tests.contracts.stores import PERIOD, StoreHarness, unique


def token(group: str, generation: int, member: str, partition: int = 3) -> FencingToken:
    return FencingToken(group, "billing.account-events.v1", partition, generation, member)


def stored(harness: StoreHarness, t: FencingToken) -> tuple[int, str] | None:
    """The (generation, member id) the fence of ``t``'s partition holds, None if none."""
    with harness.tx() as conn:
        try:
            harness.stores.fences.check(conn, t)
        except Fenced as exc:
            return exc.stored
    return (t.generation, t.member_id)


class FenceStoreContract:
    """The fence store's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> StoreHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    def claim(self, harness: StoreHarness, t: FencingToken) -> None:
        with harness.tx() as conn:
            harness.stores.fences.claim(conn, t)

    # ------------------------------------------------------------------ partition fence

    def test_claims_move_only_upward(self, harness: StoreHarness) -> None:
        # from tests/integration/test_fencing.py
        g = unique("g")
        a5 = token(g, 5, "member-a")
        self.claim(harness, a5)
        self.claim(harness, a5)  # the same token again: idempotent
        assert stored(harness, a5) == (5, "member-a")

        with pytest.raises(ClaimRefused, match="generation 4 refused"):
            self.claim(harness, token(g, 4, "member-b"))  # a delayed, older claim
        with pytest.raises(ClaimRefused, match="holds generation 5 member member-a"):
            self.claim(harness, token(g, 5, "member-b"))  # equal generation, foreign
        assert stored(harness, a5) == (5, "member-a")

        self.claim(harness, token(g, 7, "member-b"))
        assert stored(harness, a5) == (7, "member-b")
        # other partitions of the group are untouched
        assert stored(harness, token(g, 0, "x", partition=4)) is None

    def test_a_stale_token_cannot_write(self, harness: StoreHarness) -> None:
        # from tests/integration/test_fencing.py
        g = unique("g")
        old, new = token(g, 5, "member-a"), token(g, 6, "member-b")
        fences = harness.stores.fences
        with pytest.raises(Fenced, match="no claim"), harness.tx() as conn:
            fences.check(conn, old)  # nobody claimed the partition yet
        self.claim(harness, old)
        with harness.tx() as conn:
            fences.check(conn, old)
        self.claim(harness, new)
        held = "fence holds generation 6 member member-b"
        with pytest.raises(Fenced, match=held), harness.tx() as conn:
            fences.check(conn, old)
        with harness.tx() as conn:
            fences.check(conn, new)

    def test_one_read_checks_every_partition_of_a_batch(self, harness: StoreHarness) -> None:
        g = unique("g")
        mine = [token(g, 5, "member-a", partition=p) for p in (0, 1, 2)]
        for t in mine:
            self.claim(harness, t)
        self.claim(harness, token(g, 6, "member-b", partition=1))  # partition 1 moved on
        unclaimed = token(g, 5, "member-a", partition=9)
        with harness.tx() as conn:
            refused = harness.stores.fences.check_many(conn, [*mine, unclaimed])
        assert [(f.token.partition, f.stored) for f in refused] == [
            (1, (6, "member-b")),
            (9, None),
        ]
        with harness.tx() as conn:
            assert harness.stores.fences.check_many(conn, [mine[0], mine[2]]) == []
            assert harness.stores.fences.check_many(conn, []) == []

    def test_a_claim_waits_for_the_write_in_flight(self, harness: StoreHarness) -> None:
        """The check holds the fence row FOR SHARE until the writer commits: the new owner's
        claim is serialised after it, so the old owner's write is either wholly before the
        claim or refused; it never lands after a claim it did not see.
        (From tests/integration/test_fencing.py.)"""
        g = unique("g")
        old, new = token(g, 5, "member-a"), token(g, 6, "member-b")
        self.claim(harness, old)
        claimed = threading.Event()
        errors: list[BaseException] = []

        def new_owner() -> None:
            try:
                self.claim(harness, new)
                claimed.set()
            except BaseException as exc:  # reported below
                errors.append(exc)

        with harness.db.connection() as writer:
            with writer.transaction():
                harness.stores.fences.check(writer, old)
                thread = threading.Thread(target=new_owner, daemon=True)
                thread.start()
                assert not claimed.wait(harness.blocked_s), (
                    "the claim did not wait for the write in flight"
                )
            # the old owner's transaction committed; only now does the claim go through
            assert claimed.wait(10.0), f"the claim never completed: {errors}"
            thread.join(5)
            assert not errors
            with pytest.raises(Fenced), writer.transaction():
                harness.stores.fences.check(writer, old)
        assert stored(harness, old) == (6, "member-b")

    def test_reset_group_deletes_only_that_groups_fences(self, harness: StoreHarness) -> None:
        # from tests/integration/test_fencing.py
        g, other_group = unique("g"), unique("other")
        self.claim(harness, token(g, 9, "member-a", partition=0))
        self.claim(harness, token(g, 9, "member-a", partition=1))
        other = FencingToken(other_group, "billing.account-events.v1", 0, 1, "m")
        self.claim(harness, other)
        try:
            with harness.tx() as conn:
                assert harness.stores.fences.reset_group(conn, g) == 2
            self.claim(harness, token(g, 1, "member-c", partition=0))  # from the bottom again
            assert stored(harness, other) == (1, "m")
        finally:
            with harness.tx() as conn:
                harness.stores.fences.reset_group(conn, other_group)

    # ------------------------------------------------------------------ lease fence

    def test_a_lease_fence_accepts_only_the_highest_number(self, harness: StoreHarness) -> None:
        lease = unique("lease")
        fences = harness.stores.fences
        with harness.tx() as conn:
            assert fences.lease_fence_floor(conn, lease) == 0
            fences.check_lease_fence(conn, lease, 3, "holder-a")
            fences.check_lease_fence(conn, lease, 3, "holder-a")  # the same holder again
        with harness.tx() as conn:
            fences.check_lease_fence(conn, lease, 5, "holder-b")
            assert fences.lease_fence_floor(conn, lease) == 5
        with pytest.raises(LeaseFenced) as caught, harness.tx() as conn:
            fences.check_lease_fence(conn, lease, 4, "holder-a")
        assert (caught.value.current_token, caught.value.current_holder) == (5, "holder-b")
        with harness.tx() as conn:
            assert fences.lease_fence_floor(conn, lease) == 5

    def test_close_requests_of_a_chunk_are_recorded_once_in_one_statement(
        self, harness: StoreHarness
    ) -> None:
        """``request_closes``: new customers inserted, an earlier run's rows returned as
        stored (its time and fencing number), an older holder refused with nothing written."""
        lease = unique("close-period")
        fences = harness.stores.fences
        earlier, new_a, new_b = unique("c"), unique("c"), unique("c")
        with harness.tx() as conn:
            first = fences.request_close(
                conn, LeaseFence(lease, 2, "closer-a"), earlier, PERIOD, unique("marker")
            )
        requests = [(earlier, unique("marker")), (new_a, unique("marker")), (new_b, unique("m"))]
        with harness.tx() as conn:
            got = fences.request_closes(conn, LeaseFence(lease, 3, "closer-b"), PERIOD, requests)
        assert sorted(got) == sorted([earlier, new_a, new_b])
        assert not got[earlier].new and got[new_a].new and got[new_b].new
        assert (got[earlier].requested_at, got[earlier].lease_fencing_token) == (
            first.requested_at,
            2,
        )
        assert {got[new_a].lease_fencing_token, got[new_b].lease_fencing_token} == {3}
        with harness.tx() as conn:  # a rerun: every row already there, nothing new
            again = fences.request_closes(conn, LeaseFence(lease, 3, "closer-b"), PERIOD, requests)
        assert not any(r.new for r in again.values())
        assert again[new_a].requested_at == got[new_a].requested_at
        late = unique("c")
        with pytest.raises(LeaseFenced), harness.tx() as conn:  # the older holder
            fences.request_closes(
                conn, LeaseFence(lease, 2, "closer-a"), PERIOD, [(late, unique("marker"))]
            )
        with harness.tx() as conn:
            assert fences.request_closes(
                conn, LeaseFence(lease, 3, "closer-b"), PERIOD, [(late, unique("marker"))]
            )[late].new

    def test_a_close_request_is_recorded_once_under_the_lease_fence(
        self, harness: StoreHarness
    ) -> None:
        lease, customer = unique("close-period"), unique("c")
        fence = LeaseFence(lease, 2, "closer-a")
        fences = harness.stores.fences
        with harness.tx() as conn:
            first = fences.request_close(conn, fence, customer, PERIOD, unique("marker"))
        with harness.tx() as conn:  # a rerun under a newer holder finds the stored request
            again = fences.request_close(
                conn, LeaseFence(lease, 3, "closer-b"), customer, PERIOD, unique("marker")
            )
        assert first.new and not again.new
        assert (again.requested_at, again.lease_fencing_token) == (first.requested_at, 2)
        assert first.requested_at.tzinfo is not None
        with pytest.raises(LeaseFenced), harness.tx() as conn:  # the older holder is refused
            fences.request_close(conn, fence, unique("c"), PERIOD, unique("marker"))
