"""Generated Kafka records for the fuzz suite: valid, mutated valid and hostile.

One generator per topic: :func:`account_record` makes a record for ``billing.account-events.v1`` and
:func:`invoice_record` one for ``billing.invoices.v1``; each is a :class:`FuzzRecord` (key, value,
headers as a producer sends them, and a description of what made it). The mix (docs/design.md,
invariant 5; docs/contract.md):

=====================  ==============================================================
``valid``              a valid CloudEvents binary-mode record of an event type of the
                       topic, with varied data inside the contract's bounds (amounts up
                       to the bounds, Unicode text, optional fields present or not)
``mutated``            a valid record with one to three mutations: a field removed,
                       added, of the wrong type, or set to a hostile value (huge and
                       very precise numbers, exponents, control characters, lone
                       surrogates, oversize text, deep JSON, big integer literals);
                       the JSON text cut, or given invalid UTF-8 or a NUL byte; a header
                       removed, duplicated, wrong or not UTF-8; a key that is absent,
                       not UTF-8, huge, or disagrees with ``ce_subject`` / the payload
``bytes``              random key, value and headers
``json``               a well-formed JSON value of a random shape under valid headers
``deep``               JSON nested thousands of levels deep
=====================  ==============================================================

Records never name a *clean* customer (the fuzz tests' control group): customers
come from a pool of victims and from random ids prefixed ``fz-``, so a bad record
can hold a victim, never a clean customer.

**Two sources of choices, one generator.** Every choice goes through a
:class:`Picker`. :class:`HypothesisPicker` draws each choice from Hypothesis
(``st.data()``), so the property tests of the unit tier shrink a failing record
to a small one; :class:`RandomPicker` draws from ``random.Random(seed)``, so the
stack tier makes 10,000 records in well under a second, the same list for the same
seed on every machine (:func:`generate`). Hypothesis costs ~50 ms per record of this
size through its engine, which would spend minutes of a CI run on generation alone.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol, TypeVar

from hypothesis import strategies as st

Headers = list[tuple[str, bytes]]
T = TypeVar("T")

#: Victim customer ids (valid ids): mutated records and keys that disagree name them.
VICTIMS = tuple(f"fz-victim-{i:02d}" for i in range(24))

ACCOUNT_TYPES = (
    "customer.upserted",
    "usage.recorded",
    "billing_period.closed",
    "usage.metered",
    "subscription.started",
    "subscription.changed",
    "subscription.ended",
)
INVOICE_TYPES = ("invoice.issued", "credit_note.issued", "invoice.voided")
CURRENCIES = ("USD", "EUR", "JPY", "BHD", "GBP")


@dataclass(frozen=True)
class FuzzRecord:
    """One generated record: what the producer sends, and which generator made it."""

    key: bytes | None
    value: bytes | None
    headers: Headers
    made_by: str
    #: Why the contract must refuse this record, when the generator knows it must (random
    #: bytes, deep JSON, a truncated value, invalid UTF-8, a NUL byte, an amount as a JSON
    #: number): the fuzz tests' oracle, independent of the codec. None: no such knowledge.
    must_refuse: str | None = None

    def short(self) -> str:
        """A one-line description for failure messages."""
        value = (self.value or b"")[:160]
        return f"{self.made_by}: key={self.key!r:.60} value={value!r} headers={self.headers!r:.240}"


# --------------------------------------------------------------------------- choices


class Picker(Protocol):
    """Where the generator's choices come from."""

    def integer(self, low: int, high: int) -> int: ...
    def binary(self, max_size: int) -> bytes: ...


def choice(pick: Picker, options: Sequence[T]) -> T:
    return options[pick.integer(0, len(options) - 1)]


def flip(pick: Picker) -> bool:
    return pick.integer(0, 1) == 1


class RandomPicker:
    """Choices from ``random.Random(seed)``: fast and reproducible."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def binary(self, max_size: int) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, max_size))


class HypothesisPicker:
    """Choices drawn from Hypothesis (``data.draw``): shrinkable."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))

    def binary(self, max_size: int) -> bytes:
        return self.data.draw(st.binary(max_size=max_size))


# Text alphabets: printable characters of several scripts, and hostile ones.
_PRINTABLE = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,-_/:()'&#+@"
    "éèüßçñøåÆŒ€£¥ąłżčšžğışő ΑΒΓδεζ абвгд אבג عربي 漢字かなカナ 한글 🙂🚀 \u00a0"
)
_HOSTILE_CHARS = "\x00\x01\x07\x08\t\n\r\x1b\x7f\x85\x9b\u200b\u200e\u202e\u2028\ufeff\ufffe\uffff"
_ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789._:/-ABC"


def text(pick: Picker, alphabet: str, max_size: int, min_size: int = 0) -> str:
    return "".join(choice(pick, alphabet) for _ in range(pick.integer(min_size, max_size)))


def _id(pick: Picker) -> str:
    return text(pick, _ID_CHARS, 20, 1)


def _code(pick: Picker) -> str:
    return "c" + text(pick, "abcdefghijklmnopqrstuvwxyz0123456789_", 12)


def decimal_text(pick: Picker, integer_digits: int = 18, decimals: int = 12) -> str:
    """A decimal string inside the contract: up to ``integer_digits`` and ``decimals``."""
    sign = choice(pick, ("", "", "", "-"))
    digits = pick.integer(1, integer_digits)
    whole = pick.integer(0, 10**digits - 1)
    places = pick.integer(0, decimals)
    if places == 0:
        return f"{sign}{whole}"
    return f"{sign}{whole}.{pick.integer(0, 10**places - 1):0{places}d}"


def instant(pick: Picker) -> str:
    moment = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(seconds=pick.integer(0, 3 * 365 * 86400))
    return moment.isoformat().replace("+00:00", choice(pick, ("Z", "+00:00")))


def _uuid(pick: Picker) -> str:
    return str(uuid.UUID(int=pick.integer(0, 2**128 - 1)))


# --------------------------------------------------------------------------- valid data


def account_data(pick: Picker, event_type: str, customer: str) -> dict[str, Any]:
    """Valid data of ``event_type`` for ``customer`` (the contract of streams.core.domain.events)."""
    at = instant(pick)
    if event_type == "customer.upserted":
        data: dict[str, Any] = {
            "customer_id": customer,
            "name": "N" + text(pick, _PRINTABLE, 30),
            "email": f"{_code(pick)}@{_code(pick)}.invalid",
            "currency": choice(pick, CURRENCIES),
        }
        if flip(pick):
            data["billing_account_id"] = _id(pick)
        return data
    if event_type == "usage.recorded":
        data = {
            "customer_id": customer,
            "billing_period": at[:7],
            "amount": decimal_text(pick),
            "currency": choice(pick, CURRENCIES),
            "event_time": at,
        }
        for name in ("unit", "sku_id", "description", "region_id", "charge_category", "provider"):
            if flip(pick):
                data[name] = text(pick, _PRINTABLE, 40)
        if flip(pick):
            data["quantity"] = decimal_text(pick)
        return data
    if event_type == "billing_period.closed":
        return {
            "customer_id": customer,
            "billing_period": at[:7],
            "closed_at": at,
            "reason": choice(pick, ("period_closed", "hold_released")),
        }
    if event_type == "usage.metered":
        props = {_code(pick): text(pick, _PRINTABLE, 20) for _ in range(pick.integer(0, 3))}
        values = {_code(pick): decimal_text(pick) for _ in range(pick.integer(0, 3))}
        return {
            "customer_id": customer,
            "metric": _code(pick),
            "event_time": at,
            "properties": props,
            "values": {k: v for k, v in values.items() if k not in props},
        }
    data = {"customer_id": customer, "effective_at": at}
    if event_type == "subscription.ended":
        if flip(pick):
            data["reason"] = text(pick, _PRINTABLE, 40)
        return data
    data["plan_code"] = _code(pick)
    data["plan_version"] = pick.integer(1, 50)
    return data


def invoice_data(pick: Picker, event_type: str, customer: str) -> dict[str, Any]:
    """Valid data of an invoice-topic event for ``customer``."""
    at = instant(pick)
    period = at[:7]
    currency = choice(pick, ("USD", "EUR", "JPY"))
    places = 0 if currency == "JPY" else 2
    subtotal = decimal_text(pick, integer_digits=9, decimals=places)
    tax = decimal_text(pick, integer_digits=6, decimals=places).lstrip("-")
    common: dict[str, Any] = {
        "customer_id": customer,
        "billing_period": period,
        "invoice_id": _uuid(pick),
        "invoice_number": f"INV-{period}-{pick.integer(1, 999999):06d}",
        "revision": pick.integer(1, 5),
    }
    if event_type == "invoice.voided":
        return {**common, "reason": text(pick, _PRINTABLE, 30), "voided_at": at}
    money = {
        "customer_name": "N" + text(pick, _PRINTABLE, 30),
        "email": f"{_code(pick)}@{_code(pick)}.invalid",
        "currency": currency,
        "subtotal": subtotal,
        "tax_total": tax,
        "total": format(Decimal(subtotal) + Decimal(tax), "f"),
        "issued_at": at,
    }
    if event_type == "credit_note.issued":
        return {
            **common,
            **money,
            "credit_note_id": _uuid(pick),
            "credit_note_number": f"CN-{period}-{pick.integer(1, 999999):06d}",
            "reason": text(pick, _PRINTABLE, 30),
        }
    return {**common, **money, "line_count": pick.integer(0, 50)}


def headers_for(event_id: str, event_type: str, subject: str, time: str) -> Headers:
    """The CloudEvents binary-mode headers of a record."""
    return [
        ("ce_specversion", b"1.0"),
        ("ce_id", event_id.encode()),
        ("ce_source", b"/tests/fuzz"),
        ("ce_type", event_type.encode()),
        ("ce_time", time.encode()),
        ("ce_subject", subject.encode()),
        ("content-type", b"application/json"),
    ]


# --------------------------------------------------------------------------- hostile values

_HUGE_DIGITS = "9" * 10_000

_HOSTILE: tuple[Any, ...] = (
    None,
    True,
    0,
    -1,
    1.5,
    "",
    " ",
    "1E+30",
    "1e-7",
    "-0",
    "+1",
    " 12.5 ",
    "NaN",
    "Infinity",
    "sNaN",
    "0x1F",
    "1_000",
    "١٢٣",  # Arabic-Indic digits: Decimal() reads them, the contract must not
    "12.5\u0000",
    "a\u0000b",
    "\ud800",
    "\udfff tail",
    "line\nbreak",
    "tab\there",
    "\u202egnp.exe",  # right-to-left override
    "\x7f\x9b",
    "0." + "1" * 40,
    "1" + "0" * 30,
    "123456789012345678901.5",
    "1." + "0" * 25,
    _HUGE_DIGITS,
    "-" + _HUGE_DIGITS + "." + _HUGE_DIGITS,
    "x" * 100_000,
    "é" * 600,
    [],
    {},
    [1, 2, 3],
    {"nested": {"deeper": [None]}},
    "0000-01",
    "1969-12",
    "9999-12",
    "2025-13",
    "0001-01-01T00:00:00+05:00",
    "9999-12-31T23:59:59-05:00",
    "2025-03-02T00:00:00",
    "2025-03-02T00:00:00+25:00",
    "not a date",
    10**40,
    -(10**19),
    2**63,
)


def hostile(pick: Picker) -> Any:
    kind = pick.integer(0, 5)
    if kind <= 3:
        return choice(pick, _HOSTILE)
    if kind == 4:
        return text(pick, _HOSTILE_CHARS + "ab", 8, 1)
    return pick.integer(-(10**30), 10**30)


def _deep(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def _dumps(data: Any) -> bytes:
    # ensure_ascii (the default) writes lone surrogates and control characters as escapes
    return json.dumps(data).encode()


# --------------------------------------------------------------------------- mutations


def mutate_payload(pick: Picker, data: dict[str, Any]) -> tuple[bytes, str]:
    """A mutated JSON value of ``data`` and what was done."""
    data = dict(data)
    fields = sorted(data)
    what = choice(pick, ("remove", "add", "replace", "replace", "replace", "raw"))
    if what == "remove" and fields:
        name = choice(pick, fields)
        data.pop(name)
        return _dumps(data), f"remove {name}"
    if what == "add":
        name = choice(pick, ("unknown_field", "schema_version", "amount", "extra", "properties"))
        data[name] = hostile(pick)
        return _dumps(data), f"add {name}"
    if what == "replace" and fields:
        name = choice(pick, fields)
        data[name] = hostile(pick)
        return _dumps(data), f"replace {name}"
    edit = choice(pick, ("bigint", "exponent", "deep", "truncate", "invalid_utf8", "nul"))
    raw = _dumps(data)
    if edit in ("bigint", "exponent", "deep") and fields:
        name = choice(pick, fields)
        data[name] = 0
        literal = {
            "bigint": _HUGE_DIGITS[: choice(pick, (4301, 5000, 10_000))],
            "exponent": choice(pick, ("1e400", "-1e400", "1E+30", "1.5e-30")),
            "deep": _deep(choice(pick, (50, 1500, 20_000)), choice(pick, ("list", "object"))),
        }[edit]
        return _dumps(data).replace(f'"{name}": 0'.encode(), f'"{name}": {literal}'.encode(), 1), (
            f"{edit} {name}"
        )
    if edit == "truncate":
        return raw[: pick.integer(0, max(0, len(raw) - 1))], edit
    at = pick.integer(0, len(raw))
    inserted = b"\x00" if edit == "nul" else choice(pick, (b"\xff", b"\xc3", b"\xed\xa0\x80"))
    return raw[:at] + inserted + raw[at:], edit


def mutate_headers(pick: Picker, headers: Headers) -> tuple[Headers, str]:
    headers = list(headers)
    names = [name for name, _ in headers]
    if not names:
        return [("ce_type", b"usage.recorded")], "headers only ce_type"
    what = choice(pick, ("drop", "duplicate", "replace", "replace", "not_utf8", "none"))
    name = choice(pick, names)
    index = names.index(name)
    if what == "drop":
        headers.pop(index)
    elif what == "duplicate":
        headers.append((name, pick.binary(20)))
    elif what == "replace":
        replacement = choice(
            pick,
            (
                b"",
                b"2.0",
                b"usage.Recorded",
                b"invoice.issued",
                b"customer.upserted",
                b"text/plain",
                b"application/json; charset=latin-1",
                b"0001-01-01T00:00:00+05:00",
                b"9999-12-31T23:59:59-05:00",
                b"yesterday",
                b"a\x00b",
                b"x" * 5000,
                "caf\u00e9 \u202e".encode(),
            ),
        )
        headers[index] = (name, replacement)
    elif what == "not_utf8":
        headers[index] = (name, b"\xff\xfe" + pick.binary(8))
    else:
        headers = []
    return headers, f"headers {what} {name}"


def mutate_key(
    pick: Picker, key: bytes, customer: str, pool: Sequence[str]
) -> tuple[bytes | None, str]:
    what = choice(pick, ("none", "other", "not_utf8", "nul", "empty", "huge", "space"))
    if what == "none":
        return None, "key none"
    if what == "other":
        others = [c for c in pool if c != customer] or [customer]
        return choice(pick, others).encode(), "key other customer"
    if what == "not_utf8":
        return b"\xff" + key, "key not utf-8"
    if what == "nul":
        return key + b"\x00", "key with NUL"
    if what == "empty":
        return b"", "key empty"
    if what == "huge":
        return b"k" * 20_000, "key huge"
    return key + b" x", "key with space"


# --------------------------------------------------------------------------- records

DataOf = Callable[[Picker, str, str], dict[str, Any]]


def _valid(
    pick: Picker, types: Sequence[str], data_of: DataOf, pool: Sequence[str]
) -> tuple[FuzzRecord, dict[str, Any], str]:
    event_type = choice(pick, types)
    customer = choice(pick, pool) if flip(pick) else f"fz-{_id(pick)}"
    data = data_of(pick, event_type, customer)
    headers = headers_for(f"fz-{_uuid(pick)}", event_type, customer, instant(pick))
    return (
        FuzzRecord(customer.encode(), _dumps(data), headers, f"valid {event_type}"),
        data,
        customer,
    )


def record(
    pick: Picker, types: Sequence[str], data_of: DataOf, pool: Sequence[str] = VICTIMS
) -> FuzzRecord:
    """One record of the mix (module docstring) for a topic carrying ``types``."""
    kind = pick.integer(0, 9)
    if kind <= 1:
        return _valid(pick, types, data_of, pool)[0]
    if kind <= 6:
        made, data, customer = _valid(pick, types, data_of, pool)
        key, value, headers = made.key, made.value, made.headers
        done: list[str] = []
        last_payload: str | None = None  # each payload mutation starts again from ``data``
        for _ in range(pick.integer(1, 3)):
            part = choice(pick, ("payload", "payload", "payload", "headers", "key", "subject"))
            if part == "payload":
                value, what = mutate_payload(pick, data)
                last_payload = what
            elif part == "headers":
                headers, what = mutate_headers(pick, headers)
            elif part == "key":
                key, what = mutate_key(pick, made.key or b"", customer, pool)
            else:
                others = [c for c in pool if c != customer] or [f"{customer}-other"]
                other = choice(pick, others)
                headers = [(n, other.encode() if n == "ce_subject" else v) for n, v in headers]
                what = "ce_subject other customer"
            done.append(what)
        return FuzzRecord(
            key,
            value,
            headers,
            f"mutated {made.made_by[6:]}: {'; '.join(done)}",
            _must_refuse(last_payload, value),
        )
    customer = choice(pick, pool)
    event_type = choice(pick, types)
    headers = headers_for(f"fz-{_uuid(pick)}", event_type, customer, "2025-03-02T00:00:00Z")
    if kind == 7:
        names = ("ce_type", "ce_id", "ce_subject", "x", "content-type")
        return FuzzRecord(
            pick.binary(64) if flip(pick) else None,
            pick.binary(512) if flip(pick) else None,
            [(choice(pick, names), pick.binary(32)) for _ in range(pick.integer(0, 4))],
            "bytes",
            "random bytes",  # never carries ce_specversion or ce_source
        )
    if kind == 8:
        return FuzzRecord(
            customer.encode(), _dumps(_any_json(pick, 3)), headers, f"json {event_type}"
        )
    depth = choice(pick, (999, 5_000, 100_000))
    shape = choice(pick, ("list", "object"))
    return FuzzRecord(
        customer.encode(),
        _deep(depth, shape).encode(),
        headers,
        f"deep {shape} {depth}",
        "deep JSON",
    )


#: Value mutations (:func:`mutate_payload`) whose result no contract accepts.
_REFUSED_EDITS = {
    "truncate": "truncated JSON",
    "invalid_utf8": "invalid UTF-8",
    "nul": "NUL byte",
    "deep": "deep JSON",
}


def _must_refuse(last_payload: str | None, value: bytes | None) -> str | None:
    """Why a mutated record must be refused, from the mutation that made its value (the
    last payload mutation: each one starts from the valid data again)."""
    if last_payload is None:
        return None
    edit = last_payload.split(" ", 1)[0]
    if edit in _REFUSED_EDITS:
        return _REFUSED_EDITS[edit]
    if last_payload == "exponent amount":
        return "float amount"
    if last_payload == "bigint amount":  # over 4,300 digits: no JSON reader makes it a number
        return "amount as a huge JSON integer"
    if last_payload in ("replace amount", "add amount") and value is not None:
        try:
            amount = json.loads(value).get("amount")
        except ValueError:
            return None
        # A float or a boolean: money is a decimal string on the wire. (A JSON integer is
        # accepted by the models, see streams.core.domain.money.parse_decimal.)
        if isinstance(amount, bool | float):
            return "float amount"
    return None


def _any_json(pick: Picker, depth: int) -> Any:
    kind = pick.integer(0, 6 if depth > 0 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return flip(pick)
    if kind == 2:
        return pick.integer(-(10**12), 10**12)
    if kind == 3:
        return pick.integer(-1000, 1000) / 7
    if kind == 4:
        return text(pick, _PRINTABLE + _HOSTILE_CHARS, 10)
    if kind == 5:
        return [_any_json(pick, depth - 1) for _ in range(pick.integer(0, 4))]
    return {text(pick, _ID_CHARS, 6): _any_json(pick, depth - 1) for _ in range(pick.integer(0, 4))}


def account_record(pick: Picker, pool: Sequence[str] = VICTIMS) -> FuzzRecord:
    """A record for ``billing.account-events.v1`` (see the module docstring)."""
    return record(pick, ACCOUNT_TYPES, account_data, pool)


def invoice_record(pick: Picker, pool: Sequence[str] = VICTIMS) -> FuzzRecord:
    """A record for ``billing.invoices.v1`` (see the module docstring)."""
    return record(pick, INVOICE_TYPES, invoice_data, pool)


def generate(
    seed: int, n: int, make: Callable[[Picker], FuzzRecord] = account_record
) -> list[FuzzRecord]:
    """``n`` records made by ``make`` from ``random.Random(seed)``: the same list for
    the same seed and code."""
    pick = RandomPicker(random.Random(seed))
    return [make(pick) for _ in range(n)]
