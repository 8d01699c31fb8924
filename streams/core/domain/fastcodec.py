"""The hot path's decoder: ``usage.recorded`` records without a pydantic object per record.

The contract stays :class:`~streams.core.domain.events.UsageRecorded` with the
envelope rules of :func:`streams.core.domain.codec.decode` (the reference decoder).
:func:`decode_usage` **vouches** for a record or declines it:

* it returns a :class:`FastUsage` only for a record the reference accepts, with
  the same values (event id, every data field; a decimal as the text it was
  written in, which ``Decimal(text)`` turns into the reference's value);
* it returns ``None`` for everything else: another event type, any refusal, and
  the forms it does not read itself (an amount written as a JSON number, a time
  in another ISO 8601 form than ``YYYY-MM-DDTHH:MM:SS[.ffffff](Z|±HH:MM)``, an
  escape ``\\u``, ``\\b`` or ``\\f`` or a raw control character anywhere in the
  value, white space before a ``:``, a field name written twice, or a text that
  starts with ``:`` or holds ``\\":``, which look like a name to the count of
  names). The caller then decodes the record with the reference, whose verdict
  and reason are final.

So both decoders accept exactly the same records with equal values by
construction of the caller (fast path, else the reference), and
``tests/unit/test_fastcodec.py`` shows with Hypothesis — generated and mutated
records: repeated names, bounds, control characters, huge numbers, bad headers —
that the fast path never accepts a record the reference refuses and never gives
another value.

Why msgspec (pinned in ``pyproject.toml``): it decodes JSON straight into a typed
``Struct`` and checks string lengths and regular expressions in C, refuses
unknown fields, raw control characters in strings and invalid UTF-8 (lone
surrogates included). Two differences from the reference are handled here: msgspec
keeps the last of a repeated name (the reference refuses the record), hence the
name count; and it matches patterns with ``re.search``, where ``$`` also matches
before a final newline, hence the patterns end in ``\\Z``. The text fields'
character rule is checked once on the raw bytes instead of a pattern per field
(a pattern per field tripled the decode time)
(docs/decisions/0010-batch-first-ingest.md).

Pure: the standard library and msgspec; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Annotated, Any, Literal, NamedTuple

import msgspec

from streams.core.domain.codec import KEY_ID_HEADER
from streams.core.domain.events import (
    CURRENCY_PATTERN,
    CUSTOMER_ID_PATTERN,
    TEXT_PATTERN,
    UsageRecorded,
)
from streams.core.domain.events.fields import EARLIEST_INSTANT, _utc
from streams.core.domain.money import DECIMAL_PATTERN
from streams.core.domain.periods import PERIOD_PATTERN

__all__ = [
    "KEY_ID_HEADER",
    "USAGE_VALUES",
    "FastUsage",
    "UsageFields",
    "decode_usage",
    "key_id",
    "usage_data",
    "usage_numbers_ok",
    "usage_texts_ok",
    "usage_values_ok",
]


def _strict(pattern: str) -> str:
    """``pattern`` anchored at the very end (msgspec's ``re.search`` reads ``$`` as "end
    or before a final newline"; pydantic's regex engine reads it as "end")."""
    return pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern


_TEXT = _strict(TEXT_PATTERN)
_DECIMAL = Annotated[str, msgspec.Meta(pattern=_strict(DECIMAL_PATTERN))]
#: The one ISO 8601 form the fast path reads; any other form is the reference's.
_TIME_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
    r"(Z|[+-][0-9]{2}:[0-9]{2})\Z"
)
_Text64 = Annotated[str, msgspec.Meta(max_length=64)]
_Text128 = Annotated[str, msgspec.Meta(max_length=128)]
_Text256 = Annotated[str, msgspec.Meta(max_length=256)]
_Text1024 = Annotated[str, msgspec.Meta(max_length=1024)]
_UNSET = msgspec.UNSET
_Unset = msgspec.UnsetType


class UsageFields(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The data of a ``usage.recorded`` as the fast path reads it: the model's fields and
    bounds (:class:`~streams.core.domain.events.UsageRecorded`), decimals as their
    decimal text, ``event_time`` as its ISO 8601 text. An optional field absent from the
    JSON is ``UNSET`` (so that the names present can be counted). The text fields'
    character rule (:data:`~streams.core.domain.events.TEXT_PATTERN`) is checked on the
    raw value by :func:`decode_usage`, once for every field."""

    customer_id: Annotated[
        str, msgspec.Meta(min_length=1, max_length=128, pattern=_strict(CUSTOMER_ID_PATTERN))
    ]
    billing_period: Annotated[str, msgspec.Meta(pattern=_strict(PERIOD_PATTERN))]
    amount: _DECIMAL
    currency: Annotated[str, msgspec.Meta(pattern=_strict(CURRENCY_PATTERN))]
    event_time: Annotated[str, msgspec.Meta(pattern=_TIME_PATTERN)]
    schema_version: Literal[1] | _Unset = _UNSET
    quantity: _DECIMAL | _Unset | None = _UNSET
    unit: _Text64 | _Unset | None = _UNSET
    consumed_quantity: _DECIMAL | _Unset | None = _UNSET
    consumed_unit: _Text64 | _Unset | None = _UNSET
    sku_id: _Text256 | _Unset | None = _UNSET
    description: _Text1024 | _Unset | None = _UNSET
    region_id: _Text64 | _Unset | None = _UNSET
    charge_category: _Text64 | _Unset | None = _UNSET
    provider: _Text128 | _Unset | None = _UNSET


#: The data's values in :attr:`FastUsage.values`, in this order.
USAGE_VALUES = (
    "customer_id",
    "billing_period",
    "amount",
    "currency",
    "quantity",
    "unit",
    "consumed_quantity",
    "consumed_unit",
    "sku_id",
    "description",
    "region_id",
    "charge_category",
    "provider",
    "event_time",
)


class FastUsage(NamedTuple):
    """A ``usage.recorded`` record the fast path vouches for: its CloudEvents id, its
    data's values in :data:`USAGE_VALUES` order (text; None where absent or null;
    decimals and ``event_time`` as written), ``event_time`` parsed (UTC-aware, as
    the model holds it), and the key id of its lineage (:func:`key_id`)."""

    event_id: str
    values: tuple[str | None, ...]
    event_time: datetime
    key_id: str | None = None


_DECODER = msgspec.json.Decoder(UsageFields)
#: Each field name in quotes, as it must appear once at most in a value the fast path reads.
#: Bytes that no text field may hold raw (TEXT_PATTERN: C0 controls other than TAB, LF
#: and CR are refused, and raw ones are no JSON anyway; DEL), the escapes that would
#: make a refused character (``\u``, ``\b``, ``\f``), the UTF-8 of the C1 controls
#: (C2 80-9F) and of the bidirectional controls (E2 80 AA-AE, E2 81 A6-A9).
_RAW_CONTROL = bytes([*range(0x20), 0x7F])
_ESCAPE = re.compile(rb"\\[ubf]")
_C1 = re.compile(rb"\xc2[\x80-\x9f]")
_BIDI = re.compile(rb"\xe2(\x80[\xaa-\xae]|\x81[\xa6-\xa9])")
_REQUIRED_SET = frozenset(
    ("ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject")
)
_TEXT_RE = re.compile(_TEXT)
_CUSTOMER_RE = re.compile(_strict(CUSTOMER_ID_PATTERN))

#: time text → its UTC datetime, or None when refused (bounded memo: times repeat).
_EVENT_TIMES: dict[str, datetime | None] = {}
_ENVELOPE_TIMES: dict[str, datetime | None] = {}
_MEMO_SIZE = 8192
_ZERO = timedelta(0)


def _event_time(text: str) -> datetime | None:
    """The data's ``event_time`` as the model holds it (``UtcDateTime``), or None."""
    found = _EVENT_TIMES.get(text, _EVENT_TIMES)
    if found is not _EVENT_TIMES:
        return found  # type: ignore[return-value]
    try:
        value: datetime | None = _utc(datetime.fromisoformat(text))
    except (ValueError, OverflowError):
        value = None
    if len(_EVENT_TIMES) >= _MEMO_SIZE:
        _EVENT_TIMES.clear()
    _EVENT_TIMES[text] = value
    return value


def _envelope_time(text: str) -> datetime | None:
    """``ce_time`` read exactly as the reference reads it (``fromisoformat`` with ``Z``
    replaced, then the ``UtcDateTime`` rule), or None."""
    found = _ENVELOPE_TIMES.get(text, _ENVELOPE_TIMES)
    if found is not _ENVELOPE_TIMES:
        return found  # type: ignore[return-value]
    try:
        value: datetime | None = _utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
    except (ValueError, OverflowError, TypeError):
        value = None
    if len(_ENVELOPE_TIMES) >= _MEMO_SIZE:
        _ENVELOPE_TIMES.clear()
    _ENVELOPE_TIMES[text] = value
    return value


def key_id(text: str | None) -> str | None:
    """The key id a :data:`~streams.core.domain.codec.KEY_ID_HEADER` value of ``text``
    (already UTF-8-decoded) stands for: None when absent, empty or longer than 64
    bytes (lineage, never a reason to refuse the record). The one rule, for the fast
    path and for :func:`streams.apps.invoicing.decoding.key_id_of`."""
    if not text or len(text) > 64:
        return None
    if text.isascii() or len(text.encode()) <= 64:
        return text
    return None


def decode_usage(
    key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> FastUsage | None:
    """The ``usage.recorded`` carried by a binary-mode record, if the fast path can vouch
    for it (module docstring); None means "decode it with :func:`streams.core.domain.codec.decode`".

    Args:
        key / value: the record's key (the customer id) and value (the data's JSON).
        headers: the record's headers in order (the last of a repeated name wins,
            ``None`` values are ignored, as in the reference).

    Never raises.
    """
    try:
        attrs = {name: raw.decode("utf-8") for name, raw in headers if raw is not None}
    except (UnicodeDecodeError, ValueError, TypeError, AttributeError):
        return None
    if (
        attrs.get("ce_type") != "usage.recorded"
        or key is None
        or value is None
        or not attrs.keys() >= _REQUIRED_SET
        or attrs["ce_specversion"] != "1.0"
    ):
        return None
    content_type = attrs.get("content-type")
    if (
        content_type is not None
        and content_type != "application/json"
        and content_type.split(";")[0].strip() != "application/json"
    ):
        return None
    try:
        key_text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    subject, event_id, source = attrs["ce_subject"], attrs["ce_id"], attrs["ce_source"]
    if (
        key_text != subject
        or not (0 < len(subject) <= 128 and _CUSTOMER_RE.match(subject))
        or not (0 < len(event_id) <= 256 and _TEXT_RE.match(event_id))
        or not (0 < len(source) <= 512 and _TEXT_RE.match(source))
        or _envelope_time(attrs["ce_time"]) is None
    ):
        return None
    if (
        len(value.translate(None, _RAW_CONTROL)) != len(value)
        or (b"\\" in value and _ESCAPE.search(value))
        or (b"\xc2" in value and _C1.search(value))
        or (b"\xe2" in value and _BIDI.search(value))
        or b'" :' in value
    ):
        return None
    try:
        data = _DECODER.decode(value)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if data.customer_id != key_text:
        return None
    # Repeated names: every name in a value read here is followed by '":' (no white
    # space or escapes, checked above), and a text holds '":' only escaped, so the
    # count is at least the names written; it equals the fields present only when no
    # name was written twice (msgspec keeps the last of a repeated name).
    fields = msgspec.structs.astuple(data)
    unset = fields.count(_UNSET)  # the optional fields absent from the JSON
    if value.count(b'":') != len(fields) - unset:
        return None
    event_time = _event_time(data.event_time)
    if event_time is None:
        return None
    # fields: the 5 required, schema_version, then the optional values in USAGE_VALUES order
    optional = fields[6:]
    if unset:
        optional = tuple(None if item is _UNSET else item for item in optional)
    return FastUsage(
        event_id, (*fields[:4], *optional, fields[4]), event_time, key_id(attrs.get(KEY_ID_HEADER))
    )


def usage_data(fast: FastUsage) -> UsageRecorded:
    """The model the reference decoder gives for ``fast`` (for the conflict path and the
    tests; not on the hot path): ``model_construct`` of the same values."""
    fields: dict[str, Any] = dict(zip(USAGE_VALUES, fast.values, strict=True))
    for name in ("amount", "quantity", "consumed_quantity"):
        if fields[name] is not None:
            fields[name] = Decimal(fields[name])
    fields["event_time"] = fast.event_time
    return UsageRecorded.model_construct(schema_version=1, **fields)


#: TEXT_PATTERN on a Python string, lone surrogates refused too (pydantic refuses a
#: string that has no UTF-8 form).
_TEXT_VALUE = re.compile(
    r"[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]*\Z"
)
_PERIOD_RE = re.compile(_strict(PERIOD_PATTERN))
_CURRENCY_RE = re.compile(_strict(CURRENCY_PATTERN))
#: The text fields of :func:`usage_values_ok` in its order, with their longest length.
_TEXT_BOUNDS = (64, 64, 256, 1024, 64, 64)


def _decimal_ok(value: object) -> bool:
    if type(value) is not Decimal or not value.is_finite():
        return False
    _sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # finite
    return max(len(digits) + exponent, 1) <= 18 and max(-exponent, 0) <= 20


def _text_ok(value: object, longest: int) -> bool:
    return value is None or (
        type(value) is str and len(value) <= longest and _TEXT_VALUE.match(value) is not None
    )


def usage_numbers_ok(
    amount: object, quantity: object, consumed_quantity: object, event_time: object
) -> bool:
    """The part of :func:`usage_values_ok` that checks the numbers and the time (the
    rest checks only texts): a caller that has seen :func:`usage_values_ok` hold for the
    same texts may ask only this (the FOCUS mapper, whose texts repeat from row to row:
    ``streams.core.domain.focus``)."""
    return (
        _decimal_ok(amount)
        and (quantity is None or _decimal_ok(quantity))
        and (consumed_quantity is None or _decimal_ok(consumed_quantity))
        and type(event_time) is datetime
        and event_time.utcoffset() == _ZERO
        and event_time >= EARLIEST_INSTANT
    )


def usage_values_ok(
    customer_id: object,
    billing_period: object,
    amount: object,
    currency: object,
    quantity: object,
    unit: object,
    consumed_quantity: object,
    consumed_unit: object,
    sku_id: object,
    description: object,
    region_id: object,
    charge_category: object,
    event_time: object,
    provider: object,
) -> bool:
    """Whether :class:`~streams.core.domain.events.UsageRecorded` accepts these Python
    values as they are (decimals as ``Decimal``, ``event_time`` a UTC datetime), checked
    without building the model. True only when the model would accept them and hold
    the same values; False means "ask the model" (its error is the one to report).
    The FOCUS mapper calls it for every row (``streams.core.domain.focus``);
    ``tests/unit/test_fastcodec.py`` shows True implies the model's acceptance."""
    if not (
        type(customer_id) is str
        and 0 < len(customer_id) <= 128
        and _CUSTOMER_RE.match(customer_id)
        and type(billing_period) is str
        and _PERIOD_RE.match(billing_period)
        and type(currency) is str
        and _CURRENCY_RE.match(currency)
        and _text_ok(provider, 128)
        and usage_numbers_ok(amount, quantity, consumed_quantity, event_time)
    ):
        return False
    return usage_texts_ok(unit, consumed_unit, sku_id, description, region_id, charge_category)


def usage_texts_ok(
    unit: object,
    consumed_unit: object,
    sku_id: object,
    description: object,
    region_id: object,
    charge_category: object,
) -> bool:
    """The part of :func:`usage_values_ok` that checks these six optional texts (their
    bounds and characters), for a caller that remembers which sets of them passed."""
    texts = (unit, consumed_unit, sku_id, description, region_id, charge_category)
    return all(_text_ok(text, longest) for text, longest in zip(texts, _TEXT_BOUNDS, strict=True))
