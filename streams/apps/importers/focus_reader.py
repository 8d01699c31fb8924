"""The FOCUS import's reading side: rows → encoded records, in reader processes.

:func:`start_reader` forks one reader per core (at most :data:`MAX_READERS`; one for a
file under :data:`SPLIT_BYTES`). The file is cut at line breaks into about four parts
per reader, between :data:`PART_BYTES` and ``MAX_PART_BYTES`` (:func:`parts_of`), dealt
to the readers in turn. Each reader reads
its parts with :func:`streams.core.domain.focus.iter_focus_rows`, encodes each mapped
row's ``usage.recorded`` with :class:`UsageEncoder` and each new account's
``customer.upserted`` with :func:`streams.core.domain.codec.encode`, and sends them in
batches of :data:`BATCH_ROWS` rows through its pipe. The importer's process takes the
parts back in file order (:class:`Readers`) and only produces them
(docs/decisions/0101-focus-import-reads-in-a-second-process.md).

- **Order.** The importer produces part ``j`` whole before part ``j + 1``, so the file's
  order holds and a customer's ``customer.upserted`` precedes its usage. A reader
  sends an account's event at the account's first row in each part; the importer
  drops the ones that repeat what it last produced for that account, which gives
  exactly one reader's sequence.
- **A cut inside a record.** A cut may fall inside a quoted field that spans lines:
  the reader of the part before it then reads that record to its end and goes on to
  the end of the file itself, and the later parts' readers are not listened to.
- **Memory.** A thread per reader receives its messages into a queue of
  :data:`AHEAD_MESSAGES`; a full queue fills the pipe, and a full pipe blocks the reader.

The readers are forked, not spawned (no second start-up of the interpreter and the
models); they touch nothing the parent made but the encoder and the file, and end with
``os._exit`` (multiprocessing's fork start), so the parent's producer is never
finalised in them. They ignore SIGINT: the importer stops them when the import stops.
"""

from __future__ import annotations

import json
import pickle
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from streams.apps.importers.focus_parts import (
    MAX_READERS,
    PART_BYTES,
    SPLIT_BYTES,
    Bound,
    Lines,
    Part,
    parts_of,
    readers_for,
)
from streams.core.domain.codec import EncodedRecord, encode
from streams.core.domain.errors import FocusFormatError
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded, UtcDateTime
from streams.core.domain.focus import FocusRowError, FocusUsage, iter_focus_rows

__all__ = [
    "AHEAD_MESSAGES",
    "BATCH_ROWS",
    "CUSTOMER",
    "MAX_READERS",
    "PART_BYTES",
    "SKIPPED",
    "SPLIT_BYTES",
    "USAGE",
    "USAGE_TYPE",
    "Part",
    "Reader",
    "ReaderMessage",
    "Readers",
    "UsageEncoder",
    "parts_of",
    "readers_for",
    "start_reader",
]


def _envelope_rule(name: str) -> TypeAdapter[str]:
    """The validation rule of the envelope's string field ``name`` (its type and
    constraints, e.g. the length of an id), taken from :class:`Envelope` itself."""
    info = Envelope.model_fields[name]
    return TypeAdapter(Annotated.__class_getitem__((info.annotation, *info.metadata)))  # type: ignore[attr-defined]


_EVENT_ID = _envelope_rule("id")
_SOURCE = _envelope_rule("source")
#: The id length bounds of :class:`Envelope` (``Field(min_length=1, max_length=256)``).
_ID_MIN, _ID_MAX = 1, 256
#: JSON of a UTC date-time exactly as the models serialise it (pydantic's own serializer).
_TIME_JSON: TypeAdapter[datetime] = TypeAdapter(UtcDateTime)
#: A JSON string literal, UTF-8 text kept as is (as pydantic writes it; C-accelerated).
_str: Callable[[str], str] = json.encoder.encode_basestring


def _opt(text: str | None) -> str:
    return "null" if text is None else _str(text)


#: The CloudEvents type of a usage record.
USAGE_TYPE = UsageRecorded.event_type
_USAGE_TYPE_BYTES = USAGE_TYPE.encode()
_SPECVERSION = Envelope.model_fields["specversion"].default.encode()
_CONTENT_TYPE = Envelope.model_fields["datacontenttype"].default.encode()
_MEMO_SIZE = 4096


class UsageEncoder:
    """Encodes mapped rows' ``usage.recorded`` records without a pydantic object per row.

    ``encode(result)`` gives the record ``encode(Envelope.wrap(result.usage,
    id=result.event_id, source=source, time=result.event_time))`` gives, byte for byte
    (``tests/unit/test_focus_import_encoding.py``): the data was validated by the mapping
    (:class:`streams.core.domain.focus.UsageFields`), the id is checked against the envelope's
    length bounds (the envelope's own rule raises when they fail), ``source`` once here.
    Date-times are serialised by pydantic once per distinct value (bounded memo).

    Raises:
        ValidationError: (constructor) ``source`` breaks the envelope's rule;
            (``encode``) the row's ``Id`` breaks the envelope's rule for ids.
    """

    def __init__(self, source: str) -> None:
        self.source = _SOURCE.validate_python(source)
        self._source = self.source.encode()
        self._times: dict[datetime, tuple[str, bytes]] = {}

    def _time(self, value: datetime) -> tuple[str, bytes]:
        found = self._times.get(value)
        if found is None:
            text = json.loads(_TIME_JSON.dump_json(value))
            header = value.isoformat().replace("+00:00", "Z").encode()  # as codec.encode
            found = (text, header)
            if len(self._times) >= _MEMO_SIZE:
                self._times.clear()
            self._times[value] = found
        return found

    def encode(self, result: FocusUsage) -> EncodedRecord:
        key, value, ce_time = self.encode_parts(result)
        return EncodedRecord(
            key=key, value=value, headers=self.headers(result.event_id, key, ce_time)
        )

    def encode_parts(self, result: FocusUsage) -> tuple[bytes, bytes, bytes]:
        """``(key, value, ce_time header)`` of :meth:`encode`'s record (what the reader
        process sends; :meth:`headers` rebuilds the rest). Same error as :meth:`encode`."""
        event_id = result.event_id
        if not _ID_MIN <= len(event_id) <= _ID_MAX:
            _EVENT_ID.validate_python(event_id)  # raises the envelope's error
        f = result.fields
        data_time, _ = self._time(f.event_time)
        _, ce_time = self._time(result.event_time)
        q = f.quantity
        c = f.consumed_quantity
        # The fields in the model's order (UsageFields), as model_dump_json writes them.
        value = (
            f'{{"schema_version":1,"customer_id":{_str(f.customer_id)}'
            f',"billing_period":{_str(f.billing_period)}'
            f',"amount":"{format(f.amount, "f")}"'
            f',"currency":{_str(f.currency)}'
            f',"quantity":{"null" if q is None else _str(format(q, "f"))}'
            f',"unit":{_opt(f.unit)}'
            f',"consumed_quantity":{"null" if c is None else _str(format(c, "f"))}'
            f',"consumed_unit":{_opt(f.consumed_unit)}'
            f',"sku_id":{_opt(f.sku_id)}'
            f',"description":{_opt(f.description)}'
            f',"region_id":{_opt(f.region_id)}'
            f',"charge_category":{_opt(f.charge_category)}'
            f',"event_time":{_str(data_time)}'
            f',"provider":{_opt(f.provider)}}}'
        ).encode()
        return f.customer_id.encode(), value, ce_time

    def headers(self, event_id: str, key: bytes, ce_time: bytes) -> list[tuple[str, bytes]]:
        """The CloudEvents headers of a usage record (binary content mode), in
        :func:`streams.core.domain.codec.encode`'s order."""
        return [
            ("ce_specversion", _SPECVERSION),
            ("ce_id", event_id.encode()),
            ("ce_source", self._source),
            ("ce_type", _USAGE_TYPE_BYTES),
            ("ce_time", ce_time),
            ("ce_subject", key),
            ("content-type", _CONTENT_TYPE),
        ]


def _id_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"Id {first.get('input')!r}: {first.get('msg')}"


#: Rows per message from the reader (a pickled list; about 0.5 MB of records).
BATCH_ROWS = 1000

#: Kinds of the items of a ``"rows"`` message.
USAGE, CUSTOMER, SKIPPED = 0, 1, 2

#: A message from the reader: ``(kind, body)``. Kinds: ``"rows"`` (a list of items, in
#: file order: ``(USAGE, line, event_id, customer_id, billing_period, key, value,
#: ce_time)``, ``(CUSTOMER, line, event_id, customer_id, EncodedRecord)``, ``(SKIPPED,
#: line, reason, raw_id)``); ``"unreadable"`` (the header's problem, before any row);
#: ``"not-utf8"`` (the decoding error that stopped it part-way); ``"next"`` (its part
#: ended at its limit: the next reader goes on; the set of its customer ids); ``"end"``
#: (the end of the file: the set of its customer ids); ``"crash"`` (a traceback).
ReaderMessage = tuple[str, Any]


def _read(conn: Connection, path: Path, encoder: UsageEncoder, parts: list[Part] | None) -> None:
    """The reader process: every message of :data:`ReaderMessage`, then it returns.

    ``parts`` None: the whole file, through a text file (``newline=""``). Otherwise, for
    each part in turn, the records that start in it (lines decoded one by one, so a line
    that is not UTF-8 stops the reader after every record before that line), then
    ``"next"`` when the part's last record ends exactly at its ``limit``. A record that
    runs past ``limit`` (the next part's reader started inside it) makes this reader go
    on to the end of the file instead, and end with ``"end"``, as the last part does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def send(kind: str, body: Any) -> None:
        conn.send_bytes(pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL))

    try:
        if parts is None:
            with path.open(newline="", encoding="utf-8") as handle:
                try:
                    results = iter_focus_rows(handle)
                except (FocusFormatError, UnicodeDecodeError) as exc:
                    send("unreadable", str(exc))
                    return
                accounts = _send_results(send, results, encoder, {})
                if accounts is not None:
                    send("end", accounts)
            return
        encoded: _Encoded = {}  # across this reader's parts
        with path.open("rb") as raw:
            for part in parts:
                lines = Lines(raw, part.start)
                bound = Bound(lines, part.limit)
                results = iter_focus_rows(
                    lines, header=part.header, lines_before=part.lines_before, stop=bound
                )
                accounts = _send_results(send, results, encoder, encoded)
                if accounts is None:
                    return
                if not bound.reached:  # the end of the file
                    send("end", accounts)
                    return
                send("next", accounts)
    except FocusFormatError as exc:  # a part's header (the first reader's says it first)
        send("unreadable", str(exc))
    except OSError as exc:  # the file cannot be read (e.g. permissions)
        send("unreadable", str(exc))
    except BaseException:  # the parent reports it; the process ends here
        send("crash", traceback.format_exc())
    finally:
        conn.close()


#: customer id → (the account's details, its event id, its encoded ``customer.upserted``):
#: a reader encodes an account's event once while its details stay, though it sends it
#: again in each of its parts.
_Encoded = dict[str, tuple[CustomerUpserted, str, EncodedRecord]]


def _send_results(
    send: Callable[[str, Any], None],
    results: Iterator[FocusUsage | FocusRowError],
    encoder: UsageEncoder,
    encoded: _Encoded,
) -> set[str] | None:
    """Send ``results`` as ``"rows"`` of :data:`BATCH_ROWS` items; returns the accounts
    seen, or None after ``"not-utf8"`` (a line was not UTF-8: the reader stops). Any
    other failure sends the items made before it, then is raised (the reader reports
    it), so the rows before a failure are produced, however the file is divided."""
    customers: dict[str, CustomerUpserted] = {}
    batch: list[tuple[Any, ...]] = []
    try:
        for result in results:
            batch.append(_item(result, encoder, customers, batch, encoded))
            if len(batch) >= BATCH_ROWS:
                send("rows", batch)
                batch = []
    except UnicodeDecodeError as exc:
        send("rows", batch)
        send("not-utf8", str(exc))
        return None
    except BaseException:
        send("rows", batch)
        raise
    send("rows", batch)
    return set(customers)


def _item(
    result: FocusUsage | FocusRowError,
    encoder: UsageEncoder,
    customers: dict[str, CustomerUpserted],
    batch: list[tuple[Any, ...]],
    encoded: _Encoded,
) -> tuple[Any, ...]:
    """The row's item; a changed account's ``CUSTOMER`` item goes into ``batch`` first
    (once the row is encoded: a row the encoder fails on sends nothing). The account's
    record is taken from ``encoded`` while its details are the same."""
    if isinstance(result, FocusRowError):
        return (SKIPPED, result.line_number, result.reason, result.raw_id)
    item: tuple[Any, ...]
    customer = result.customer
    customer_id = customer.customer_id
    try:
        key, value, ce_time = encoder.encode_parts(result)
    except ValidationError as exc:
        item = (SKIPPED, result.line_number, _id_problem(exc), None)
    else:
        period = result.fields.billing_period
        item = (
            USAGE,
            result.line_number,
            result.event_id,
            customer_id,
            period,
            key,
            value,
            ce_time,
        )
    sent = customers.get(customer_id)
    if sent is not customer and sent != customer:
        known = encoded.get(customer_id)
        if known is None or (known[0] is not customer and known[0] != customer):
            envelope = Envelope.wrap(customer, id=result.customer_event_id, source=encoder.source)
            known = encoded[customer_id] = (customer, envelope.id, encode(envelope))
        batch.append((CUSTOMER, result.line_number, known[1], customer_id, known[2]))
        customers[customer_id] = customer
    return item


#: Messages of a reader the importer holds before it asks for them (each about half a
#: megabyte): how far a reader runs ahead of the part being produced.
AHEAD_MESSAGES = 64


class Reader:
    """One reader process: its messages (:meth:`messages`, received by a thread into a
    bounded queue, so that the reader runs ahead while the importer takes another's
    part), :meth:`stop` at the end."""

    def __init__(self, process: BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self._queue: queue.Queue[bytes | None] = queue.Queue(AHEAD_MESSAGES)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def listen(self) -> None:
        """Start receiving (once every reader is forked: a reader forked while another
        one's thread runs could inherit a lock that thread held)."""
        self._thread = threading.Thread(
            target=self._receive, name=f"{self.process.name}-pipe", daemon=True
        )
        self._thread.start()

    def _receive(self) -> None:
        item: bytes | None
        while True:
            try:
                item = self.conn.recv_bytes()
            except (EOFError, OSError):
                item = None
            while not self._stopped.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item is None or self._stopped.is_set():
                return

    def messages(self) -> Iterator[ReaderMessage]:
        """Every message until ``"end"``, ``"unreadable"``, ``"not-utf8"`` or ``"crash"``
        (included; ``"rows"`` and ``"next"`` before). A reader that died without one
        gives ``("crash", <its exit code>)``."""
        while True:
            data = self._queue.get()
            if data is None:
                self.process.join(5.0)
                yield ("crash", f"the reader process ended (exit code {self.process.exitcode})")
                return
            message: ReaderMessage = pickle.loads(data)
            yield message
            if message[0] not in ("rows", "next"):
                return

    def stop(self) -> None:
        """End the process (killed if it is still running) and close the pipe."""
        self._stopped.set()
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        if self._thread is not None:
            self._thread.join(5.0)
        self.conn.close()


@dataclass
class Readers:
    """The reader processes of one file; part ``j`` of the file is reader ``j % n``'s.
    Their messages in file order (:meth:`messages`), :meth:`stop` at the end."""

    readers: list[Reader]
    parts: int = 1

    def messages(self) -> Iterator[ReaderMessage]:
        """Every message in file order: the ``"rows"`` of each part from its reader
        until its ``"next"``, then one ``"end"`` with the accounts of all parts, or the
        first other message (``"unreadable"``, ``"not-utf8"``, ``"crash"``). A reader that
        ends with ``"end"`` read to the end of the file: no later part is asked for."""
        streams = [reader.messages() for reader in self.readers]
        accounts: set[str] = set()
        for part in range(max(1, self.parts)):
            for kind, body in streams[part % len(streams)]:
                if kind == "rows":
                    yield kind, body
                elif kind == "next":
                    accounts |= body
                    break
                elif kind == "end":
                    yield kind, accounts | body
                    return
                else:
                    yield kind, body
                    return
            else:  # pragma: no cover - a reader's messages end with a terminal one
                break
        yield ("crash", "the readers ended without the end of the file")

    def stop(self) -> None:
        """Stop every reader (:meth:`Reader.stop`)."""
        for reader in self.readers:
            reader.stop()


def start_reader(path: Path, encoder: UsageEncoder, readers: int | None = None) -> Readers:
    """Fork the readers of ``path`` (a FOCUS 1.0 CSV, UTF-8) with ``encoder``: ``readers``
    of them at most (default :func:`readers_for`), part ``j`` of the file
    (:func:`parts_of`) to reader ``j % readers``.

    Raises:
        OSError: a process or its pipe could not be made (the readers made are stopped).
    """
    count = max(1, readers_for(path) if readers is None else readers)
    parts: list[Part] | None = None
    with suppress(OSError):  # else the one reader says why
        parts = parts_of(path, count)
    shares: list[list[Part] | None] = (
        [None] if parts is None else [parts[k::count] for k in range(min(count, len(parts)))]
    )
    context = get_context("fork")
    made = Readers([], 1 if parts is None else len(parts))
    try:
        for k, share in enumerate(shares):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_read,
                args=(send, path, encoder, share),
                name=f"focus-reader-{k}",
                daemon=True,
            )
            process.start()
            send.close()  # the parent's copy; the pipe ends (EOFError) when the reader's closes
            made.readers.append(Reader(process, receive))
        for reader in made.readers:
            reader.listen()
    except BaseException:
        made.stop()
        raise
    return made
