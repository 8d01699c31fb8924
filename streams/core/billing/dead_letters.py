"""The dead-letter sink: bad records leave the partition with a reason, never silently.

Used by the invoicing worker (``billing.account-events.dlq.v1``) and the email
sender (``billing.invoices.dlq.v1``). A worker's dead-lettered record also holds
the invoice of every customer it could belong to (:func:`customers_of`,
:func:`period_of`; the hold itself is :func:`streams.core.billing.store.holds.record_hold`,
written in the transaction that moves past the record).

A dead-lettered record keeps its original key, value and headers, plus headers
that say why and where it came from (docs/design.md, invariant 5):

=========================  =====================================================
``dlq.reason``              human-readable reason (what was wrong, which field)
``dlq.kind``                ``invalid`` (undecodable/invalid), ``conflict`` (same
                            event id, different payload), ``rejected`` (a close
                            marker whose invoice was refused by a permanent rule)
``dlq.source.topic``        topic the record was read from
``dlq.source.partition``    its partition
``dlq.source.offset``       its offset
``dlq.consumer.group``      the group that dead-lettered it
``dlq.failed_at``           UTC time, ISO 8601
``dlq.truncated``           only on a truncated record (below): what was cut
=========================  =====================================================

:meth:`DeadLetters.publish` returns only once the broker acknowledged the
record, so the caller may then commit the source offset.

**Records too large for the dead-letter topic.** The original plus the ``dlq.*``
headers can exceed the producer's ``message.max.bytes`` (refused by ``produce``)
or the topic's ``max.message.bytes`` (refused by the broker). Such a record is
still dead-lettered, never skipped and never retried for ever: the record is
sent again with the reason and the source coordinates, its value cut to the
first :data:`TRUNCATED_VALUE_BYTES` bytes, its key to :data:`TRUNCATED_KEY_BYTES`,
only its small headers kept, and a ``dlq.truncated`` header saying so (counted
in ``invoicing_dead_letters_truncated_total``). Nothing is lost: the whole
original stays in the source topic at the coordinates the headers give.

Every other failure to produce (local queue full, an unknown topic, no
authorisation, a timeout) raises :class:`DeadLetterError`; the worker then
retries the record after a backoff without committing its offset.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from streams.core.billing.metrics import DEAD_LETTERED, DEAD_LETTERS_TRUNCATED
from streams.core.billing.ports import KafkaSink
from streams.core.billing.rows import Record
from streams.core.domain.codec import read_json
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.periods import PERIOD_PATTERN
from streams.errors import InvoicingError

_PERIOD_RE = re.compile(PERIOD_PATTERN)

#: Bytes of the original value kept in a truncated dead-letter record.
TRUNCATED_VALUE_BYTES = 4096
#: Bytes of the original key kept in a truncated dead-letter record.
TRUNCATED_KEY_BYTES = 1024
#: Characters of the reason kept in a truncated dead-letter record.
TRUNCATED_REASON_CHARS = 2000
#: An original header is kept in a truncated record when name + value fit in this...
_SMALL_HEADER_BYTES = 256
#: ...and at most this many of them.
_MAX_KEPT_HEADERS = 32

#: Kafka error codes meaning "this record is too large" (client-side ``produce`` and
#: broker-side delivery errors use the same codes).
_TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


class DeadLetterError(InvoicingError):
    """The dead-letter record could not be delivered (transient: retry the batch)."""


class _TooLarge(Exception):
    """The record is larger than the producer or the topic accepts."""


@dataclass(frozen=True)
class Letter:
    """One dead letter to publish: the original record, where it came from, why."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    source_topic: str
    source_partition: int
    source_offset: int
    kind: str
    reason: str
    attributed: bool = True

    @property
    def where(self) -> str:
        return f"{self.source_topic}[{self.source_partition}]@{self.source_offset}"


@dataclass
class Delivery:
    """A dead letter handed to the producer: ``state`` is ``pending`` until the broker
    answers, then ``delivered``, ``too_large`` (sent again truncated) or ``failed``."""

    letter: Letter
    state: str = "pending"
    error: KafkaError | None = None
    truncated: bool = False


class DeadLetters:
    """Publishes dead-letter records to one topic and waits for their delivery
    (the :class:`~streams.core.billing.ports.DeadLetterSink` port, on a
    :class:`~streams.core.billing.ports.KafkaSink`).

    Two steps, so that a consumer sends all the dead letters of a batch and waits
    once (:meth:`submit` each, then :meth:`wait`); :meth:`publish` is both for one
    record. A letter whose delivery is still pending when a wait gives up stays
    tracked by its source coordinates: submitting it again (the batch retried after a
    backoff) waits for that delivery instead of producing a second copy.
    """

    def __init__(
        self, producer: KafkaSink, topic: str, group_id: str, timeout_s: float = 30.0
    ) -> None:
        self._producer = producer
        self.topic = topic
        self._group_id = group_id
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int, int], Delivery] = {}

    def publish(
        self,
        *,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None,
        source_topic: str,
        source_partition: int,
        source_offset: int,
        kind: str,
        reason: str,
        attributed: bool = True,
    ) -> None:
        """Dead-letter one record and wait for the broker's acknowledgement.

        ``attributed`` says whether the caller could attribute the record to a
        customer (it is a label of ``invoicing_dead_lettered_total``). A record too
        large for the dead-letter topic is sent truncated (module docstring).

        Raises:
            DeadLetterError: not delivered: any error of ``produce`` or of the
                delivery (the local queue full, the broker refusing it, a timeout),
                or the truncated form was refused too.
        """
        letter = Letter(
            key,
            value,
            list(headers or []),
            source_topic,
            source_partition,
            source_offset,
            kind,
            reason,
            attributed,
        )
        self.wait([self.submit(letter)])

    def submit(self, letter: Letter) -> Delivery:
        """Hand ``letter`` to the producer (no wait). A letter of the same source
        coordinates still in flight is not produced again: its delivery is returned.

        Raises:
            DeadLetterError: the producer refused it (local queue full, unknown topic,
                no authorisation), or it is too large even truncated.
        """
        coords = (letter.source_topic, letter.source_partition, letter.source_offset)
        with self._lock:
            known = self._inflight.get(coords)
            if known is not None and known.state in ("pending", "delivered"):
                return known
            delivery = Delivery(letter)
            self._inflight[coords] = delivery
        try:
            self._produce(delivery, truncated=False)
        except _TooLarge as exc:
            self._produce_truncated(delivery, exc)
        except DeadLetterError:
            with self._lock:
                self._inflight.pop(coords, None)
            raise
        DEAD_LETTERED.labels(letter.kind, "customer" if letter.attributed else "unattributed").inc()
        return delivery

    def wait(self, deliveries: Sequence[Delivery], timeout_s: float | None = None) -> None:
        """Wait (one flush, at most ``timeout_s``, default the constructor's) until every
        one of ``deliveries`` is acknowledged; a letter the broker refused as too large
        is sent again truncated and waited for within the same budget.

        Raises:
            DeadLetterError: a delivery failed (it will be produced again when
                submitted again) or is still pending (it will not: it stays tracked).
        """
        deadline = time.monotonic() + (self._timeout_s if timeout_s is None else timeout_s)
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            if any(d.state == "pending" for d in deliveries):
                self._producer.flush(remaining)
            again = [d for d in deliveries if d.state == "too_large" and not d.truncated]
            if not again or time.monotonic() >= deadline:
                break
            for delivery in again:
                self._produce_truncated(delivery, _TooLarge(str(delivery.error)))
        failed = [d for d in deliveries if d.state != "delivered"]
        with self._lock:
            for delivery in deliveries:
                if delivery.state != "pending":
                    letter = delivery.letter
                    coords = (letter.source_topic, letter.source_partition, letter.source_offset)
                    if self._inflight.get(coords) is delivery:
                        del self._inflight[coords]
        if failed:
            first = failed[0]
            what = "timeout" if first.state == "pending" else str(first.error)
            raise DeadLetterError(
                f"dead-letter record for {first.letter.where} not delivered: {what}"
                + (f" (and {len(failed) - 1} more)" if len(failed) > 1 else "")
            )

    # ------------------------------------------------------------------ producing

    def _meta(self, letter: Letter) -> list[tuple[str, bytes]]:
        return [
            ("dlq.kind", letter.kind.encode()),
            ("dlq.source.topic", letter.source_topic.encode()),
            ("dlq.source.partition", str(letter.source_partition).encode()),
            ("dlq.source.offset", str(letter.source_offset).encode()),
            ("dlq.consumer.group", self._group_id.encode()),
            ("dlq.failed_at", datetime.now(UTC).isoformat().replace("+00:00", "Z").encode()),
        ]

    def _produce(self, delivery: Delivery, *, truncated: bool, note: str = "") -> None:
        letter = delivery.letter
        if truncated:
            kept = [
                (name, data)
                for name, data in letter.headers
                if len(name.encode()) + len(data or b"") <= _SMALL_HEADER_BYTES
            ][:_MAX_KEPT_HEADERS]
            key = letter.key[:TRUNCATED_KEY_BYTES] if letter.key is not None else None
            value = letter.value[:TRUNCATED_VALUE_BYTES] if letter.value is not None else None
            headers = [
                *kept,
                ("dlq.reason", letter.reason[:TRUNCATED_REASON_CHARS].encode()),
                *self._meta(letter),
                ("dlq.truncated", note.encode()),
            ]
        else:
            key, value = letter.key, letter.value
            headers = [
                *letter.headers,
                ("dlq.reason", letter.reason.encode()),
                *self._meta(letter),
            ]

        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                delivery.state = "delivered"
            elif err.code() in _TOO_LARGE:
                delivery.state, delivery.error = "too_large", err
            else:
                delivery.state, delivery.error = "failed", err

        delivery.state, delivery.error, delivery.truncated = "pending", None, truncated
        try:
            self._producer.produce(
                self.topic, key=key, value=value, headers=list(headers), on_delivery=report
            )
        except BufferError as exc:  # the local queue is full: transient
            raise DeadLetterError(
                f"dead-letter record for {letter.where} not queued (local queue full): {exc}"
            ) from exc
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in _TOO_LARGE:
                raise _TooLarge(str(err)) from exc
            raise DeadLetterError(
                f"dead-letter record for {letter.where} not produced: {exc}"
            ) from exc

    def _produce_truncated(self, delivery: Delivery, cause: Exception) -> None:
        letter = delivery.letter
        value, key = letter.value or b"", letter.key or b""
        kept = [
            (name, data)
            for name, data in letter.headers
            if len(name.encode()) + len(data or b"") <= _SMALL_HEADER_BYTES
        ][:_MAX_KEPT_HEADERS]
        note = (
            f"original too large for the dead-letter topic ({cause}); "
            f"value {len(value)} -> {min(len(value), TRUNCATED_VALUE_BYTES)} bytes, "
            f"key {len(key)} -> {min(len(key), TRUNCATED_KEY_BYTES)} bytes, "
            f"{len(letter.headers) - len(kept)} of {len(letter.headers)} headers dropped; "
            f"the original is in {letter.where}"
        )
        try:
            self._produce(delivery, truncated=True, note=note)
            DEAD_LETTERS_TRUNCATED.labels(letter.kind).inc()
        except _TooLarge as again:
            with self._lock:
                coords = (letter.source_topic, letter.source_partition, letter.source_offset)
                self._inflight.pop(coords, None)
            raise DeadLetterError(
                f"dead-letter record for {letter.where} too large even truncated: {again}"
            ) from again


# --------------------------------------------------------------------------- attribution


def header_text(msg: Record, name: str) -> str | None:
    """The first header ``name`` of ``msg`` as UTF-8 text; None if absent or not UTF-8."""
    for key, value in msg.headers:
        if key == name:
            try:
                return value.decode()
            except UnicodeDecodeError:
                return None
    return None


#: A usable customer id: what the contract accepts (``CustomerId`` of streams.core.domain.events).
_CUSTOMER_ID = re.compile(r"[A-Za-z0-9._:/-]{1,128}")


def customer_text(raw: bytes | str | None) -> str | None:
    """``raw`` as a customer id if it is usable: UTF-8 text that is a valid customer id
    (1 to 128 of ``A-Za-z0-9._:/-``, the contract's ``CustomerId``). No valid event can
    name another id, so no real customer hides behind one; and such text (a NUL, a
    lone surrogate, found by fuzzing) could not even be written to ``invoice_holds``."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) and _CUSTOMER_ID.fullmatch(raw) else None


def _payload_of(msg: Record) -> dict[str, Any] | None:
    """The record's value if it is a JSON object, else None (parsed as the codec does:
    a value nested too deeply or with a huge integer is no object we read)."""
    try:
        payload = read_json(msg.value or b"")
    except InvalidEvent:
        return None
    return payload if isinstance(payload, dict) else None


def customers_of(msg: Record) -> list[str]:
    """Every customer a bad record could belong to, without repeats: its key, its
    ``ce_subject`` header and its value's ``customer_id``, each when it is usable
    (:func:`customer_text`). Empty when none is: the record cannot be attributed."""
    subject = next((value for name, value in msg.headers if name == "ce_subject"), None)
    payload = _payload_of(msg)
    candidates = [
        customer_text(msg.key),
        customer_text(subject),
        customer_text(payload.get("customer_id") if payload else None),
    ]
    return list(dict.fromkeys(c for c in candidates if c is not None))


def period_of(msg: Record) -> str | None:
    """The billing period a bad record names, if its value is JSON with a valid one
    (then only that period is held; otherwise every period of the customer)."""
    payload = _payload_of(msg)
    period = payload.get("billing_period") if payload else None
    return period if isinstance(period, str) and _PERIOD_RE.match(period) else None
