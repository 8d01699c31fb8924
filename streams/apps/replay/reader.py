"""Re-read ``billing.account-events.v1`` over a window of offsets, in the replay's own group.

* **Window** (:func:`plan_window`): per partition, the start offset is
  ``offsets_for_times(period start - margin)`` — record timestamps are produce
  times, so this is the first record produced at or after that instant (the
  partition's high watermark when there is none) — and the end offset is the
  high watermark read when the run begins (exclusive). Both are stored with the
  run (``replay_runs``), so a resumed run re-reads exactly the same records.
* **Read** (:func:`read_window`): a consumer of group ``<prefix>replay-<period>-<run id>``
  that joins no group (``assign`` at the start offsets, i.e. seek), with
  auto-commit off. Every second, and at the end, it commits the next offsets
  it will read (through the kernel's :class:`~streams.core.billing.commit.CommitPoint`;
  nothing is written to the database for them, so there is no step 1), so the group's committed offsets (and its lag against the end
  offsets, e.g. ``kafka-consumer-groups --describe``) show the run's progress.
  A resumed run re-reads from the stored start offsets (the rebuilt usage is
  held in memory, not stored), and its commits move the same group again.
  ``isolation.level=read_committed`` (the project's consumer default); a
  partition whose end-of-partition is reached is finished even when the end
  offset itself was a control record.

Raises :class:`~streams.apps.replay.errors.ReplayUnavailable` when Kafka does not
answer, or when no record arrives for :data:`STALL_S` seconds while partitions
are unfinished. The caller's ``check`` (the lease's ``ensure_held``) runs after
every batch; whatever it raises propagates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from rich.progress import Progress

from streams.adapters.kafka import offsets_for_times, record_of
from streams.apps.replay.errors import ReplayUnavailable
from streams.core.billing.commit import CommitPoint
from streams.core.billing.rows import Record

logger = logging.getLogger(__name__)

#: Seconds without any record or end-of-partition before the re-read is declared stalled.
STALL_S = 60.0
#: Records per ``consume`` call.
BATCH = 500
#: Seconds a ``consume`` call may wait: it returns early only with a full batch, so a long
#: wait would delay the last, partial batch of every run by that much.
CONSUME_WAIT_S = 0.1
#: Seconds between progress commits of the replay's consumer group.
COMMIT_EVERY_S = 1.0


@dataclass(frozen=True)
class Window:
    """What a run re-reads: ``start[p]`` to ``end[p]`` (exclusive) per partition of ``topic``.

    ``since`` is the instant ``start`` was looked up for (period start - margin, UTC).
    """

    topic: str
    since: datetime
    start: dict[int, int]
    end: dict[int, int]

    @property
    def total(self) -> int:
        """Records in the window (offsets; compacted or control records may make it fewer)."""
        return sum(max(0, self.end[p] - self.start[p]) for p in self.start)

    def bounds(self) -> dict[int, tuple[int, int]]:
        """partition → (start, end)."""
        return {p: (self.start[p], self.end[p]) for p in self.start}

    @staticmethod
    def offsets_json(offsets: dict[int, int]) -> dict[str, int]:
        return {str(p): o for p, o in sorted(offsets.items())}

    @staticmethod
    def offsets_from_json(raw: dict[str, Any]) -> dict[int, int]:
        return {int(p): int(o) for p, o in raw.items()}


@dataclass(frozen=True)
class ReadStats:
    """What :func:`read_window` read: records and wall-clock seconds."""

    records: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def plan_window(consumer: Consumer, topic: str, since: datetime) -> Window:
    """Start offsets at ``since`` and the current end offsets of every partition of ``topic``.

    Raises:
        ReplayUnavailable: metadata, ``offsets_for_times`` or watermarks did not answer,
            or the topic does not exist.
    """
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise ReplayUnavailable(f"topic {topic} does not exist or has no partitions")
        partitions = sorted(described.partitions)
        since_ms = int(since.timestamp() * 1000)
        found = offsets_for_times(
            consumer, [TopicPartition(topic, p, since_ms) for p in partitions]
        )
        start: dict[int, int] = {}
        end: dict[int, int] = {}
        for tp in found:
            if tp.error is not None:
                raise ReplayUnavailable(f"offsets_for_times on {topic}[{tp.partition}]: {tp.error}")
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, tp.partition), timeout=10, cached=False
            )
            end[tp.partition] = int(high)
            # -1: no record at or after `since` on this partition: nothing to read.
            start[tp.partition] = int(tp.offset) if tp.offset >= 0 else int(high)
    except KafkaException as exc:
        raise ReplayUnavailable(f"planning the re-read of {topic} failed: {exc}") from exc
    return Window(topic=topic, since=since, start=start, end=end)


def read_window(
    consumer: Consumer,
    window: Window,
    on_record: Callable[[Record], None],
    *,
    check: Callable[[], None] = lambda: None,
    progress: Progress | None = None,
    description: str = "re-read",
) -> ReadStats:
    """Read every record of ``window`` once, in offset order per partition, into ``on_record``.

    Commits progress offsets to the consumer's group (see the module doc). Records
    at or beyond a partition's end offset are not delivered.

    Raises:
        ReplayUnavailable: a consume error, or no progress for :data:`STALL_S` seconds.
    """
    topic = window.topic
    pending = {p: window.end[p] for p in window.start if window.start[p] < window.end[p]}
    task = progress.add_task(description, total=window.total) if progress is not None else None
    started = time.monotonic()
    if not pending:
        return ReadStats(0, 0.0)
    consumer.assign([TopicPartition(topic, p, window.start[p]) for p in sorted(pending)])
    positions = {p: window.start[p] for p in pending}
    commits = CommitPoint(consumer, consequence="progress only: nothing to redo", counted=False)
    records = 0
    last_progress = last_commit = time.monotonic()
    try:
        while pending:
            check()
            messages = consumer.consume(BATCH, timeout=CONSUME_WAIT_S)
            now = time.monotonic()
            if not messages and now - last_progress > STALL_S:
                raise ReplayUnavailable(
                    f"re-read of {topic} stalled for {STALL_S}s with partitions "
                    f"{sorted(pending)} unfinished"
                )
            read = 0
            for msg in messages:
                err = msg.error()
                partition = msg.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and partition is not None:
                        pending.pop(partition, None)
                        last_progress = now
                        continue
                    raise ReplayUnavailable(f"re-read of {topic}[{partition}] failed: {err}")
                record = record_of(msg)
                end = pending.get(record.partition)
                if end is None or record.offset >= end:
                    continue  # produced after the run began: the next run's business
                on_record(record)
                read += 1
                positions[record.partition] = record.offset + 1
                if record.offset >= end - 1:
                    pending.pop(record.partition)
            if read:
                records += read
                last_progress = now
                if progress is not None and task is not None:
                    progress.advance(task, read)
            if now - last_commit >= COMMIT_EVERY_S:
                _commit(commits, topic, positions, asynchronous=True)
                last_commit = now
        _commit(commits, topic, positions, asynchronous=False)
    finally:
        if progress is not None and task is not None:
            progress.update(task, completed=window.total)
    return ReadStats(records, time.monotonic() - started)


def _commit(
    commits: CommitPoint, topic: str, positions: dict[int, int], *, asynchronous: bool
) -> None:
    """Record progress in the replay's group; a failure is logged, never fatal (progress only)."""
    commits.commit(
        [TopicPartition(topic, p, o) for p, o in sorted(positions.items())],
        asynchronous=asynchronous,
    )
