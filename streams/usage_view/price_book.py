"""The price book the view rates under: the seam between where books come from and the view.

The view asks a :class:`PriceBookSource` for the book in force on every request
and on every metered event (``current()``). Two sources feed one holder:

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from streams.domain.rating import PriceBook, PriceBookError, load_price_book, price_book_from_data

log = logging.getLogger(__name__)

EMPTY_LABEL = "empty (pass-through only)"


class PriceBookSource(Protocol):
    """Where the view gets its price book: ``current()`` → (book, label for answers)."""

    def current(self) -> tuple[PriceBook, str]: ...


class StaticPriceBook:
    """One fixed book (tests, and the empty default)."""

    def __init__(self, book: PriceBook | None = None, label: str = EMPTY_LABEL) -> None:
        self._book = book or PriceBook()
        self._label = label

    def current(self) -> tuple[PriceBook, str]:
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

    def current(self) -> tuple[PriceBook, str]:
        with self._lock:
            if time.monotonic() - self._checked < self.check_every_s:
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

    def current(self) -> tuple[PriceBook, str]:
        with self._lock:
            if not self._books:
                return self._fallback.current()
            version = max(self._books)
            return self._books[version], f"published {version}"
