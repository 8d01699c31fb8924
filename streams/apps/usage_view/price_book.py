"""The price book the view rates under: the seam between where books come from and the view.

The view asks a :class:`PriceBookSource` for the book in force on every request
and on every metered event (``current()``). The sources:

* :class:`FilePriceBook` — a YAML file (``--price-book FILE`` or
  ``INVOICING_VIEW__PRICE_BOOK``), loaded with the rating core's validating
  loader and reloaded when the file changes; a file that stops validating is
  logged and the last good book kept.
* :class:`PublishedPriceBook` — the published entries (``invoicing plans publish``),
  read from the compacted topic ``billing.price-book.v1`` by a
  :class:`PriceBookTopicReader`: the same entries the invoice job reads from
  PostgreSQL, so the view needs no database login. The default when no file is given.

With no entry published (and no file), the view rates under the empty book: pure
pass-through customers (the FOCUS re-billing) need none; metered usage is held as
``unknown_metric``, exactly as the invoice job would hold it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from streams.core.domain.rating import PriceBook, PriceBookError, load_price_book
from streams.core.domain.rating.published import Entry, assemble

log = logging.getLogger(__name__)

EMPTY_LABEL = "empty (pass-through only)"


class PriceBookSource(Protocol):
    """Where the view gets its price book: ``current()`` → (book, label for answers).

    ``refresh=True``: look at the source now rather than trust a recent look (the
    view asks so when a metered event names a metric the book it holds lacks: a book
    published a moment ago must not leave that event aggregated as unknown)."""

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]: ...


async def refresh_for_metrics(source: PriceBookSource, metrics: Iterable[str]) -> bool:
    """Look at ``source`` now (``current(refresh=True)``) when one of ``metrics`` (metric
    codes of metered events about to be applied) is not in the book it holds; the look
    runs in a thread (``asyncio.to_thread``), so the event loop goes on serving HTTP,
    timers and faust's own tasks while the published book syncs (up to its
    ``sync_timeout_s``, 2 s by default). Returns whether it looked.

    Called before a batch is applied, never inside it: the batch applies with the book
    held then (``current()``), so no apply waits for the broker.
    """
    book, _ = source.current()
    if all(book.metric(code) is not None for code in metrics):
        return False
    await asyncio.to_thread(source.current, refresh=True)
    return True


class StaticPriceBook:
    """One fixed book (tests, and the empty default)."""

    def __init__(self, book: PriceBook | None = None, label: str = EMPTY_LABEL) -> None:
        self._book = book or PriceBook()
        self._label = label

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]:
        return self._book, self._label


class FilePriceBook:
    """A YAML price book file, reloaded when its modification time or size changes
    (looked at most once per ``check_every_s``: the view asks on every record).

    Raises (constructor):
        PriceBookError: the file does not validate at start (every issue listed).
        OSError: the file cannot be read.
    """

    def __init__(self, path: Path, *, check_every_s: float = 1.0) -> None:
        self.path = path
        self.check_every_s = check_every_s
        self._checked = time.monotonic()
        self._lock = threading.Lock()
        self._stamp = self._stat()
        self._book = load_price_book(path.read_text(encoding="utf-8"), source=str(path))

    def _stat(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_mtime_ns, st.st_size

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]:
        with self._lock:
            if not refresh and time.monotonic() - self._checked < self.check_every_s:
                return self._book, f"file {self.path.name}"
            self._checked = time.monotonic()
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    self._stamp = stamp
                    self._book = load_price_book(
                        self.path.read_text(encoding="utf-8"), source=str(self.path)
                    )
                    log.info("price book reloaded from %s", self.path)
            except (OSError, PriceBookError) as exc:
                log.error(
                    "price book %s not reloaded, keeping the last good one: %s", self.path, exc
                )
            return self._book, f"file {self.path.name}"


class PublishedPriceBook:
    """The published price book, assembled from the entries of the compacted topic
    ``billing.price-book.v1`` (``invoicing plans publish`` writes every entry there
    after committing it to PostgreSQL, where the invoice job reads the same entries),
    with :func:`streams.core.domain.rating.published.assemble`, the rule the database side
    uses. A reader (:class:`PriceBookTopicReader`) calls :meth:`take` per record.

    ``sync(timeout_s)``: waits until the reader has read up to the topic's end (True)
    or the timeout passed (False); ``current(refresh=True)`` calls it, at most once per
    ``sync_every_s``, so a book published a moment ago is in force before a metered
    event of its new metric is aggregated. Entries that do not assemble (cannot
    happen after a refused-free publication) are logged and the last good book kept;
    with no entry yet, ``fallback`` (default the empty book) answers.
    """

    def __init__(
        self,
        fallback: PriceBookSource | None = None,
        *,
        sync: Callable[[float], bool] | None = None,
        sync_every_s: float = 1.0,
        sync_timeout_s: float = 2.0,
    ) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._book: PriceBook | None = None
        self._dirty = False
        self._fallback = fallback or StaticPriceBook()
        self._sync = sync
        self._sync_every_s = sync_every_s
        self._sync_timeout_s = sync_timeout_s
        self._synced = float("-inf")

    def take(self, entry: Entry) -> None:
        """One published entry (a later record of the same key replaces it)."""
        with self._lock:
            self._entries[entry.record_key()] = entry
            self._dirty = True

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]:
        if refresh and self._sync is not None:
            now = time.monotonic()
            if now - self._synced >= self._sync_every_s:
                self._synced = now
                self._sync(self._sync_timeout_s)
        with self._lock:
            if self._dirty:
                self._dirty = False
                try:
                    self._book = assemble(self._entries.values(), source="billing.price-book.v1")
                except PriceBookError as exc:
                    log.error("published entries do not assemble, keeping the last book: %s", exc)
            if self._book is None:
                return self._fallback.current(refresh=refresh)
            versions = sum(len(plan.versions) for plan in self._book.plans)
            return self._book, (
                f"published ({len(self._book.metrics)} metric(s), {versions} plan version(s))"
            )


class PriceBookTopicReader:
    """A daemon thread reading the price-book topic from its beginning into ``book``,
    on ``consumer`` (a reader that joins no group: partitions assigned, nothing
    committed; built by the composition root). Records that do not decode as a
    published entry are logged and skipped (they cannot have come from ``plans
    publish``).

    :meth:`caught_up` is the ``sync`` of :class:`PublishedPriceBook`.
    """

    def __init__(self, consumer: Any, topic: str, partitions: int, book: PublishedPriceBook):
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self._consumer = consumer
        self._topic = topic
        self._partitions = range(partitions)
        self._book = book
        self._next: dict[int, int] = {}
        self._cond = threading.Condition()
        # caught_up() asks, the reader thread (the consumer's only user) answers with the
        # partitions' (low, high) watermarks, or None when the broker did not answer
        self._asked = 0
        self._answered = 0
        self._ends: dict[int, tuple[int, int]] | None = None
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in self._partitions])
        self._thread = threading.Thread(target=self._run, name="price-book-reader", daemon=True)
        self._thread.start()

    def _watermarks(self) -> dict[int, tuple[int, int]] | None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            return {
                p: self._consumer.get_watermark_offsets(
                    TopicPartition(self._topic, p), timeout=5.0, cached=False
                )
                for p in self._partitions
            }
        except KafkaException as exc:
            log.warning("price book topic watermarks not read: %s", exc)
            return None

    def _run(self) -> None:
        from streams.core.domain.codec import decode
        from streams.core.domain.errors import InvalidEvent
        from streams.core.domain.events import BillableMetricPublished, PlanVersionPublished

        last_error = ""
        while True:
            with self._cond:
                asked = self._asked
            if asked != self._answered:
                ends = self._watermarks()
                with self._cond:
                    self._ends, self._answered = ends, asked
                    self._cond.notify_all()
            msg = self._consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error():
                if str(msg.error()) != last_error:  # e.g. the topic does not exist yet
                    last_error = str(msg.error())
                    log.warning("price book topic: %s", last_error)
                continue
            try:
                envelope = decode(
                    msg.key(),
                    msg.value(),
                    msg.headers(),
                    allowed=(BillableMetricPublished, PlanVersionPublished),
                )
            except InvalidEvent as exc:
                log.error("price book record %d skipped: %s", msg.offset(), exc)
            else:
                data = envelope.data
                if isinstance(data, BillableMetricPublished | PlanVersionPublished):
                    self._book.take(data)
            with self._cond:
                self._next[msg.partition()] = msg.offset() + 1
                self._cond.notify_all()

    def caught_up(self, timeout_s: float) -> bool:
        """Whether every partition was read up to its end as of now, waiting up to
        ``timeout_s`` seconds (False on timeout or when the broker did not answer)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._asked += 1
            mine = self._asked
            while True:
                left = deadline - time.monotonic()
                if self._answered >= mine:
                    ends = self._ends
                    if ends is None:
                        return False
                    if all(self._next.get(p, low) >= high for p, (low, high) in ends.items()):
                        return True
                if left <= 0:
                    return False
                self._cond.wait(left)
