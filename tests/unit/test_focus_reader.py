"""The FOCUS import's reader process (streams/apps/importers/focus_reader.py): what it
sends for a good file, a file without a FOCUS header and a file that stops being UTF-8.
See docs/decisions/0101-focus-import-reads-in-a-second-process.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.apps.importers import SourceUnreadable
from streams.apps.importers.focus_import import DeliveryTracker, _produce_rows
from streams.apps.importers.focus_reader import (
    CUSTOMER,
    SKIPPED,
    USAGE,
    ReaderMessage,
    UsageEncoder,
    start_reader,
)
from streams.core.domain.focus import FocusUsage, iter_focus_rows

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
SOURCE = "/importers/focus/test.csv"


def messages(path: Path) -> list[ReaderMessage]:
    reader = start_reader(path, UsageEncoder(SOURCE))
    try:
        return list(reader.messages())
    finally:
        reader.stop()
        assert not reader.process.is_alive()


def test_a_good_file_gives_every_row_in_order_each_account_first_then_end() -> None:
    got = messages(SAMPLE)
    assert got[-1][0] == "end"
    items = [item for kind, body in got[:-1] for item in body]
    assert all(kind == "rows" for kind, _ in got[:-1])
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        expected = [r for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]
    usage = [item for item in items if item[0] == USAGE]
    encoder = UsageEncoder(SOURCE)
    assert [u[1:3] for u in usage] == [(r.line_number, r.event_id) for r in expected]
    for item, row in zip(usage, expected, strict=True):
        record = encoder.encode(row)
        assert (item[5], item[6], encoder.headers(item[2], item[5], item[7])) == (
            record.key,
            record.value,
            record.headers,
        )
    seen: set[str] = set()
    for item in items:
        if item[0] == CUSTOMER:
            seen.add(item[3])
        elif item[0] == USAGE:
            assert item[3] in seen, f"usage of {item[3]} before its customer event"
    assert got[-1][1] == len(seen)
    assert not [item for item in items if item[0] == SKIPPED]


def test_a_file_without_a_focus_header_is_unreadable_before_any_row(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("a,b,c\n1,2,3\n", encoding="utf-8")
    got = messages(path)
    assert [kind for kind, _ in got] == ["unreadable"]
    assert "lacks required column" in got[0][1]


def test_a_file_that_stops_being_utf8_sends_the_rows_before_then_says_so(
    tmp_path: Path,
) -> None:
    text = SAMPLE.read_bytes()
    lines = text.splitlines(keepends=True)
    path = tmp_path / "latin.csv"
    # enough good rows to fill the decoder's first reads, then a byte that is not UTF-8
    path.write_bytes(b"".join(lines[:800]) + b"\xff\xfe broken\n" + b"".join(lines[800:]))
    got = messages(path)
    assert got[-1][0] == "not-utf8"
    rows = [item for kind, body in got[:-1] for item in body if item[0] == USAGE]
    assert rows, "the rows before the bad byte were sent"


class _Broken(UsageEncoder):
    def encode_parts(self, result: FocusUsage) -> tuple[bytes, bytes, bytes]:
        raise RuntimeError("encoder bug")


def test_a_reader_that_fails_says_so_with_its_traceback_and_ends() -> None:
    reader = start_reader(SAMPLE, _Broken(SOURCE))
    try:
        got = list(reader.messages())
    finally:
        reader.stop()
    assert [kind for kind, _ in got] == ["crash"]
    assert "RuntimeError: encoder bug" in got[0][1]
    assert reader.process.exitcode is not None


def test_the_importer_turns_a_failed_reader_into_a_source_error_naming_its_cause() -> None:
    reader = start_reader(SAMPLE, _Broken(SOURCE))
    try:
        with pytest.raises(SourceUnreadable, match="RuntimeError: encoder bug"):
            _produce_rows(
                reader,
                UsageEncoder(SOURCE),
                DeliveryTracker(),
                None,  # type: ignore[arg-type]  # nothing reaches the producer
                "topic",
                SAMPLE,
                lambda _rows: None,
            )
    finally:
        reader.stop()
