"""The usage view commits a source offset only once the changelog records sent before
the commit are on the broker (streams/apps/usage_view/batch.py ``ChangelogDeliveries``;
docs/decisions/0098-usage-view-state.md).

The first test pins why on the installed faust: its producer buffer's ``flush``, which
its consumer awaits before a commit, returns while a record is still on its way to
aiokafka, so faust's own order (flush, then commit) does not keep a commit behind the
changelog. The others hold :class:`ChangelogDeliveries`, :func:`guard_commits` (through
faust's own ``Consumer._commit_offsets``) and :func:`withhold` (against faust's
``Consumer.ack``) to their contract. No broker: the records' futures are resolved by
the test.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import Consumer
from faust.transport.producer import ProducerBuffer
from faust.types.tuples import TP, FutureMessage

from streams.apps.usage_view.batch import (
    ChangelogDeliveries,
    ChangelogNotDelivered,
    guard_commits,
    withhold,
)


def _event(offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(offset=offset, acked=False))


def _future() -> FutureMessage:
    return FutureMessage(SimpleNamespace())  # type: ignore[arg-type]


def test_fausts_buffer_flush_returns_before_a_slow_record_reached_the_producer() -> None:
    """A record whose hand-over to aiokafka takes longer than 0.1 s (aiokafka waits for
    room in a batch) is still undelivered when ``ProducerBuffer.flush`` returns."""

    async def scenario() -> tuple[bool, bool]:
        handed_over = asyncio.Event()

        async def publish_message(fut: FutureMessage, wait: bool = False) -> None:
            await asyncio.sleep(0.5)
            handed_over.set()
            fut.set_result(None)  # type: ignore[arg-type]

        buffer = ProducerBuffer()
        buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
        await buffer.start()
        try:
            fut = FutureMessage(
                SimpleNamespace(channel=SimpleNamespace(publish_message=publish_message))  # type: ignore[arg-type]
            )
            buffer.put(fut)
            second = FutureMessage(
                SimpleNamespace(channel=SimpleNamespace(publish_message=publish_message))  # type: ignore[arg-type]
            )
            buffer.put(second)
            await buffer.flush()
            flushed_early = not fut.done() or not second.done()
            await asyncio.wait_for(asyncio.gather(fut, second), 5)
            return flushed_early, handed_over.is_set()
        finally:
            await buffer.stop()

    flushed_early, handed_over = asyncio.run(scenario())
    assert flushed_early, "faust's flush now waits for every record: delivered() may be redundant"
    assert handed_over


def _deliveries(timeout_s: float = 5.0) -> ChangelogDeliveries:
    return ChangelogDeliveries(timeout_s=timeout_s)


def test_a_wait_returns_once_every_record_tracked_before_it_is_on_the_broker() -> None:
    async def scenario() -> tuple[list[bool], bool, int]:
        deliveries = _deliveries()
        sent = [_future() for _ in range(3)]
        deliveries.track([*sent, None])  # None: a test table's send records nothing
        waiting = asyncio.ensure_future(deliveries.wait())
        await asyncio.sleep(0.01)
        later = _future()
        deliveries.track([later])  # the next commit's
        done_before: list[bool] = []
        for fut in sent:
            await asyncio.sleep(0.01)
            done_before.append(waiting.done())
            fut.set_result(None)  # type: ignore[arg-type]
        await asyncio.wait_for(waiting, 1)
        return done_before, later.done(), deliveries.pending

    done_before, later_done, pending = asyncio.run(scenario())
    assert done_before == [False, False, False]
    assert not later_done and pending == 1


def test_with_nothing_tracked_a_wait_returns_at_once() -> None:
    asyncio.run(asyncio.wait_for(_deliveries().wait(), 1))


def test_a_failed_record_fails_that_commit_and_every_later_one() -> None:
    async def scenario() -> list[str]:
        deliveries = _deliveries()
        sent = [_future() for _ in range(3)]
        deliveries.track(sent)
        sent[0].set_result(None)  # type: ignore[arg-type]
        sent[1].set_exception(TimeoutError("no leader for the changelog partition"))
        sent[2].set_result(None)  # type: ignore[arg-type]
        errors = []
        for _ in range(2):
            with pytest.raises(ChangelogNotDelivered) as caught:
                await deliveries.wait()
            assert isinstance(caught.value.__cause__, TimeoutError)
            errors.append(str(caught.value))
        return errors

    assert (
        asyncio.run(scenario())
        == [
            "a changelog record was not delivered: TimeoutError:"
            " no leader for the changelog partition"
        ]
        * 2
    )


def test_records_still_undelivered_after_the_timeout_fail_the_commit() -> None:
    async def scenario() -> None:
        deliveries = _deliveries(timeout_s=0.05)
        sent = [_future() for _ in range(4)]
        deliveries.track(sent)
        sent[0].set_result(None)  # type: ignore[arg-type]
        await deliveries.wait()

    with pytest.raises(ChangelogNotDelivered) as caught:
        asyncio.run(scenario())
    assert str(caught.value) == "3 of 4 changelog records not delivered after 0.05 s"


class _Log:
    """faust's service logger, as ``Consumer._commit_offsets`` uses it: every call a no-op."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


def test_fausts_commit_waits_for_the_tracked_records_once_guarded() -> None:
    """Through the installed faust's ``Consumer._commit_offsets``: with the producer's
    flush guarded, the offsets are committed only after the tracked record is delivered."""
    tp = TP("billing.account-events.v1", 3)

    async def scenario() -> list[str]:
        steps: list[str] = []

        async def flush() -> None:
            steps.append("faust's flush")

        async def commit(offsets: Any) -> bool:
            steps.append(f"commit {dict(offsets)}")
            return True

        app = SimpleNamespace(
            producer=SimpleNamespace(flush=flush),
            tables=SimpleNamespace(on_commit=lambda offsets: None),
            monitor=SimpleNamespace(on_tp_commit=lambda offsets: None),
        )
        consumer = SimpleNamespace(
            app=app,
            log=_Log(),
            assignment=lambda: {tp},
            in_transaction=False,
            _commit=commit,
            _committed_offset={},
        )
        deliveries = _deliveries()
        guard_commits(app, deliveries)
        record = _future()
        deliveries.track([record])
        committing = asyncio.ensure_future(Consumer._commit_offsets(consumer, {tp: 42}))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        steps.append("record delivered")
        record.set_result(None)  # type: ignore[arg-type]
        assert await asyncio.wait_for(committing, 1) is True
        return steps

    assert asyncio.run(scenario()) == [
        "record delivered",
        "faust's flush",
        f"commit {{{tp!r}: 42}}",
    ]


class _Message:
    """What faust's ``Consumer.ack`` reads of a message (hashable, as its messages are)."""

    def __init__(self, tp: TP, offset: int) -> None:
        self.tp, self.topic, self.offset, self.acked = tp, tp.topic, offset, False


def _consumer() -> Any:
    """What faust's ``Consumer.ack`` reads and writes of its consumer."""
    return SimpleNamespace(
        app=SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True)),
        _committed_offset=defaultdict(lambda: None),
        _acked_index=defaultdict(set),
        _acked=defaultdict(list),
        _unacked_messages=set(),
        _n_acked=0,
        _waiting_for_ack=None,
    )


def test_fausts_ack_leaves_a_withheld_offset_out_of_what_it_commits() -> None:
    tp = TP("billing.account-events.v1", 3)
    kept, held = (_Message(tp, offset) for offset in (41, 42))
    consumer = _consumer()
    withhold([SimpleNamespace(message=held)])
    assert Consumer.ack(consumer, kept) is True  # type: ignore[arg-type]
    assert Consumer.ack(consumer, held) is False  # type: ignore[arg-type]
    assert consumer._acked[tp] == [41]
