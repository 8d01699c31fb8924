"""The FOCUS import's reading side: rows → encoded records, in a second process.

:func:`start_reader` forks a process that reads the file with
:func:`streams.core.domain.focus.iter_focus_rows`, encodes each mapped row's
``usage.recorded`` with :class:`UsageEncoder` and each new account's ``customer.upserted``
with :func:`streams.core.domain.codec.encode`, and sends them, in file order, in
batches of :data:`BATCH_ROWS` rows through a pipe. The importer's process only
produces them (docs/decisions/0101-focus-import-reads-in-a-second-process.md): reading,
mapping and encoding were about two thirds of an import's time on one core, and the
producer's work and librdkafka's threads the rest, so the two halves overlap on two cores.

The pipe bounds what the reader runs ahead (a full pipe blocks its ``send``), and
one reader keeps the file's order, so a customer's ``customer.upserted`` still
precedes its usage. The reader is forked, not spawned (no second start-up of the
interpreter and the models); it touches nothing the parent made but the encoder
and the file, and it ends with ``os._exit`` (multiprocessing's fork start), so the
parent's producer is never finalised in it. It ignores SIGINT: the importer stops
it when the import stops.
"""

from __future__ import annotations

import json
import pickle
import signal
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from multiprocessing import get_context
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from streams.core.domain.codec import EncodedRecord, encode
from streams.core.domain.errors import FocusFormatError
from streams.core.domain.events import CustomerUpserted, Envelope, UsageRecorded, UtcDateTime
from streams.core.domain.focus import FocusRowError, FocusUsage, iter_focus_rows

__all__ = [
    "BATCH_ROWS",
    "CUSTOMER",
    "SKIPPED",
    "USAGE",
    "USAGE_TYPE",
    "ReaderMessage",
    "UsageEncoder",
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
#: ``"not-utf8"`` (the decoding error that stopped it part-way); ``"end"`` (the count of
#: distinct customers); ``"crash"`` (a traceback).
ReaderMessage = tuple[str, Any]


def _read(conn: Connection, path: Path, encoder: UsageEncoder) -> None:
    """The reader process: every message of :data:`ReaderMessage`, then it returns."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def send(kind: str, body: Any) -> None:
        conn.send_bytes(pickle.dumps((kind, body), protocol=pickle.HIGHEST_PROTOCOL))

    try:
        with path.open(newline="", encoding="utf-8") as handle:
            try:
                results = iter_focus_rows(handle)
            except (FocusFormatError, UnicodeDecodeError) as exc:
                send("unreadable", str(exc))
                return
            customers: dict[str, CustomerUpserted] = {}
            batch: list[tuple[Any, ...]] = []
            try:
                for result in results:
                    batch.append(_item(result, encoder, customers, batch))
                    if len(batch) >= BATCH_ROWS:
                        send("rows", batch)
                        batch = []
            except UnicodeDecodeError as exc:
                send("rows", batch)
                send("not-utf8", str(exc))
                return
            send("rows", batch)
            send("end", len(customers))
    except OSError as exc:  # the file cannot be read (e.g. permissions)
        send("unreadable", str(exc))
    except BaseException:  # the parent reports it; the process ends here
        send("crash", traceback.format_exc())
    finally:
        conn.close()


def _item(
    result: FocusUsage | FocusRowError,
    encoder: UsageEncoder,
    customers: dict[str, CustomerUpserted],
    batch: list[tuple[Any, ...]],
) -> tuple[Any, ...]:
    """The row's item; a changed account's ``CUSTOMER`` item goes into ``batch`` first."""
    if isinstance(result, FocusRowError):
        return (SKIPPED, result.line_number, result.reason, result.raw_id)
    customer = result.customer
    customer_id = customer.customer_id
    sent = customers.get(customer_id)
    if sent is not customer and sent != customer:
        envelope = Envelope.wrap(customer, id=result.customer_event_id, source=encoder.source)
        batch.append((CUSTOMER, result.line_number, envelope.id, customer_id, encode(envelope)))
        customers[customer_id] = customer
    try:
        key, value, ce_time = encoder.encode_parts(result)
    except ValidationError as exc:
        return (SKIPPED, result.line_number, _id_problem(exc), None)
    period = result.fields.billing_period
    return (USAGE, result.line_number, result.event_id, customer_id, period, key, value, ce_time)


@dataclass
class Reader:
    """The reader process of one file: :meth:`messages` in order, :meth:`stop` at the end."""

    process: BaseProcess
    conn: Connection

    def messages(self) -> Iterator[ReaderMessage]:
        """Every message until ``"end"``, ``"unreadable"``, ``"not-utf8"`` or ``"crash"``
        (included). A reader that died without one gives ``("crash", <its exit code>)``."""
        while True:
            try:
                message: ReaderMessage = pickle.loads(self.conn.recv_bytes())
            except EOFError:
                self.process.join(5.0)
                yield ("crash", f"the reader process ended (exit code {self.process.exitcode})")
                return
            yield message
            if message[0] != "rows":
                return

    def stop(self) -> None:
        """Close the pipe and end the process (killed if it is still running)."""
        self.conn.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


def start_reader(path: Path, encoder: UsageEncoder) -> Reader:
    """Fork the reader of ``path`` (a FOCUS 1.0 CSV, UTF-8) with ``encoder``.

    Raises:
        OSError: the process or its pipe could not be made.
    """
    context = get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(
        target=_read, args=(send, path, encoder), name="focus-reader", daemon=True
    )
    process.start()
    send.close()  # the parent's copy; the pipe ends (EOFError) when the reader's closes
    return Reader(process, receive)
