"""A batch of the usage view is acknowledged only once its changelog records are on the
broker (streams/apps/usage_view/batch.py ``delivered``; docs/decisions/0098-usage-view-state.md).

The first test pins why on the installed faust: its producer buffer's ``flush``, which
its consumer awaits before a commit, returns while a record is still on its way to
aiokafka, so faust's own order (flush, then commit) does not keep a commit behind the
changelog. The others hold :func:`delivered` and :func:`withhold` to their contract, the
last against faust's ``Consumer.ack``. No broker: the records' futures are resolved by
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

from streams.apps.usage_view.batch import ChangelogNotDelivered, delivered, withhold


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


def test_delivered_returns_only_once_every_record_is_on_the_broker() -> None:
    async def scenario() -> tuple[list[bool], list[bool]]:
        sent = [_future() for _ in range(3)]
        events = [_event(n) for n in range(5)]
        waiting = asyncio.ensure_future(delivered(sent, events))
        done_before: list[bool] = []
        for fut in sent:
            await asyncio.sleep(0.01)
            done_before.append(waiting.done())
            fut.set_result(None)  # type: ignore[arg-type]
        await asyncio.wait_for(waiting, 1)
        return done_before, [e.message.acked for e in events]

    done_before, acked = asyncio.run(scenario())
    assert done_before == [False, False, False]
    assert acked == [False] * 5  # faust acknowledges them itself afterwards


def test_a_batch_with_no_changelog_record_is_delivered_at_once() -> None:
    events = [_event(0)]
    asyncio.run(asyncio.wait_for(delivered([], events), 1))
    assert not events[0].message.acked


def test_a_failed_record_withholds_the_whole_batch_and_says_how_many_failed() -> None:
    async def scenario(events: list[Any]) -> None:
        sent = [_future() for _ in range(4)]
        sent[0].set_result(None)  # type: ignore[arg-type]
        sent[2].set_exception(TimeoutError("no leader for the changelog partition"))
        sent[1].set_result(None)  # type: ignore[arg-type]
        sent[3].set_result(None)  # type: ignore[arg-type]
        await delivered(sent, events)

    events = [_event(n) for n in range(6)]
    with pytest.raises(ChangelogNotDelivered) as caught:
        asyncio.run(scenario(events))
    assert str(caught.value) == (
        "1 of 4 changelog records of a batch of 6 events were not delivered:"
        " TimeoutError: no leader for the changelog partition"
    )
    assert isinstance(caught.value.__cause__, TimeoutError)
    assert all(e.message.acked for e in events)


def test_a_cancelled_wait_withholds_the_batch_and_stays_a_cancellation() -> None:
    async def scenario(events: list[Any]) -> None:
        waiting = asyncio.ensure_future(delivered([_future()], events))
        await asyncio.sleep(0.01)
        waiting.cancel()
        await waiting

    events = [_event(n) for n in range(2)]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(scenario(events))
    assert all(e.message.acked for e in events)


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
