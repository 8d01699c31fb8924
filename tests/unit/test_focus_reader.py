"""The FOCUS import's reader processes (streams/apps/importers/focus_reader.py): what
they send for a good file, a file without a FOCUS header and a file that stops being
UTF-8, and that several readers give the importer exactly what one reader gives.
See docs/decisions/0101-focus-import-reads-in-a-second-process.md."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.apps.importers import SourceUnreadable, focus_parts
from streams.apps.importers.focus_import import DeliveryTracker, SkippedRow, _produce_rows
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


def messages(path: Path, readers: int = 1) -> list[ReaderMessage]:
    reader = start_reader(path, UsageEncoder(SOURCE), readers)
    try:
        return list(reader.messages())
    finally:
        reader.stop()
        assert not any(one.process.is_alive() for one in reader.readers)


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
    assert got[-1][1] == seen
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
    # the rows before the failure (none: it fails on the first), then the traceback
    assert [kind for kind, _ in got] == ["rows", "crash"] and got[0][1] == []
    assert "RuntimeError: encoder bug" in got[1][1]
    assert reader.readers[0].process.exitcode is not None


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


# ----------------------------------------------------------------- several readers


class _Producer:
    """Records what the importer produces (no broker: every delivery succeeds)."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes, list[tuple[str, bytes]]]] = []
        self._reports: list[Any] = []

    def produce(
        self, topic: str, *, key: bytes, value: bytes, headers: Any, on_delivery: Any
    ) -> None:
        self.records.append((key, value, list(headers)))
        self._reports.append(on_delivery)

    def poll(self, _timeout: float) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report(None, None)
        return len(reports)

    def flush(self, timeout: float) -> int:
        self.poll(timeout)
        return 0


def _import(
    path: Path,
    readers: int,
    producer: _Producer,
    encoder: UsageEncoder | None = None,
    advance: Callable[[int], None] = lambda _n: None,
) -> tuple[list[SkippedRow], int, Any, int]:
    """``_produce_rows`` of ``path`` read by ``readers`` readers (with ``encoder``) into
    ``producer``, ``advance`` its progress callback; its result, or what it raised."""
    reader = start_reader(path, encoder or UsageEncoder(SOURCE), readers)
    try:
        return _produce_rows(
            reader,
            UsageEncoder(SOURCE),
            DeliveryTracker(),
            producer,  # type: ignore[arg-type]
            "t",
            path,
            advance,
        )
    finally:
        reader.stop()


def _produced(path: Path, readers: int) -> tuple[list[Any], tuple[list[SkippedRow], int, Any, int]]:
    """What the importer produces from ``path`` with ``readers`` readers: the records
    (a customer event's ``ce_time``, the time it was encoded, left out) and
    ``_produce_rows``' result."""
    producer = _Producer()
    outcome = _import(path, readers, producer)
    records = []
    for key, value, headers in producer.records:
        kept = [
            (n, v)
            for n, v in headers
            if not (n == "ce_time" and b"customer" in dict(headers)["ce_type"])
        ]
        records.append((key, value, kept))
    return records, outcome


def _awkward_file(tmp_path: Path, *, spanning: bool = False) -> tuple[Path, bytes, dict[str, int]]:
    """The sample rewritten: an account's name changes for a stretch of rows and back
    after, descriptions with line breaks (records over several physical lines), a row
    with a bad amount and a malformed CSV record. ``spanning``: the first 120 rows only,
    row 60's description as long as the rest of the file (under the CSV module's field
    limit of 131,072) with line breaks all along, so every cut falls inside it."""
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    if spanning:
        body = body[:120]
    n = len(body)
    account, name = header.index("SubAccountId"), header.index("SubAccountName")
    description, cost = header.index("ChargeDescription"), header.index("BilledCost")
    renamed = body[n * 2 // 5][account]
    for i, row in enumerate(body):
        if row[account] == renamed and n * 2 // 5 <= i < n * 3 // 5:
            row[name] = "Renamed for a while"
    for i in (33, n // 2 - 20, n // 2 + 10, n - 9):
        body[i][description] = "two\nlines"
    body[70][cost] = "not a number"
    if spanning:
        body[60][description] = "a line\n" * 17_000
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(body[:70])
    lines = {"bad amount": out.getvalue().count("\n") + 1}
    writer.writerows(body[70:100])
    lines["malformed"] = out.getvalue().count("\n") + 1
    out.write('"x"y,1,2\n')  # strict CSV: ',' expected after '"'
    writer.writerows(body[100:])
    path = tmp_path / "awkward.csv"
    path.write_text(out.getvalue(), encoding="utf-8")
    return path, renamed.encode(), lines


@pytest.mark.parametrize(("readers", "spanning"), [(2, False), (3, False), (2, True), (4, True)])
def test_several_readers_give_the_importer_exactly_what_one_reader_gives(
    tmp_path: Path, readers: int, spanning: bool
) -> None:
    path, renamed_account, lines = _awkward_file(tmp_path, spanning=spanning)
    parts = focus_parts.parts_of(path, readers)
    assert parts is not None and len(parts) == readers
    one_records, one = _produced(path, 1)
    many_records, many = _produced(path, readers)
    assert many_records == one_records
    assert many == one
    skipped, _customers, _periods, rows = one
    assert rows == (121 if spanning else 1001)  # the rows and the malformed record
    # the file's physical line numbers, where records span several lines too
    assert [s.line_number for s in skipped if "malformed CSV" in s.reason] == [lines["malformed"]]
    assert [s.line_number for s in skipped if "BilledCost" in s.reason] == [lines["bad amount"]]
    events = [
        value
        for key, value, headers in one_records
        if key == renamed_account and dict(headers)["ce_type"] == b"customer.upserted"
    ]
    renamed = [value for value in events if b"Renamed for a while" in value]
    assert len(renamed) == 1 and len(events) == 3, "old name, new name, the old name again"
    assert events[2] == events[0]


def test_a_cut_inside_a_record_makes_the_reader_before_it_read_on(tmp_path: Path) -> None:
    path, _, _ = _awkward_file(tmp_path, spanning=True)
    reader = start_reader(path, UsageEncoder(SOURCE), 2)
    try:
        got = list(reader.messages())
    finally:
        reader.stop()
    assert got[-1][0] == "end"
    # the first reader read the whole file: the second one was never asked
    assert reader.readers[1].process.exitcode is not None


def test_several_readers_stop_where_the_file_stops_being_utf8_as_one_does(
    tmp_path: Path,
) -> None:
    lines = SAMPLE.read_bytes().splitlines(keepends=True)
    path = tmp_path / "latin.csv"
    path.write_bytes(b"".join(lines[:700]) + b"\xff\xfe broken\n" + b"".join(lines[700:]))
    produced = []
    for readers in (1, 2, 3):
        producer = _Producer()
        with pytest.raises(SourceUnreadable, match="not UTF-8"):
            _import(path, readers, producer)
        produced.append(
            [
                value
                for _key, value, headers in producer.records
                if b"usage" in dict(headers)["ce_type"]
            ]
        )
    assert produced[0] and produced[1] == produced[0] and produced[2] == produced[0]
    assert len(produced[0]) == 699, "every row before the bad line, none after"


def test_a_file_with_a_bare_carriage_return_is_read_whole_by_one_reader(tmp_path: Path) -> None:
    path = tmp_path / "cr.csv"
    path.write_bytes(SAMPLE.read_bytes().replace(b"\n", b"\r", 1))
    assert focus_parts.parts_of(path, 2) is None
    one = focus_parts.parts_of(SAMPLE, 1)
    assert one is not None and len(one) == 1 and one[0].limit is None
    two = focus_parts.parts_of(SAMPLE, 2)
    assert two is not None and [p.start for p in two[1:]] == [p.limit for p in two[:-1]]
    got = messages(path)  # read as text: the same rows as the file with \n
    assert sum(len(body) for kind, body in got if kind == "rows") == sum(
        len(body) for kind, body in messages(SAMPLE) if kind == "rows"
    )
    # and the same summary, the accounts counted (the text reader's "end" carries them)
    assert _import(path, 1, _Producer())[1:] == _import(SAMPLE, 1, _Producer())[1:]


def test_a_text_read_file_whose_rows_all_fail_still_ends(tmp_path: Path) -> None:
    path = tmp_path / "cr-bad.csv"
    header = SAMPLE.read_text(encoding="utf-8").splitlines()[0]
    path.write_bytes(header.encode() + b"\r" + b"1,2\r3,4\r")  # bare \r: the text reader
    assert focus_parts.parts_of(path, 1) is None
    skipped, customers, _periods, rows = _import(path, 1, _Producer())
    assert (len(skipped), customers, rows) == (2, 0, 2)


def test_a_small_file_gets_one_reader_a_large_one_one_per_core(tmp_path: Path) -> None:
    small = tmp_path / "small.csv"
    small.write_bytes(b"x" * 10)
    large = tmp_path / "large.csv"
    large.write_bytes(b"x" * focus_parts.SPLIT_BYTES)
    assert focus_parts.readers_for(small) == 1
    assert 1 <= focus_parts.readers_for(large) <= focus_parts.MAX_READERS
    assert focus_parts.readers_for(tmp_path / "missing.csv") == 1


@pytest.mark.parametrize("block_bytes", [1, 2, 3, 5, 64])
def test_the_scan_counts_lines_before_each_cut_and_finds_a_bare_return_across_blocks(
    block_bytes: int,
) -> None:
    data = b"h\r\na\r\nbb\r\n\r\nccc\n"
    cuts = [3, 6, 10, 12]
    bare, before = focus_parts.scan(io.BytesIO(data), cuts, block_bytes)
    assert not bare
    assert before == [data.count(b"\n", 0, cut) for cut in cuts]
    for broken in (data.replace(b"bb\r\n", b"bb\r"), data + b"\r", b"\r" + data):
        assert focus_parts.scan(io.BytesIO(broken), [], block_bytes)[0]


class _BrokenAt(UsageEncoder):
    """Fails on the row whose ``Id`` is ``at`` (a bug of the reader, not of the file)."""

    def __init__(self, source: str, at: str) -> None:
        super().__init__(source)
        self.at = at

    def encode_parts(self, result: FocusUsage) -> tuple[bytes, bytes, bytes]:
        if result.event_id == self.at:
            raise RuntimeError("encoder bug")
        return super().encode_parts(result)


def test_a_failing_reader_has_every_row_before_the_failure_produced_however_many(
    tmp_path: Path,
) -> None:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        ids = [r.event_id for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]
    at = 812  # in the second half: the second part of two
    produced = []
    for readers in (1, 2, 3):
        producer = _Producer()
        with pytest.raises(SourceUnreadable, match="RuntimeError: encoder bug"):
            _import(SAMPLE, readers, producer, _BrokenAt(SOURCE, ids[at]))
        produced.append(
            [
                headers
                for _key, _value, headers in producer.records
                if (b"usage" in dict(headers)["ce_type"])
            ]
        )
    assert [dict(h)["ce_id"].decode() for h in produced[0]] == ids[:at]
    assert produced[1] == produced[0] and produced[2] == produced[0]


@pytest.mark.parametrize("readers", [1, 2])
def test_progress_counts_the_files_rows_not_the_customer_events(readers: int) -> None:
    steps: list[int] = []
    _skipped, customers, _periods, rows = _import(
        SAMPLE, readers, _Producer(), advance=steps.append
    )
    assert customers > 0 and sum(steps) == rows == 1000
