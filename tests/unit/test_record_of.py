"""``streams.adapters.kafka.record_of``: a consumed librdkafka ``Message`` as a ``Record``."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from streams.adapters.kafka import KafkaAdapterError, record_of


def message(headers: Any, key: Any = b"cust-1", value: Any = b"{}") -> Message:
    return Message(
        topic="t", partition=3, offset=41, key=key, value=value, headers=headers,
        timestamp=(1, 1_700_000_000_000),
    )  # fmt: skip


def test_coordinates_key_value_and_time_are_kept() -> None:
    record = record_of(message([("ce_id", b"e-1")]))
    assert (record.topic, record.partition, record.offset) == ("t", 3, 41)
    assert (record.key, record.value, record.timestamp_ms) == (b"cust-1", b"{}", 1_700_000_000_000)


def test_bytes_headers_are_kept_in_order_with_repeats() -> None:
    headers = [("ce_id", b"e-1"), ("ce_type", b"usage.recorded"), ("ce_id", b"e-2")]
    assert record_of(message(headers)).headers == headers


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([("a", None), ("b", b"x")], [("a", b""), ("b", b"x")]),
        ([("a", b"x"), ("b", "text é")], [("a", b"x"), ("b", "text é".encode())]),
        ({"a": b"x", "b": None}, [("a", b"x"), ("b", b"")]),
        (None, []),
        ([], []),
    ],
)
def test_none_text_and_dict_headers_become_bytes_pairs(headers: object, expected: object) -> None:
    record = record_of(message(headers))
    assert record.headers == expected
    assert all(type(value) is bytes for _name, value in record.headers)


def test_text_key_and_value_are_encoded() -> None:
    record = record_of(message([], key="cust-é", value='{"a": "é"}'))
    assert (record.key, record.value) == ("cust-é".encode(), '{"a": "é"}'.encode())


def test_an_error_message_is_refused() -> None:
    with pytest.raises(KafkaAdapterError):
        record_of(
            Message(topic="t", partition=0, offset=1, error=KafkaError(KafkaError._PARTITION_EOF))
        )
