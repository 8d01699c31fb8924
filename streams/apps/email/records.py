"""What the email sender reads off a consumed record before deciding anything: its
coordinates, its headers as bytes, the documents a poll announces, and where to seek
back to."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from confluent_kafka import Message

from streams.core.domain.codec import decode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import CreditNoteIssued, InvoiceIssued

__all__ = ["announced", "coords", "first_of_each_partition", "headers"]


def coords(msg: Message) -> tuple[str, int, int]:
    """``(topic, partition, offset)`` of a consumed record (``-1`` where librdkafka has none)."""
    partition = msg.partition()
    offset = msg.offset()
    return (
        msg.topic() or "",
        -1 if partition is None else partition,
        -1 if offset is None else offset,
    )


def headers(msg: Message) -> list[tuple[str, bytes | None]]:
    """The record's headers as ``(name, bytes or None)`` pairs (text values encoded UTF-8)."""
    raw = msg.headers() or []
    pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
    return [(name, value.encode() if isinstance(value, str) else value) for name, value in pairs]


def announced(records: Iterable[Message]) -> list[InvoiceIssued | CreditNoteIssued]:
    """The issued invoices and credit notes ``records`` carry, in order; records that
    are errors, do not decode or announce something else are left out (the sender meets
    them one by one)."""
    found: list[InvoiceIssued | CreditNoteIssued] = []
    for msg in records:
        if msg.error() is not None:
            continue
        with contextlib.suppress(InvalidEvent):
            data = decode(
                msg.key(), msg.value(), headers(msg), allowed=(InvoiceIssued, CreditNoteIssued)
            ).data
            if isinstance(data, InvoiceIssued | CreditNoteIssued):
                found.append(data)
    return found


def first_of_each_partition(records: Iterable[Message]) -> Iterator[Message]:
    """The first record of each topic partition among ``records`` (errors skipped): where
    each partition's consumption resumes when these records are given back."""
    seen: set[tuple[str | None, int | None]] = set()
    for msg in records:
        if msg.error() is not None:
            continue
        where = (msg.topic(), msg.partition())
        if where not in seen:
            seen.add(where)
            yield msg
