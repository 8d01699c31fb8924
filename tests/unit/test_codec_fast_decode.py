"""decode's fast path (model_validate_json) agrees with the reference path
(json.loads + model_validate): equal data on what both accept, the reference's
verdict and message on everything else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streams.domain.codec import _validate_reference, decode, encode
from streams.domain.errors import InvalidEvent
from streams.domain.events import Envelope, UsageRecorded
from streams.domain.focus import FocusUsage, iter_focus_rows

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"


def sample_envelopes() -> list[Envelope]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        rows = [r for r in iter_focus_rows(handle) if isinstance(r, FocusUsage)]
    out: list[Envelope] = []
    for r in rows:
        out.append(Envelope.wrap(r.usage, id=r.event_id, source="/t", time=r.event_time))
        out.append(Envelope.wrap(r.customer, id=r.customer_event_id, source="/t"))
    return out


def test_sample_events_decode_to_the_reference_data() -> None:
    envelopes = sample_envelopes()
    assert len(envelopes) > 1800
    for envelope in envelopes:
        record = encode(envelope)
        decoded = decode(record.key, record.value, record.headers)
        assert decoded == envelope
        reference = _validate_reference(type(envelope.data), envelope.type, record.value)
        assert decoded.data == reference


def _usage_record(value: bytes) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    envelope = sample_envelopes()[0]
    record = encode(envelope)
    return record.key, value, record.headers


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: b"{not json", "value is not JSON"),
        (lambda d: json.dumps({**d, "amount": 1.5}).encode(), "invalid usage.recorded data"),
        (lambda d: json.dumps({**d, "amount": "NaN"}).encode(), "invalid usage.recorded data"),
        (lambda d: json.dumps({**d, "extra": 1}).encode(), "invalid usage.recorded data"),
        (lambda d: b'{"amount": NaN}', "invalid usage.recorded data"),
    ],
)
def test_refusals_keep_the_reference_messages(mutate: object, message: str) -> None:
    envelope = sample_envelopes()[0]
    data = json.loads(encode(envelope).value)
    value = mutate(data)  # type: ignore[operator]
    key, _, headers = _usage_record(value)
    with pytest.raises(InvalidEvent, match=message):
        decode(key, value, headers)
    with pytest.raises(InvalidEvent, match=message):
        _validate_reference(UsageRecorded, "usage.recorded", value)


def test_what_only_the_reference_accepts_is_still_accepted() -> None:
    envelope = sample_envelopes()[0]
    utf16 = encode(envelope).value.decode().encode("utf-16")  # json.loads detects UTF-16
    key, _, headers = _usage_record(utf16)
    assert decode(key, utf16, headers) == envelope
