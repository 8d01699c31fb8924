"""The fast decoder against the reference: same records accepted, equal values.

:func:`streams.core.domain.fastcodec.decode_usage` vouches for a record or returns
None (then the reference :func:`streams.core.domain.codec.decode` decides). The
oracle is the reference decoder, which validates with the pydantic models (the
contract): for every generated record,

1. when the fast path returns a value, the reference accepts the record as a
   ``usage.recorded`` with the same event id and data (each field equal, decimals
   with the same written form), so fast path + fallback accepts exactly what the
   reference accepts;
2. the fast path vouches for every valid record in the producers' form (compact
   JSON, times ``…Z`` or ``±HH:MM``), so the hot path is really taken.

Records come from Hypothesis: valid usage records with every field drawn within
and around its bounds, then mutated (a name repeated, a pattern field ending in a
newline, control characters, lone surrogates, ``\\u`` escapes, huge numbers and
exponents, JSON numbers for decimals, other time forms, bad headers and keys), and
the fuzz tier's whole account-events mix (tests/fuzz/records.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from streams.apps.invoicing.decoding import key_id_of
from streams.core.billing.rows import Record
from streams.core.domain.codec import KEY_ID_HEADER, decode
from streams.core.domain.errors import InvalidEvent
from streams.core.domain.events import Envelope, UsageRecorded
from streams.core.domain.fastcodec import KEY_ID_HEADER as FAST_KEY_ID_HEADER
from streams.core.domain.fastcodec import (
    USAGE_VALUES,
    FastUsage,
    UsageFields,
    decode_usage,
    usage_data,
    usage_values_ok,
)
from streams.core.domain.focus import UsageFields as FocusFields
from tests.fuzz.records import HypothesisPicker, account_record, mutate_headers

_OPTIONAL_TEXT = {
    "unit": 64,
    "consumed_unit": 64,
    "sku_id": 256,
    "description": 1024,
    "region_id": 64,
    "charge_category": 64,
    "provider": 128,
}
_DECIMALS = ("amount", "quantity", "consumed_quantity")


def _headers(event_id: str, subject: str, time: str) -> list[tuple[str, bytes]]:
    return [
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id.encode("utf-8", "surrogatepass")),
        ("ce_source", b"/tests/fast"),
        ("ce_type", b"usage.recorded"),
        ("ce_time", time.encode()),
        ("ce_subject", subject.encode("utf-8", "surrogatepass")),
        ("content-type", b"application/json"),
    ]


#: One character each: refused by TEXT_PATTERN (C0 but TAB/LF/CR, DEL, C1, bidirectional
#: controls, a lone surrogate) or kept (TAB, LF, CR, others near those ranges).
_ONE_CHAR = (
    *["\x00", "\x01", "\x08", "\x0b", "\x0c", "\x1f", "\x7f", "\x80", "\x85", "\x9f"],
    *["\u202a", "\u202e", "\u2066", "\u2069", "\ud800", "\udfff"],
    *["\t", "\n", "\r", "\xa0", "\u2029", "\u202f", "\u2065", "\u206a", "\\", '"', "/"],
)
_BAD_DECIMALS = ["1" * 19, "0." + "1" * 21, "1e5", "1E+30", "+1", " 1", "1 ", "1.", ".5", "NaN",
                 "007.50", "-0", "-0.000", "\u0661\u0662", "1.5\n", "0x10", ""]  # fmt: skip
_BAD_TIMES = ["2024-02-30T00:00:00Z", "2024-13-01T00:00:00Z", "2024-01-01T24:00:00Z",
              "2024-06-30T23:59:60Z", "9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+05:00",
              "1969-12-31T23:59:59Z", "1970-01-01T00:30:00+01:00", "2024-01-01T00:00:00Z\n",
              "1700000000", "2024-01-01", "2024-01-01 00:00:00Z", "2024-01-01T00:00:00z",
              "2024-01-01T00:00:00", "2024-01-01T00:00:00+0200", "2024-01-01T00:00:00+24:00",
              "2024-01-01T00:00:00.1234567Z", "2024-01-01T00:00:00-00:00",
              "2024-01-01T00:00:00+23:59", "2024-01-01T00:00:00.5+14:00"]  # fmt: skip
_BAD_OTHER: dict[str, list[Any]] = {
    "billing_period": [
        "2024-9",
        "1969-12",
        "2024-13",
        "2024-09\n",
        "\uff12\uff10\uff12\uff14-09",
        "",
    ],
    "currency": ["usd", "US", "USDX", "USD\n", ""],
    "customer_id": ["", "a b", "a\n", "x" * 129, "é"],
    "schema_version": [2, True, 1.0, "1", None, 0],
}


@st.composite
def _decimal(draw: st.DrawFn) -> str:
    whole = draw(st.integers(0, 10**18 - 1))
    sign = draw(st.sampled_from(["", "-"]))
    places = draw(st.integers(0, 20))
    frac = f".{draw(st.integers(0, 10**places - 1)):0{places}d}" if places else ""
    return f"{sign}{whole}{frac}"


@st.composite
def _time(draw: st.DrawFn) -> str:
    moment = datetime(1970, 1, 2, tzinfo=UTC) + timedelta(
        seconds=draw(st.integers(0, 60 * 365 * 86400)),
        microseconds=draw(st.sampled_from([0, 500000, 123456, 1])),
    )
    zone = draw(st.sampled_from(["Z", "+00:00", "+02:00", "-05:30", "+14:00", "-12:00"]))
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if moment.microsecond:
        text += draw(st.sampled_from([f".{moment.microsecond:06d}", ".5"]))
    return text + zone


@st.composite
def usage_records(draw: st.DrawFn) -> tuple[bytes | None, bytes | None, list[Any], bool]:
    """(key, value, headers, clean): a valid record in the producers' form, then at most
    one mutation; ``clean`` when none was made."""
    customer = draw(st.text("abcAZ09._:/-", min_size=1, max_size=12))
    data: dict[str, Any] = {
        "customer_id": customer,
        "billing_period": draw(st.sampled_from(["2024-09", "1970-01", "9999-12"])),
        "amount": draw(_decimal()),
        "currency": draw(st.sampled_from(["USD", "EUR", "JPY"])),
        "event_time": draw(_time()),
    }
    for name in ("quantity", "consumed_quantity"):
        if draw(st.booleans()):
            data[name] = draw(_decimal() | st.none())
    for name, bound in _OPTIONAL_TEXT.items():
        if draw(st.booleans()):
            size = draw(st.sampled_from([3, 0, bound]))
            data[name] = (
                draw(st.text(st.sampled_from(list("abc é漢🙂\t/")), min_size=size, max_size=size))
                or None
            )
    if draw(st.booleans()):
        data["schema_version"] = 1
    event_id = draw(st.text("abc-0123456789", min_size=1, max_size=40))
    headers = _headers(event_id, customer, draw(st.sampled_from(["2024-09-01T00:00:00Z",
                                                                 "2024-09-01T00:00:00+02:00"])))  # fmt: skip
    key: bytes | None = customer.encode()
    # None first: Hypothesis leans towards the first choices, and a clean base is what
    # makes a single mutation tell.
    mutation = draw(st.sampled_from([None] * 6 + list(range(16))))
    if mutation in (11, 12, 13, 14, 15):  # a field set to a value next to its bounds
        if mutation == 11:
            name = draw(st.sampled_from(sorted(_OPTIONAL_TEXT)))
            data[name] = "ab" + draw(st.sampled_from(_ONE_CHAR)) + "cd"
        elif mutation == 12:
            name = draw(st.sampled_from(sorted(_OPTIONAL_TEXT)))
            size = _OPTIONAL_TEXT[name] + draw(st.sampled_from([1, 0, -1]))
            data[name] = draw(st.sampled_from(["x", "é", "🙂"])) * size
        elif mutation == 13:
            data[draw(st.sampled_from(_DECIMALS))] = draw(st.sampled_from(_BAD_DECIMALS))
        elif mutation == 14:
            data["event_time"] = draw(st.sampled_from(_BAD_TIMES))
        else:
            name = draw(st.sampled_from(sorted(_BAD_OTHER)))
            data[name] = draw(st.sampled_from(_BAD_OTHER[name]))
            if name == "customer_id":
                key = str(data[name]).encode()
                headers = _headers(event_id, str(data[name]), "2024-09-01T00:00:00Z")
    ascii_only = mutation is not None and draw(st.booleans())
    value = json.dumps(data, ensure_ascii=ascii_only, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )
    if mutation == 0:  # a name twice: the reference refuses
        name = draw(st.sampled_from(sorted(data)))
        value = b'{"' + name.encode() + b'":' + json.dumps(data[name]).encode() + b"," + value[1:]
    elif mutation == 1:  # a name twice, the second time further down
        name = draw(st.sampled_from(sorted(data)))
        value = value[:-1] + b',"' + name.encode() + b'":' + json.dumps(data[name]).encode() + b"}"
    elif mutation == 2:  # a decimal as a JSON number
        name = draw(st.sampled_from(_DECIMALS))
        number = draw(st.sampled_from(["5", "-5", "1.5", "1e400", "1" * 30, "0"]))
        value = json.dumps({**data, name: "@"}).encode().replace(b'"@"', number.encode())
    elif mutation == 3:  # an unknown field
        value = json.dumps({**data, draw(st.sampled_from(["extra", "Amount"])): 1}).encode()
    elif mutation == 4:  # white space in the JSON
        value = json.dumps(data, indent=draw(st.sampled_from([None, 1]))).encode()
    elif mutation == 5:  # a name written with a \u escape
        name = draw(st.sampled_from(sorted(data)))
        value = value.replace(f'"{name}"'.encode(), f'"\\u{ord(name[0]):04x}{name[1:]}"'.encode())
    elif mutation == 6:
        headers, _what = mutate_headers(HypothesisPicker(draw(st.data())), headers)
    elif mutation == 7:
        key = draw(st.sampled_from([None, b"", b"\xff", b"other", customer.encode() + b"\n"]))
    elif mutation == 8:  # raw bytes cut, invalid UTF-8, a BOM
        edit = draw(st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\x00"]))
        at = draw(st.integers(0, len(value)))
        value = draw(st.sampled_from([value[:at], value[:at] + edit + value[at:],
                                      b"\xef\xbb\xbf" + value]))  # fmt: skip
    elif mutation == 9:  # a text holding a name in quotes
        value = json.dumps({**data, "description": '"amount":"1"'}).encode()
    elif mutation == 10:
        value = json.dumps({**data, "customer_id": "other"}).encode()
    # A text starting with ":" (or holding '\\":') also shows '":', and the fast path
    # declines it (it counts names by '":'); such a record is clean but not required.
    clean = mutation is None and value.count(b'":') == len(data)
    return key, value, headers, clean


def _reference(key: bytes | None, value: bytes | None, headers: list[Any]) -> Envelope | None:
    try:
        return decode(key, value, headers)
    except InvalidEvent:
        return None


def _assert_equal(fast: FastUsage, envelope: Envelope) -> None:
    reference = envelope.data
    assert isinstance(reference, UsageRecorded)
    assert fast.event_id == envelope.id
    mine = usage_data(fast)
    for name in UsageRecorded.model_fields:
        want, got = getattr(reference, name), getattr(mine, name)
        assert got == want, f"{name}: fast {got!r}, reference {want!r}"
        assert type(got) is type(want), name
    for name in _DECIMALS:  # the written form too (scale kept): what the store keeps
        text, want = fast.values[USAGE_VALUES.index(name)], getattr(reference, name)
        assert (None if text is None else str(Decimal(text))) == (
            None if want is None else str(want)
        ), name
    assert fast.event_time.utcoffset() == timedelta(0)
    # the text the usage COPY writes for event_time: the same instant
    written = fast.values[USAGE_VALUES.index("event_time")]
    assert written is not None
    assert datetime.fromisoformat(written) == reference.event_time, "event_time text"


#: The FOCUS mapper's field order (what :func:`usage_values_ok` takes).
_FOCUS_ORDER = FocusFields._fields

_SETTINGS = settings(
    max_examples=1500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@_SETTINGS
@given(usage_records())
def test_the_fast_path_accepts_only_what_the_reference_accepts_with_equal_values(
    drawn: tuple[bytes | None, bytes | None, list[Any], bool],
) -> None:
    key, value, headers, clean = drawn
    fast = decode_usage(key, value, headers)
    envelope = _reference(key, value, headers)
    if fast is not None:
        assert envelope is not None, "the fast path accepted a record the contract refuses"
        _assert_equal(fast, envelope)
    elif clean and envelope is not None:
        raise AssertionError(
            f"the fast path declined a valid record in the producers' form: {value!r}"
        )


@_SETTINGS
@given(st.data())
def test_the_fuzz_mix_through_both_decoders(data: st.DataObject) -> None:
    record = account_record(HypothesisPicker(data))
    fast = decode_usage(record.key, record.value, record.headers)
    if fast is None:
        return
    envelope = _reference(record.key, record.value, record.headers)
    assert envelope is not None, f"the fast path accepted {record.short()}"
    _assert_equal(fast, envelope)


def test_the_struct_has_the_models_fields() -> None:
    assert set(UsageFields.__struct_fields__) == set(UsageRecorded.model_fields)
    required = {n for n, f in UsageRecorded.model_fields.items() if f.is_required()}
    assert set(UsageFields.__struct_fields__[: len(required)]) == required
    assert set(USAGE_VALUES) == set(UsageRecorded.model_fields) - {"schema_version"}


def test_a_known_record_decodes_to_literal_values() -> None:
    value = (
        b'{"customer_id":"acme","billing_period":"2024-09","amount":"007.50","currency":"USD",'
        b'"event_time":"2024-09-30T23:30:00-02:00","description":"line\\nbreak"}'
    )
    headers = _headers("e-1", "acme", "2024-09-01T00:00:00Z")
    fast = decode_usage(b"acme", value, headers)
    assert fast is not None
    assert fast.event_id == "e-1"
    values = dict(zip(USAGE_VALUES, fast.values, strict=True))
    assert values["amount"] == "007.50"
    assert values["description"] == "line\nbreak"
    assert values["quantity"] is None
    assert fast.event_time == datetime(2024, 10, 1, 1, 30, tzinfo=UTC)
    assert decode_usage(b"acme", value.replace(b'"USD"', b'"USD\\n"'), headers) is None
    twice = b'{"amount":"1",' + value[1:]
    assert decode_usage(b"acme", twice, headers) is None


_VALUE_TEXT = st.text(st.sampled_from(["a", "é", " ", "\n", "\t", *_ONE_CHAR]), max_size=6)


_GOOD_VALUES: dict[str, Any] = {
    "customer_id": "acme",
    "billing_period": "2024-09",
    "amount": Decimal("1.50"),
    "currency": "USD",
    "quantity": None,
    "unit": "GB",
    "consumed_quantity": Decimal("3"),
    "consumed_unit": None,
    "sku_id": "s",
    "description": "line\nbreak",
    "region_id": None,
    "charge_category": None,
    "event_time": datetime(2024, 9, 1, tzinfo=UTC),
    "provider": "AWS",
}
_DECIMALS_NEAR = [Decimal("1.5"), Decimal("-0"), Decimal("1E+17"), Decimal("1E+18"),
                  Decimal("1E-20"), Decimal("1E-21"), Decimal("NaN"), Decimal("Infinity"),
                  Decimal("123456789012345678.12"), Decimal("1234567890123456789"), 1.5, 2, "1.5"]  # fmt: skip
_TIMES_NEAR = [datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, tzinfo=UTC),
               datetime(2024, 9, 1), datetime(2024, 9, 1, 2, tzinfo=timezone(timedelta(hours=2))),
               "2024-09-01T00:00:00Z"]  # fmt: skip
_BOUNDS = {"unit": 64, "consumed_unit": 64, "sku_id": 256, "description": 1024,
           "region_id": 64, "charge_category": 64, "provider": 128}  # fmt: skip


_OTHERS_NEAR: dict[str, list[Any]] = {
    "customer_id": ["a/b:c", "", "a b", "x" * 128, "x" * 129, "é", "a\n", 7],
    "billing_period": ["1970-01", "1969-12", "2024-9", "2024-09\n", "9999-12"],
    "currency": ["EUR", "usd", "USD\n", "US", "XXX"],
}


@st.composite
def _python_values(draw: st.DrawFn) -> dict[str, Any]:
    """Valid Python values as the FOCUS mapper makes them, one or two of them then set
    near or past its bound."""
    values = dict(_GOOD_VALUES)
    for _ in range(draw(st.integers(1, 2))):
        name = draw(st.sampled_from(sorted(values)))
        if name in ("amount", "quantity", "consumed_quantity"):
            values[name] = draw(st.sampled_from(_DECIMALS_NEAR))
        elif name == "event_time":
            values[name] = draw(st.sampled_from(_TIMES_NEAR))
        elif name in _BOUNDS:
            bound = _BOUNDS[name]
            values[name] = draw(
                _VALUE_TEXT
                | st.sampled_from(["x" * bound, "x" * (bound + 1), "é" * bound, 5, None])
            )
        else:
            values[name] = draw(st.sampled_from(_OTHERS_NEAR[name]))
    return values


@_SETTINGS
@given(_python_values())
def test_usage_values_ok_vouches_only_for_what_the_model_accepts(values: dict[str, Any]) -> None:
    ok = usage_values_ok(*[values[name] for name in _FOCUS_ORDER])
    try:
        model = UsageRecorded(**values)
    except ValidationError:
        assert not ok, f"vouched for values the model refuses: {values!r}"
        return
    if ok:
        for name in _FOCUS_ORDER:
            assert getattr(model, name) == values[name], name


def test_usage_values_ok_accepts_plain_values() -> None:
    values = dict(
        customer_id="acme",
        billing_period="2024-09",
        amount=Decimal("1.50"),
        currency="USD",
        quantity=None,
        unit="GB",
        consumed_quantity=Decimal("3"),
        consumed_unit=None,
        sku_id="s",
        description="line\nbreak",
        region_id=None,
        charge_category=None,
        event_time=datetime(2024, 9, 1, tzinfo=UTC),
        provider="AWS",
    )
    assert usage_values_ok(*[values[name] for name in _FOCUS_ORDER])
    assert not usage_values_ok(*[{**values, "unit": "x\x00"}[n] for n in _FOCUS_ORDER])


_KEY_ID_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=80),
    st.text(max_size=70).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"k" * 64, b"k" * 65, "é".encode() * 32, "é".encode() * 33]),
)


@given(st.lists(_KEY_ID_VALUES, max_size=3))
def test_the_fast_paths_key_id_is_the_one_key_id_of_reads(values: list[bytes | None]) -> None:
    """The key id the fast path carries is what :func:`key_id_of` reads from the same
    record (the last header wins; empty, over 64 bytes or not UTF-8: None), whatever the
    header's values, repeated or not; and both read the codec's header name."""
    headers = _headers("e-1", "acme", "2024-09-01T00:00:00Z")
    headers += [(FAST_KEY_ID_HEADER, b"" if raw is None else raw) for raw in values]
    value = (
        b'{"customer_id":"acme","billing_period":"2024-09","amount":"1.00","currency":"USD",'
        b'"event_time":"2024-09-30T23:30:00Z"}'
    )
    fast = decode_usage(b"acme", value, headers)
    record = Record("t", 0, 0, b"acme", value, headers)
    if fast is None:  # a header that is not UTF-8: the reference decodes the record
        assert any(raw is not None and not _utf8(raw) for raw in values)
        return
    assert fast.key_id == key_id_of(record)
    assert FAST_KEY_ID_HEADER == KEY_ID_HEADER


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
