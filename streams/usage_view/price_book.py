"""The price book the view rates under: the seam between where books come from and the view.

The view asks a :class:`PriceBookSource` for the book in force on every request
and on every metered event (``current()``). The sources:

* :class:`DatabasePriceBook` — the book published in PostgreSQL (``invoicing plans
  publish``), the one the invoice job rates under: the default when no file is given.

* :class:`FilePriceBook` — a YAML file (``--price-book FILE`` or
  ``INVOICING_VIEW__PRICE_BOOK``), loaded with the rating core's validating
  loader and reloaded when the file changes; a file that stops validating is
  logged and the last good book kept.
* :class:`PublishedPriceBooks` — the published versions (``invoicing plans
  publish`` → the compacted price-book topic). Whoever reads that topic calls
  :meth:`PublishedPriceBooks.publish` with each record's book (its JSON, as
  ``price_book_from_data`` reads it); the newest label wins. The faust app does
  that when a topic is configured (issue 12's wiring); until then the file.

With neither, the view rates under the empty book: pure pass-through customers
(the FOCUS re-billing) need none; metered usage is held as ``unknown_metric``,
exactly as the invoice job would hold it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from streams.domain.rating import PriceBook, PriceBookError, load_price_book, price_book_from_data

log = logging.getLogger(__name__)

EMPTY_LABEL = "empty (pass-through only)"


class PriceBookSource(Protocol):
    """Where the view gets its price book: ``current()`` → (book, label for answers).

    ``refresh=True``: look at the source now rather than trust a recent look (the
    view asks so when a metered event names a metric the book it holds lacks: a book
    published a moment ago must not leave that event aggregated as unknown)."""

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]: ...


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


class PublishedPriceBooks:
    """The published price book versions, as read from the compacted topic; the book
    of the greatest label (``version``, compared as given) is in force."""

    def __init__(self, fallback: PriceBookSource | None = None) -> None:
        self._lock = threading.Lock()
        self._books: dict[str, PriceBook] = {}
        self._fallback = fallback or StaticPriceBook()

    def publish(self, version: str, data: Mapping[str, Any]) -> None:
        """Take one published version (``book.model_dump(mode="json")``).

        Raises:
            PriceBookError: the data is not a valid price book.
        """
        book = price_book_from_data(dict(data), source=f"published version {version}")
        with self._lock:
            self._books[version] = book

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]:
        with self._lock:
            if not self._books:
                return self._fallback.current(refresh=refresh)
            version = max(self._books)
            return self._books[version], f"published {version}"


class DatabasePriceBook:
    """The published price book, read from PostgreSQL as the invoice job reads it
    (``invoicing plans publish`` appends entries; the same ``book_fingerprint`` /
    ``published_book`` reads as :class:`streams.billing.rating.PriceBooks`), so the
    preview rates under the book the invoice will.

    ``read_fingerprint()`` and ``read_book()`` each open their own connection (the
    composition root, :func:`streams.bootstrap.view_price_books`, builds them on the
    view's own login). The book is re-read only when the fingerprint changed, and
    the fingerprint looked at most once per ``check_every_s`` (default 2 s) unless
    ``refresh=True``. A failed read is logged and the last good book kept; before
    the first good read, ``fallback`` (default the empty book) answers.
    """

    def __init__(
        self,
        read_fingerprint: Callable[[], tuple[int, int]],
        read_book: Callable[[], PriceBook],
        *,
        check_every_s: float = 2.0,
        fallback: PriceBookSource | None = None,
    ) -> None:
        self._read_fingerprint = read_fingerprint
        self._read_book = read_book
        self.check_every_s = check_every_s
        self._fallback = fallback or StaticPriceBook()
        self._lock = threading.Lock()
        self._checked = float("-inf")
        self._loaded: tuple[tuple[int, int], PriceBook] | None = None

    def current(self, *, refresh: bool = False) -> tuple[PriceBook, str]:
        with self._lock:
            if refresh or time.monotonic() - self._checked >= self.check_every_s:
                self._checked = time.monotonic()
                try:
                    fingerprint = self._read_fingerprint()
                    if self._loaded is None or self._loaded[0] != fingerprint:
                        self._loaded = (fingerprint, self._read_book())
                        log.info("published price book (re)loaded: %s", fingerprint)
                except Exception as exc:  # a database or book error: keep what we have
                    log.error("published price book not read, keeping the last good one: %s", exc)
            if self._loaded is None:
                return self._fallback.current(refresh=refresh)
            (metrics, versions), book = self._loaded
            return book, f"published ({metrics} metric(s), {versions} plan version(s))"
