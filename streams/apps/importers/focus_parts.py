"""The parts of a FOCUS file that several readers share (the FOCUS import's readers:
:mod:`streams.apps.importers.focus_reader`, docs/decisions/0101-focus-import-reads-in-a-second-process.md).

:func:`parts_of` cuts a file at line breaks into :class:`Part` s; a reader reads a part's
lines with :class:`Lines` (each decoded as UTF-8, its end offset kept) and stops at the
part's end with :class:`Bound`, or reads on past it when the part's last record runs
past the cut (a quoted field with line breaks).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from streams.core.domain.errors import FocusFormatError
from streams.core.domain.focus import read_focus_header

__all__ = [
    "MAX_PART_BYTES",
    "MAX_READERS",
    "PARTS_PER_READER",
    "PART_BYTES",
    "SPLIT_BYTES",
    "Bound",
    "Lines",
    "Part",
    "parts_of",
    "readers_for",
    "scan",
]


@dataclass(frozen=True)
class Part:
    """One reader's share of a file: the records that start in bytes
    ``[start, limit)``, after the file's ``header`` and ``lines_before`` physical lines.
    ``limit`` None: to the end of the file."""

    start: int
    limit: int | None
    header: list[str]
    lines_before: int


class Lines:
    """The text lines of a binary file from ``start``, each decoded as UTF-8 (a line that
    is not raises ``UnicodeDecodeError``), and ``pos``, the offset after the last line
    given. The CSV reader asks for one line at a time and never reads ahead, so after a
    record ``pos`` is where the next record starts. Lines end at ``\\n`` only: a file
    with a bare ``\\r`` line break is read by one reader through a text file instead
    (:func:`streams.apps.importers.focus_reader.start_reader`)."""

    def __init__(self, handle: BinaryIO, start: int) -> None:
        handle.seek(start)
        self.handle = handle
        self.pos = start

    def __iter__(self) -> Iterator[str]:
        for raw in self.handle:
            self.pos += len(raw)
            yield raw.decode("utf-8")


class Bound:
    """``stop`` of :func:`~streams.core.domain.focus.iter_focus_rows` for a part: True
    when the last record ended exactly at ``limit`` (``reached``); once a record ran past
    it, never (``limit`` becomes None: the reader goes on to the end of the file)."""

    def __init__(self, lines: Lines, limit: int | None) -> None:
        self.lines = lines
        self.limit = limit
        self.reached = False

    def __call__(self) -> bool:
        if self.limit is None or self.lines.pos < self.limit:
            return False
        if self.lines.pos == self.limit:
            self.reached = True
            return True
        self.limit = None  # the next reader started inside this record
        return False


#: Files smaller than this are read by one reader (a fork costs more than it saves on
#: a small file).
SPLIT_BYTES = 4 * 1024 * 1024

#: The most readers of one file.
MAX_READERS = 4


def readers_for(path: Path) -> int:
    """How many readers :func:`streams.apps.importers.focus_reader.start_reader` forks for ``path`` by default: one for a file
    under :data:`SPLIT_BYTES`, else one per core this process may run on, at most
    :data:`MAX_READERS`."""
    try:
        size = path.stat().st_size
    except OSError:
        return 1
    if size < SPLIT_BYTES:
        return 1
    return max(1, min(MAX_READERS, len(os.sched_getaffinity(0))))


#: Bytes per part of a file read by several readers, at least (the parts go to the
#: readers in turn, so each runs ahead on its next part while another's is produced).
PART_BYTES = 2 * 1024 * 1024

#: Bytes per part at most: about what a reader's queue holds
#: (``focus_reader.AHEAD_MESSAGES`` messages of 1,000 rows), so that a reader can read
#: its whole next part while another's is produced.
MAX_PART_BYTES = 32 * 1024 * 1024

#: Parts per reader a file is cut into, between those bounds: fewer parts mean fewer
#: repeated account events (a reader sends each account's event once per part).
PARTS_PER_READER = 4


def parts_of(path: Path, count: int, part_bytes: int | None = None) -> list[Part] | None:
    """``path`` cut at line breaks into parts for ``count`` readers (one part when
    ``count`` is 1): of about ``size / (count * PARTS_PER_READER)`` bytes kept between
    :data:`PART_BYTES` and :data:`MAX_PART_BYTES` (or of ``part_bytes``), and never more
    than ``size / count``. None when it must be read whole as a text file: its header
    cannot be read (that reader reports why) or it has a bare ``\\r`` line break (parts
    are cut, and read, at ``\\n`` only). A cut may fall inside a quoted field: the
    reader before it then reads on past it (``focus_reader._read``), so any cut is safe.

    Raises:
        OSError: the file cannot be read.
    """
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        lines = Lines(handle, 0)
        try:
            header = read_focus_header(csv.reader(lines, strict=True))
        except (FocusFormatError, UnicodeDecodeError):
            return None
        cuts = [lines.pos]
        step = part_bytes or min(
            max(PART_BYTES, size // (max(1, count) * PARTS_PER_READER)), MAX_PART_BYTES
        )
        step = min(step, max(1, size // max(1, count)))
        while count > 1:
            at = cuts[-1] + step
            if at >= size:
                break
            handle.seek(at)
            rest = handle.readline()  # to the next line break
            at += len(rest)
            if not rest.endswith(b"\n") or at >= size:
                break
            cuts.append(at)
        bare_cr, before = scan(handle, cuts)
    if bare_cr:
        return None
    limits: list[int | None] = [*cuts[1:], None]
    return [
        Part(start, limit, header, lines_before)
        for start, limit, lines_before in zip(cuts, limits, before, strict=True)
    ]


def scan(handle: BinaryIO, cuts: list[int], block_bytes: int = 1 << 23) -> tuple[bool, list[int]]:
    """One pass over the file: whether it has a ``\\r`` that is not part of ``\\r\\n``,
    and the ``\\n`` before each of ``cuts`` (ascending offsets)."""
    handle.seek(0)
    pos = newlines = returns = pairs = 0
    before: list[int] = []
    last_was_return = False
    while block := handle.read(block_bytes):
        found = block.count(b"\r")
        if found or last_was_return:
            returns += found
            pairs += block.count(b"\r\n") + (1 if last_was_return and block[:1] == b"\n" else 0)
        counted = 0  # the newlines of ``block`` before ``at`` (counted once, cut by cut)
        at = 0
        while len(before) < len(cuts) and cuts[len(before)] <= pos + len(block):
            cut = cuts[len(before)] - pos
            counted += block.count(b"\n", at, cut)
            at = cut
            before.append(newlines + counted)
        newlines += counted + block.count(b"\n", at)
        last_was_return = block[-1:] == b"\r"
        pos += len(block)
    while len(before) < len(cuts):  # pragma: no cover - cuts lie inside the file
        before.append(newlines)
    return returns != pairs, before
