"""The dead-letter sink: bad records leave the partition with a reason, never silently.

Used by the invoicing worker (``billing.account-events.dlq.v1``) and the email
sender (``billing.invoices.dlq.v1``). A worker's dead-lettered record also holds
the invoice of every customer it could belong to (:func:`customers_of`,
:func:`period_of`; the hold itself is :func:`streams.billing.store.holds.record_hold`,
written in the transaction that moves past the record).

A dead-lettered record keeps its original key, value and headers, plus headers
that say why and where it came from (DESIGN §3, invariant 5):

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

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from streams.adapters.kafka import Record
from streams.billing.metrics import DEAD_LETTERED, DEAD_LETTERS_TRUNCATED
from streams.billing.ports import KafkaSink
from streams.domain.periods import PERIOD_PATTERN

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


class DeadLetterError(Exception):
    """The dead-letter record could not be delivered (transient: retry the batch)."""


class _TooLarge(Exception):
    """The record is larger than the producer or the topic accepts."""


class DeadLetters:
    """Publishes dead-letter records to one topic and waits for their delivery
    (the :class:`~streams.billing.ports.DeadLetterSink` port, on a
    :class:`~streams.billing.ports.KafkaSink`)."""

    def __init__(
        self, producer: KafkaSink, topic: str, group_id: str, timeout_s: float = 30.0
    ) -> None:
        self._producer = producer
        self.topic = topic
        self._group_id = group_id
        self._timeout_s = timeout_s

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
        where = f"{source_topic}[{source_partition}]@{source_offset}"
        meta = [
            ("dlq.kind", kind.encode()),
            ("dlq.source.topic", source_topic.encode()),
            ("dlq.source.partition", str(source_partition).encode()),
            ("dlq.source.offset", str(source_offset).encode()),
            ("dlq.consumer.group", self._group_id.encode()),
            ("dlq.failed_at", datetime.now(UTC).isoformat().replace("+00:00", "Z").encode()),
        ]
        original = list(headers or [])
        try:
            self._deliver(key, value, [*original, ("dlq.reason", reason.encode()), *meta], where)
        except _TooLarge as exc:
            kept = [
                (name, data)
                for name, data in original
                if len(name.encode()) + len(data or b"") <= _SMALL_HEADER_BYTES
            ][:_MAX_KEPT_HEADERS]
            cut_key = key[:TRUNCATED_KEY_BYTES] if key is not None else None
            cut_value = value[:TRUNCATED_VALUE_BYTES] if value is not None else None
            note = (
                f"original too large for the dead-letter topic ({exc}); "
                f"value {len(value or b'')} -> {len(cut_value or b'')} bytes, "
                f"key {len(key or b'')} -> {len(cut_key or b'')} bytes, "
                f"{len(original) - len(kept)} of {len(original)} headers dropped; "
                f"the original is in {where}"
            )
            try:
                self._deliver(
                    cut_key,
                    cut_value,
                    [
                        *kept,
                        ("dlq.reason", reason[:TRUNCATED_REASON_CHARS].encode()),
                        *meta,
                        ("dlq.truncated", note.encode()),
                    ],
                    where,
                )
            except _TooLarge as again:
                raise DeadLetterError(
                    f"dead-letter record for {where} too large even truncated: {again}"
                ) from again
            DEAD_LETTERS_TRUNCATED.labels(kind).inc()
        DEAD_LETTERED.labels(kind, "customer" if attributed else "unattributed").inc()

    def _deliver(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, bytes]],
        where: str,
    ) -> None:
        """Produce one record and wait for its delivery report.

        Raises:
            _TooLarge: the producer or the broker refused the record for its size.
            DeadLetterError: any other failure, or no report within the timeout.
        """
        errors: list[KafkaError] = []
        delivered: list[bool] = []

        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err)
            else:
                delivered.append(True)

        try:
            self._producer.produce(
                self.topic, key=key, value=value, headers=list(headers), on_delivery=report
            )
        except BufferError as exc:  # the local queue is full: transient
            raise DeadLetterError(
                f"dead-letter record for {where} not queued (local queue full): {exc}"
            ) from exc
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() in _TOO_LARGE:
                raise _TooLarge(str(err)) from exc
            raise DeadLetterError(f"dead-letter record for {where} not produced: {exc}") from exc
        remaining = self._producer.flush(self._timeout_s)
        if errors and errors[0].code() in _TOO_LARGE:
            raise _TooLarge(str(errors[0]))
        if errors or remaining or not delivered:
            raise DeadLetterError(
                f"dead-letter record for {where} not delivered: "
                f"{errors[0] if errors else 'timeout'}"
            )


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


def customer_text(raw: bytes | str | None) -> str | None:
    """``raw`` as a customer id if it is usable: UTF-8 text of 1 to 128 characters."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) and 0 < len(raw) <= 128 else None


def _payload_of(msg: Record) -> dict[str, Any] | None:
    """The record's value if it is a JSON object, else None."""
    try:
        payload = json.loads(msg.value or b"")
    except (ValueError, UnicodeDecodeError):
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
