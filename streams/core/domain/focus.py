"""FOCUS 1.0 cost-and-usage CSV rows → ``usage.recorded`` + ``customer.upserted`` (pure).

FOCUS (FinOps Open Cost and Usage Specification) 1.0 writes one row per charge.
This module only maps text to events; reading the file and producing to Kafka
are the importer's job. Open files with ``newline=""`` (the :mod:`csv` rule) so
quoted fields that contain line breaks stay intact.

Column mapping (one row → one :class:`~streams.core.domain.events.UsageRecorded`):

=============================  ==========================================================
event field                    FOCUS column
=============================  ==========================================================
event id (``ce_id``)           ``Id`` (so a re-import of the file deduplicates)
``customer_id``                ``SubAccountId``
``billing_period``             UTC month of ``BillingPeriodStart``
``amount``                     ``BilledCost``, exact ``Decimal`` (all decimals kept)
``currency``                   ``BillingCurrency`` (must be one we bill in)
``quantity`` / ``unit``        ``PricingQuantity`` / ``PricingUnit``
``consumed_quantity/_unit``    ``ConsumedQuantity`` / ``ConsumedUnit``
``sku_id``                     ``SkuId``
``description``                ``ChargeDescription``
``region_id``                  ``RegionId``
``charge_category``            ``ChargeCategory`` (Usage, Credit, Adjustment, …)
``event_time``                 ``ChargePeriodStart`` (UTC)
``provider``                   ``ProviderName``
=============================  ==========================================================

and one :class:`~streams.core.domain.events.CustomerUpserted` per row:
``customer_id`` = ``SubAccountId``, ``name`` = ``SubAccountName``, ``currency`` =
``BillingCurrency``, ``billing_account_id`` = ``BillingAccountId``. Its event id
is ``deterministic_id("customer.upserted", customer_id, name, email, currency)``,
so the 225 rows of one account give one distinct event, and re-imports dedupe.

Decisions:

* **Missing values.** FOCUS writes a missing value as the unquoted literal
  ``NULL``. :mod:`csv` cannot tell ``NULL`` from ``"NULL"``, so the exact text
  ``NULL`` is missing in every column; so is the empty string.
* **Required values**: ``Id``, ``SubAccountId``, ``BillingPeriodStart``,
  ``BilledCost``, ``BillingCurrency``, ``ChargePeriodStart``. A row missing one
  is a :class:`FocusRowError`. The other mapped columns are optional (``None``
  when missing, also when the header lacks the column).
* **Customer name.** ``SubAccountName`` is required by the header but may be
  missing in a row: the name is then the ``SubAccountId`` (an invoice needs a
  name, and the id is what the provider shows); the row is not an error.
* **Email.** FOCUS has no email address. Every account gets a deterministic
  placeholder under the RFC 2606 reserved TLD ``.invalid``, so nothing is ever
  really delivered: ``billing+<SubAccountId>@customers.invalid`` when the id is
  a plain dot-atom (letters, digits, ``.``, ``_``, ``-``) and the local part fits
  RFC 5321's 64 characters; otherwise (Azure ``/subscriptions/<uuid>``, 79-char
  Oracle OCIDs) ``billing+h<first 24 hex of sha256(SubAccountId)>@customers.invalid``.
* **Times** are ``YYYY-MM-DD HH:MM:SS`` (the sample) or ISO 8601; without an
  offset they are UTC (FOCUS 1.0 requires UTC), with one they are converted.
* **Line numbers** are physical lines of the file, header = line 1; a row is
  reported at the line it *starts* on, also when a quoted field spans lines.

Errors: a bad row (missing required value, bad decimal or date, wrong column
count, malformed quoting, unknown currency, invalid customer id) yields a :class:`FocusRowError`
naming the column and value, and iteration continues. A missing header or
missing required columns raise :class:`~streams.core.domain.errors.FocusFormatError`
(permanent).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, NamedTuple, TextIO

from pydantic import ValidationError

from streams.core.domain.errors import DomainError, FocusFormatError
from streams.core.domain.events import (
    CURRENCY_PATTERN,
    CustomerUpserted,
    UsageRecorded,
    deterministic_id,
)
from streams.core.domain.fastcodec import usage_numbers_ok, usage_values_ok
from streams.core.domain.money import MINOR_UNITS
from streams.core.domain.periods import BillingPeriod

__all__ = [
    "OPTIONAL_COLUMNS",
    "REQUIRED_COLUMNS",
    "FocusFormatError",
    "FocusRowError",
    "FocusRowResult",
    "FocusUsage",
    "UsageFields",
    "iter_focus_rows",
    "placeholder_email",
    "read_focus_header",
]

#: Columns the header must have. ``SubAccountName`` may still be NULL in a row.
REQUIRED_COLUMNS: tuple[str, ...] = (
    "Id",
    "SubAccountId",
    "SubAccountName",
    "BillingPeriodStart",
    "BilledCost",
    "BillingCurrency",
    "ChargePeriodStart",
)

#: Mapped columns that may be absent from the header or missing in a row.
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "PricingQuantity",
    "PricingUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "SkuId",
    "ChargeDescription",
    "RegionId",
    "ChargeCategory",
    "ProviderName",
    "BillingAccountId",
)

#: The missing-value marker of FOCUS files.
NULL = "NULL"

#: Domain of the placeholder addresses (RFC 2606: ``.invalid`` never resolves).
PLACEHOLDER_DOMAIN = "customers.invalid"

_DECIMAL = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")
_DOT_ATOM = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")

if TYPE_CHECKING:
    from _csv import Reader as _Reader


class UsageFields(NamedTuple):
    """The data of a row's ``usage.recorded``, already validated by the rules of
    :class:`~streams.core.domain.events.UsageRecorded` (see :class:`_RowMapper`), in the
    model's field order (``schema_version`` aside): what the importer encodes
    without building the model (a test checks the names and order against the model)."""

    customer_id: str
    billing_period: str
    amount: Decimal
    currency: str
    quantity: Decimal | None
    unit: str | None
    consumed_quantity: Decimal | None
    consumed_unit: str | None
    sku_id: str | None
    description: str | None
    region_id: str | None
    charge_category: str | None
    event_time: datetime
    provider: str | None


@dataclass(frozen=True)
class FocusUsage:
    """A row that mapped: its usage event's data, its account's customer event, and the
    CloudEvents ``id`` / ``time`` to send the usage with (``Id``, ``ChargePeriodStart``).

    ``fields`` is the validated data as a tuple; :attr:`usage` builds the
    :class:`UsageRecorded` model from it on first use (validated again, so it is the
    model the rules give; the importer's hot path never asks for it)."""

    line_number: int
    fields: UsageFields
    customer: CustomerUpserted
    event_id: str
    event_time: datetime

    @functools.cached_property
    def usage(self) -> UsageRecorded:
        """The ``usage.recorded`` data as its model."""
        return UsageRecorded(**self.fields._asdict())

    @property
    def customer_event_id(self) -> str:
        """Deterministic id of :attr:`customer`'s ``customer.upserted`` event."""
        return customer_event_id(self.customer)


@dataclass(frozen=True)
class FocusRowError:
    """A row that did not map: where (physical line), why (column and value), and
    its ``Id`` when it had one (for the import report)."""

    line_number: int
    reason: str
    raw_id: str | None


FocusRowResult = FocusUsage | FocusRowError


class _RowProblem(DomainError):
    """A value of one row that cannot be mapped (internal; becomes a FocusRowError)."""


def customer_event_id(customer: CustomerUpserted) -> str:
    """``deterministic_id("customer.upserted", customer_id, name, email, currency)``."""
    return deterministic_id(
        "customer.upserted", customer.customer_id, customer.name, customer.email, customer.currency
    )


def placeholder_email(sub_account_id: str) -> str:
    """The deterministic, undeliverable address of a FOCUS account (see module doc).

    >>> placeholder_email("51738928782")
    'billing+51738928782@customers.invalid'
    """
    local = f"billing+{sub_account_id}"
    if _DOT_ATOM.match(sub_account_id) and len(local) <= 64:
        return f"{local}@{PLACEHOLDER_DOMAIN}"
    digest = hashlib.sha256(sub_account_id.encode("utf-8")).hexdigest()[:24]
    return f"billing+h{digest}@{PLACEHOLDER_DOMAIN}"


def iter_focus_rows(
    lines: Iterable[str] | TextIO,
    *,
    header: list[str] | None = None,
    lines_before: int = 0,
    stop: Callable[[], bool] | None = None,
) -> Iterator[FocusRowResult]:
    """Map each data row of a FOCUS 1.0 CSV, in file order.

    The header is read and checked at call time; rows are mapped lazily.

    Args:
        lines: the file's text lines, e.g. a file opened with ``newline=""`` or
            ``text.splitlines(keepends=True)``.
        header: the file's header, when ``lines`` start after it (a part of a file:
            the FOCUS import's readers, docs/decisions/0101-focus-import-reads-in-a-second-process.md).
        lines_before: the physical lines of the file before ``lines`` (with ``header``),
            so that line numbers stay the file's.
        stop: asked after each record (blank ones too); True ends the iteration there.

    Returns:
        An iterator of :class:`FocusUsage` or :class:`FocusRowError`, one per
        data row; blank lines are skipped.

    Raises:
        FocusFormatError: the input is empty, the header line is malformed CSV,
            a header column is repeated, or required columns are missing
            (``.missing`` names them). Malformed quoting in a later record is a
            :class:`FocusRowError` for that record (an unterminated quote takes
            the rest of the file with it, and the error says which lines).
    """
    reader = csv.reader(lines, strict=True)
    if header is None:
        header = read_focus_header(reader)
    index = _index_header(header)
    return _rows(reader, index, len(header), lines_before, stop)


def read_focus_header(reader: _Reader) -> list[str]:
    """The next record of ``reader`` (a ``csv.reader(..., strict=True)``) as a header,
    a leading byte order mark removed (its columns are checked by :func:`iter_focus_rows`).

    Raises:
        FocusFormatError: no record, or a malformed one.
    """
    try:
        header = next(reader)
    except StopIteration:
        raise FocusFormatError("empty FOCUS file: no header line") from None
    except csv.Error as exc:
        raise FocusFormatError(f"unreadable FOCUS header: {exc}") from exc
    if header:
        header[0] = header[0].removeprefix("\ufeff")  # a UTF-8 byte order mark
    return header


def _rows(
    reader: _Reader,
    index: dict[str, int],
    width: int,
    lines_before: int = 0,
    stop: Callable[[], bool] | None = None,
) -> Iterator[FocusRowResult]:
    mapper = _RowMapper(index, width)
    previous_end = lines_before + reader.line_num
    while True:
        if stop is not None and stop():
            return
        start = previous_end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            # strict mode: bad quoting ends this record only; the reader goes on at
            # the next line. An unterminated quote runs to the end of the file.
            previous_end = lines_before + reader.line_num
            yield FocusRowError(
                start, f"malformed CSV record (lines {start}-{previous_end}): {exc}", None
            )
            continue
        previous_end = lines_before + reader.line_num
        if row:
            yield mapper.map(row, start)


def _index_header(header: list[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    repeated: list[str] = []
    for position, name in enumerate(header):
        if name in index:
            repeated.append(name)
        index.setdefault(name, position)
    if repeated:
        raise FocusFormatError(f"FOCUS header repeats column(s): {', '.join(repeated)}")
    missing = tuple(name for name in REQUIRED_COLUMNS if name not in index)
    if missing:
        raise FocusFormatError(
            f"FOCUS header lacks required column(s): {', '.join(missing)}", missing=missing
        )
    return index


#: Entries per memo of :class:`_RowMapper` before it starts again (bounds its memory).
_MEMO_SIZE = 4096

#: Currencies we bill in that also match the model's currency pattern (all of them).
_WIRE_CURRENCIES = frozenset(c for c in MINOR_UNITS if re.fullmatch(CURRENCY_PATTERN, c))


class _RowMapper:
    """Maps the rows of one file (header ``index``, ``width`` columns) to results.

    The same rules as written in the module docstring, row by row; what repeats
    from row to row is computed once per distinct text and remembered (bounded
    memos of successes only, so a bad value is reported on every row that has it):
    the parsed date-times (charge periods are hourly, the billing period one
    month), the billing period of a ``BillingPeriodStart``, and the
    :class:`CustomerUpserted` of an account's (id, name, currency, billing
    account). Column positions are looked up once per file.

    The row's usage data is a :class:`UsageFields` tuple, validated by the :class:`UsageRecorded`
    model on every row (the contract's bounds reach every text and decimal field: control
    characters, lengths, digits), so a row is refused, with the model's own message, exactly when
    building the model from it would fail (``tests/unit/test_focus_import_encoding.py`` checks this
    against the models). What the import saves (docs/decisions/0081-focus-import.md) is the envelope
    and the encoding: :class:`~streams.apps.importers.focus_reader.UsageEncoder` writes the record
    without a second model. An earlier version validated only the first row of each customer id; it
    let through later rows that the bounds refuse. The texts' part of those rules is remembered per
    distinct value (:meth:`_values_ok`): a row whose texts were all seen is checked only for its
    numbers and time, which gives the same answer.
    """

    def __init__(self, index: dict[str, int], width: int) -> None:
        self.width = width
        self.id_position = index["Id"]
        self.customer_at = index["SubAccountId"]
        self.name_at = index["SubAccountName"]
        self.period_start_at = index["BillingPeriodStart"]
        self.cost_at = index["BilledCost"]
        self.currency_at = index["BillingCurrency"]
        self.charge_start_at = index["ChargePeriodStart"]
        self.times: dict[str, datetime] = {}
        self.periods: dict[datetime, str] = {}
        self.customers: dict[tuple[str, str, str, str | None], CustomerUpserted] = {}
        self.accounts_ok: set[tuple[str | None, ...]] = set()
        self.texts_ok: set[tuple[str | None, ...]] = set()
        get = index.get
        self.optional = tuple(get(column) for column in OPTIONAL_COLUMNS)

    def map(self, row: list[str], line_number: int) -> FocusRowResult:
        id_at = self.id_position
        raw = row[id_at] if id_at < len(row) else None
        raw_id = None if raw in (None, NULL, "") else raw
        if len(row) != self.width:
            return FocusRowError(
                line_number, f"row has {len(row)} fields, the header has {self.width}", raw_id
            )
        try:
            event_id = _required_at(row, id_at, "Id")
            customer_id = _required_at(row, self.customer_at, "SubAccountId")
            name = _text_at(row, self.name_at) or customer_id
            period_start = self._time(row, self.period_start_at, "BillingPeriodStart")
            amount = _parse_decimal("BilledCost", _required_at(row, self.cost_at, "BilledCost"))
            currency = _required_at(row, self.currency_at, "BillingCurrency")
            if currency not in MINOR_UNITS:
                raise _RowProblem(f"BillingCurrency {currency!r} is not a currency we bill in")
            event_time = self._time(row, self.charge_start_at, "ChargePeriodStart")
            (
                quantity_at,
                unit_at,
                consumed_at,
                consumed_unit_at,
                sku_at,
                description_at,
                region_at,
                category_at,
                provider_at,
                account_at,
            ) = self.optional
            fields = UsageFields(
                customer_id,
                self._period_of(period_start),
                amount,
                currency,
                _optional_decimal_at(row, quantity_at, "PricingQuantity"),
                _text_at(row, unit_at),
                _optional_decimal_at(row, consumed_at, "ConsumedQuantity"),
                _text_at(row, consumed_unit_at),
                _text_at(row, sku_at),
                _text_at(row, description_at),
                _text_at(row, region_at),
                _text_at(row, category_at),
                event_time,
                _text_at(row, provider_at),
            )
            # The model's rules (and its error, should they fail) on every row: the
            # contract's bounds constrain every text and decimal field. The texts'
            # half is asked once per distinct set of texts; see the class docstring.
            if not self._values_ok(fields):  # else the model says what is wrong
                UsageRecorded(**fields._asdict())
            customer = self._customer(customer_id, name, currency, _text_at(row, account_at))
        except _RowProblem as exc:
            return FocusRowError(line_number, str(exc), raw_id)
        except ValidationError as exc:
            return FocusRowError(line_number, _summarise(exc), raw_id)
        except DomainError as exc:  # InvalidPeriod from a year out of range
            return FocusRowError(line_number, str(exc), raw_id)
        return FocusUsage(line_number, fields, customer, event_id, event_time)

    def _values_ok(self, fields: UsageFields) -> bool:
        """``usage_values_ok(*fields)``: its answer is the conjunction of a check of the
        account's texts, of the six other texts and of the numbers; the first two are
        remembered once true (per distinct value), so a row whose texts were seen is asked
        only for its numbers."""
        f = fields
        account = (f.customer_id, f.billing_period, f.currency, f.provider)
        texts = (f.unit, *f[7:12])
        if account in self.accounts_ok and texts in self.texts_ok:
            return usage_numbers_ok(f.amount, f.quantity, f.consumed_quantity, f.event_time)
        if not usage_values_ok(*fields):
            return False
        for memo, key in ((self.accounts_ok, account), (self.texts_ok, texts)):
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            memo.add(key)
        return True

    def _time(self, row: list[str], position: int, column: str) -> datetime:
        text = _required_at(row, position, column)
        found = self.times.get(text)
        if found is None:
            found = _parse_time(column, text)
            if len(self.times) >= _MEMO_SIZE:
                self.times.clear()
            self.times[text] = found
        return found

    def _period_of(self, start: datetime) -> str:
        found = self.periods.get(start)
        if found is None:
            found = str(BillingPeriod.of(start))
            if len(self.periods) >= _MEMO_SIZE:
                self.periods.clear()
            self.periods[start] = found
        return found

    def _customer(
        self, customer_id: str, name: str, currency: str, billing_account_id: str | None
    ) -> CustomerUpserted:
        key = (customer_id, name, currency, billing_account_id)
        found = self.customers.get(key)
        if found is None:
            found = CustomerUpserted(
                customer_id=customer_id,
                name=name,
                email=placeholder_email(customer_id),
                currency=currency,
                billing_account_id=billing_account_id,
            )
            if len(self.customers) >= _MEMO_SIZE:
                self.customers.clear()
            self.customers[key] = found
        return found


def _text_at(row: list[str], position: int | None) -> str | None:
    """The value at ``position`` (``None``: the header lacks the column), NULL/"" → None."""
    if position is None:
        return None
    text = row[position]
    return None if text == NULL or not text else text


def _required_at(row: list[str], position: int, column: str) -> str:
    text = row[position]
    if text == NULL or not text:
        raise _RowProblem(f"{column} is missing (value {text!r})")
    return text


def _optional_decimal_at(row: list[str], position: int | None, column: str) -> Decimal | None:
    text = _text_at(row, position)
    return None if text is None else _parse_decimal(column, text)


def _parse_decimal(column: str, text: str) -> Decimal:
    # Decimal() alone would take "1_000", " 1" and "NaN"; FOCUS decimals are plain.
    if not _DECIMAL.match(text):
        raise _RowProblem(f"{column} {text!r} is not a decimal number")
    try:
        return Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid text
        raise _RowProblem(f"{column} {text!r} is not a decimal number") from None


def _parse_time(column: str, text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise _RowProblem(
            f"{column} {text!r} is not a date-time (YYYY-MM-DD HH:MM:SS, UTC)"
        ) from None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01 00:00:00+01:00: before year 1 in UTC
        raise _RowProblem(f"{column} {text!r} is out of range in UTC") from None


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(root)"
        parts.append(f"{_COLUMN_OF.get(loc, loc)} {err.get('input')!r}: {err.get('msg')}")
    return "; ".join(parts)


#: Event field → FOCUS column, to name the column in a validation error.
_COLUMN_OF: dict[str, str] = {
    "customer_id": "SubAccountId",
    "name": "SubAccountName",
    "email": "SubAccountId (placeholder email)",
    "currency": "BillingCurrency",
    "amount": "BilledCost",
    "billing_period": "BillingPeriodStart",
    "event_time": "ChargePeriodStart",
    "quantity": "PricingQuantity",
    "unit": "PricingUnit",
    "consumed_quantity": "ConsumedQuantity",
    "consumed_unit": "ConsumedUnit",
    "sku_id": "SkuId",
    "description": "ChargeDescription",
    "region_id": "RegionId",
    "charge_category": "ChargeCategory",
    "provider": "ProviderName",
    "billing_account_id": "BillingAccountId",
}
