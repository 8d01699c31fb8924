"""The price book: billable metrics, and plans with immutable, effective-dated versions.

Shape (YAML, see ``examples/pricing/price-book.yaml`` and the JSON Schema
``schemas/price-book/price-book.schema.json`` generated from these models)::

    schema_version: 1
    metrics:                      # billable metrics: how one period's events become a quantity
      - code: api_calls
        aggregation: count        # count | sum | max | unique_count | latest
        property: ...             # required for sum/max/latest (a decimal of ``values``)
                                  # and unique_count (a text of ``properties``); not for count
        filter: {region: [eu, us]}   # optional: only events whose text property is listed
        group_by: region          # optional: one invoice line per value of this text property
    plans:
      - code: growth
        versions:                 # immutable; numbers strictly increasing
          - version: 1
            effective_from: 2024-01-01
            currency: USD
            charges:              # each with a ``code`` unique in the version and a ``model``
              - {code: platform, model: fixed, amount: 49}
              - {code: api, model: graduated, metric: api_calls, tiers: [...]}

Charge models (what each computes: :mod:`streams.domain.rating.pricing`):

==================  ==========================================================
``fixed``           ``amount`` per period, prorated by day for a partial period
``per_unit``        quantity * ``unit_price``
``graduated``       each tier's units at its ``unit_price`` + its ``flat_amount``
                    when any unit falls in it (Stripe ``graduated``)
``volume``          all units at the price of the tier the quantity falls in, + that
                    tier's ``flat_amount`` (Stripe ``volume``)
``package``         ``price`` per started package of ``package_size`` units, after
                    ``free_units`` (Lago "package")
``minimum``         minimum commitment per period: a true-up line when the plan's
                    charges fall short (Lago "minimum commitment"), prorated by day
``pass_through``    pre-priced ``usage.recorded`` lines, * (1 + ``markup_percent`` / 100)
==================  ==========================================================

Tier bounds follow Stripe: ``up_to`` is inclusive ("up to and including"), the
next tier starts just above it, and the last tier is open (``up_to: null``, or
``inf``); bounds must increase. A quantity is split exactly, also a fractional one.

Money and quantities are exact ``Decimal``: in YAML write them as numbers or
strings (the loader reads a YAML number's *text*, never a float); prices,
amounts and percentages take at most :data:`PRICE_DECIMALS` (12) decimal places,
as Stripe's ``unit_amount_decimal``. Money is in the plan version's ``currency``.

Validation reports **every** error with its path in the document
(``plans[1].versions[0].charges[2].tiers[3].up_to: must be greater than 1000``)
and, from YAML, its line: :func:`load_price_book`, :class:`PriceBookError`.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Mapping, Sequence
from datetime import date
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from streams.domain.events import CODE_PATTERN, PROPERTY_NAME_PATTERN, Code, PropertyName
from streams.domain.money import MINOR_UNITS, InvalidAmount, canonical_decimal, parse_decimal
from streams.domain.rating.errors import PriceBookError, PriceBookIssue

#: Most decimal places of a price, amount or percentage (Stripe ``unit_amount_decimal``).
PRICE_DECIMALS = 12

#: Most nodes a YAML document may expand to (aliases included): a guard against
#: "billion laughs" documents, far above any real price book.
MAX_NODES = 100_000


# --------------------------------------------------------------------------- value types


def _decimal(value: Any, what: str) -> Decimal:
    try:
        return parse_decimal(value, what=what)
    except InvalidAmount as exc:
        raise PydanticCustomError("decimal", str(exc)) from None


def _places(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0


def _price(value: Any) -> Decimal:
    result = _decimal(value, "price")
    if result < 0:
        raise PydanticCustomError("price", "must not be negative")
    if _places(canonical_decimal(result)) > PRICE_DECIMALS:
        raise PydanticCustomError(
            "price", "at most {places} decimal places", {"places": PRICE_DECIMALS}
        )
    return result


def _percent(value: Any) -> Decimal:
    result = _decimal(value, "percentage")
    if result < -100:
        raise PydanticCustomError("percent", "must be at least -100 (a 100 % discount)")
    if _places(canonical_decimal(result)) > PRICE_DECIMALS:
        raise PydanticCustomError(
            "percent", "at most {places} decimal places", {"places": PRICE_DECIMALS}
        )
    return result


def _positive(value: Any) -> Decimal:
    result = _decimal(value, "quantity")
    if result <= 0:
        raise PydanticCustomError("positive", "must be greater than 0")
    return result


def _non_negative(value: Any) -> Decimal:
    result = _decimal(value, "quantity")
    if result < 0:
        raise PydanticCustomError("non_negative", "must not be negative")
    return result


_OPEN = frozenset({"inf", "+inf", "infinity", "+infinity", ".inf", "+.inf"})


def _bound(value: Any) -> Decimal | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _OPEN):
        return None
    return _positive(value)


def _number_schema(pattern: str, description: str, minimum: int | None) -> dict[str, Any]:
    number: dict[str, Any] = {"type": "number"}
    if minimum is not None:
        number["minimum"] = minimum
    return {
        "anyOf": [{"type": "string", "pattern": pattern}, number],
        "description": description,
    }


_INT: TypeAdapter[int] = TypeAdapter(int)
_DATE: TypeAdapter[date] = TypeAdapter(date)

_AS_STRING = PlainSerializer(lambda d: format(d, "f"), return_type=str, when_used="json")

#: A price or money amount: exact, >= 0, at most 12 decimal places.
Price = Annotated[
    Decimal,
    BeforeValidator(_price),
    _AS_STRING,
    WithJsonSchema(
        _number_schema(
            r"^[0-9]+(\.[0-9]{1,12})?$",
            "Exact decimal >= 0 with at most 12 decimal places: a YAML number (read as "
            "its text, never as a float) or a decimal string.",
            0,
        )
    ),
]
#: A percentage, >= -100 (a discount) with at most 12 decimal places.
Percent = Annotated[
    Decimal,
    BeforeValidator(_percent),
    _AS_STRING,
    WithJsonSchema(
        _number_schema(
            r"^-?[0-9]+(\.[0-9]{1,12})?$",
            "Percentage, exact, >= -100 (negative: a discount), at most 12 decimal places.",
            -100,
        )
    ),
]
_QUANTITY_DOC = "Exact decimal quantity: a YAML number or a decimal string."
PositiveQuantity = Annotated[
    Decimal,
    BeforeValidator(_positive),
    _AS_STRING,
    WithJsonSchema(_number_schema(r"^[0-9]+(\.[0-9]+)?$", _QUANTITY_DOC + " > 0.", 0)),
]
NonNegativeQuantity = Annotated[
    Decimal,
    BeforeValidator(_non_negative),
    _AS_STRING,
    WithJsonSchema(_number_schema(r"^[0-9]+(\.[0-9]+)?$", _QUANTITY_DOC + " >= 0.", 0)),
]
#: A tier's inclusive upper bound; ``None`` (``null``, ``inf``) = open.
TierBound = Annotated[
    Decimal | None,
    BeforeValidator(_bound),
    PlainSerializer(
        lambda d: None if d is None else format(d, "f"), return_type=str | None, when_used="json"
    ),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?|inf)$"},
                {"type": "number", "exclusiveMinimum": 0},
                {"type": "null"},
            ],
            "description": "Inclusive upper bound of the tier (Stripe up_to); null or inf: "
            "open, only for the last tier. Bounds increase.",
        }
    ),
]


def _known_currency(value: str) -> str:
    if value not in MINOR_UNITS:
        known = ", ".join(sorted(MINOR_UNITS))
        raise PydanticCustomError(
            "currency", f"unknown or unsupported currency {value!r} (known: {known})"
        )
    return value


BookCurrency = Annotated[
    str,
    Field(pattern=r"^[A-Z]{3}$"),
    AfterValidator(_known_currency),
    WithJsonSchema({"type": "string", "enum": sorted(MINOR_UNITS)}),
]
Name = Annotated[str, Field(min_length=1, max_length=200)]


def _raise(issues: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
    """Raise the issues as one ValidationError with their nested locations (pydantic
    prefixes them with the location of the value being validated)."""
    if issues:
        raise ValidationError.from_exception_data(
            "price book",
            [
                InitErrorDetails(
                    type=PydanticCustomError("price_book", message), loc=loc, input=None
                )
                for loc, message in issues
            ],
        )


Issues = list[tuple[tuple[str | int, ...], str]]


def _checked(data: Any, handler: Any, check: Any) -> Any:
    """Run the structural validation (``handler``) and ``check`` (rules across
    items, on the *raw* input, best effort) and report the errors of **both**: an
    item with a bad price does not hide a tier bound out of order next to it."""
    issues: Issues = check(data)
    try:
        result = handler(data)
    except ValidationError as exc:
        details = [
            InitErrorDetails(
                type=PydanticCustomError(str(error["type"]), str(error["msg"])),
                loc=tuple(error["loc"]),
                input=error.get("input"),
            )
            for error in exc.errors()
        ]
        details.extend(
            InitErrorDetails(type=PydanticCustomError("price_book", message), loc=loc, input=None)
            for loc, message in issues
        )
        raise ValidationError.from_exception_data("price book", details) from None
    _raise(issues)
    return result


_NOT_PARSED = object()


def _parse(parser: Any, value: Any) -> Any:
    try:
        return parser(value)
    except (ValueError, TypeError, ArithmeticError, PydanticCustomError, ValidationError):
        return _NOT_PARSED


def _field(item: Any, name: str) -> Any:
    return item.get(name, _NOT_PARSED) if isinstance(item, Mapping) else _NOT_PARSED


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --------------------------------------------------------------------------- metrics


class Aggregation(StrEnum):
    """How a billable metric turns one period's events into a quantity.

    * ``count`` — the number of events;
    * ``sum`` — the sum of a decimal value;
    * ``max`` — its largest value;
    * ``unique_count`` — the number of distinct values of a text property;
    * ``latest`` — the decimal value of the latest event (by event time, then
      event id).

    No events give a quantity of 0 under every aggregation.
    """

    COUNT = "count"
    SUM = "sum"
    MAX = "max"
    UNIQUE_COUNT = "unique_count"
    LATEST = "latest"


#: The aggregations that read a decimal of the event's ``values``.
DECIMAL_AGGREGATIONS = frozenset({Aggregation.SUM, Aggregation.MAX, Aggregation.LATEST})


class BillableMetric(_Model):
    """A billable metric: which events (``usage.metered`` whose ``metric`` is
    ``code``, optionally filtered) aggregate into what quantity, per group value.

    ``filter`` keeps an event when, for **every** listed text property, its value
    is **one of** the listed values; other events of the metric are excluded (and
    counted as such). ``group_by`` names a text property: one quantity (and one
    invoice line) per value; an event without it goes to the group ``None``.
    """

    code: Code
    name: Name | None = None
    #: Unit shown on invoice lines (``calls``, ``GB``).
    unit: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    aggregation: Aggregation
    #: The value aggregated: a ``values`` decimal for sum/max/latest, a
    #: ``properties`` text for unique_count; none for count.
    property: PropertyName | None = None
    filter: dict[PropertyName, Annotated[tuple[str, ...], Field(min_length=1)]] = Field(
        default_factory=dict
    )
    group_by: PropertyName | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _property_fits_the_aggregation(cls, data: Any, handler: Any) -> Any:
        return _checked(data, handler, _metric_issues)

    @builtins.property  # the field "property" shadows the builtin in this class body
    def label(self) -> str:
        """What invoice lines call the metric: its name, else its code."""
        return self.name or self.code

    def reads_decimal(self) -> bool:
        """Whether the aggregation reads a decimal of ``values`` (else text or nothing)."""
        return self.aggregation in DECIMAL_AGGREGATIONS


def _metric_issues(data: Any) -> Issues:
    aggregation = _field(data, "aggregation")
    if aggregation not in {a.value for a in Aggregation}:
        return []
    has_property = _field(data, "property") not in (None, _NOT_PARSED)
    if aggregation == Aggregation.COUNT and has_property:
        return [(("property",), "count takes no property")]
    if aggregation != Aggregation.COUNT and not has_property:
        return [(("property",), f"required for aggregation {aggregation}")]
    return []


# --------------------------------------------------------------------------- charges


class Tier(_Model):
    """One tier: units up to and including ``up_to`` (``None`` = open, last tier)."""

    #: Required, also for the open last tier (``null``): a forgotten bound is an
    #: error, not an open tier.
    up_to: TierBound
    unit_price: Price = Decimal(0)
    flat_amount: Price = Decimal(0)


def _tier_issues(tiers: Any) -> Issues:
    """Bounds increase; only the last tier is open, and it is."""
    issues: Issues = []
    if not isinstance(tiers, list | tuple):
        return issues
    previous: Decimal | None = None
    last = len(tiers) - 1
    for index, tier in enumerate(tiers):
        raw = _field(tier, "up_to")
        bound = _NOT_PARSED if raw is _NOT_PARSED else _parse(_bound, raw)
        if bound is _NOT_PARSED:
            continue
        if bound is None:
            if index != last:
                issues.append(((index, "up_to"), "only the last tier may be open (up_to: null)"))
            continue
        if index == last:
            issues.append(((index, "up_to"), "the last tier must be open (up_to: null)"))
        if previous is not None and bound <= previous:
            issues.append(((index, "up_to"), f"must be greater than {format(previous, 'f')}"))
        else:
            previous = bound
    return issues


class _ChargeBase(_Model):
    #: Unique within the plan version; part of every line's identity.
    code: Code
    #: Shown on invoice lines (default: the metric's name or the code).
    name: Name | None = None

    model: ClassVar[str]


class FixedFee(_ChargeBase):
    """A recurring fee of ``amount`` per period, prorated by day for a partial one."""

    model: Literal["fixed"]  # type: ignore[misc]
    amount: Price


class _MetricCharge(_ChargeBase):
    #: Code of the billable metric priced.
    metric: Code


class PerUnit(_MetricCharge):
    """Quantity * ``unit_price``."""

    model: Literal["per_unit"]  # type: ignore[misc]
    unit_price: Price


class _Tiered(_MetricCharge):
    tiers: Annotated[tuple[Tier, ...], Field(min_length=1)]

    @field_validator("tiers", mode="wrap")
    @classmethod
    def _bounds_increase_and_the_last_is_open(cls, tiers: Any, handler: Any) -> Any:
        return _checked(tiers, handler, _tier_issues)


class Graduated(_Tiered):
    """Each tier's units at its price, plus its flat amount when any unit falls in it."""

    model: Literal["graduated"]  # type: ignore[misc]


class Volume(_Tiered):
    """All units at the price of the tier the quantity falls in, plus its flat amount."""

    model: Literal["volume"]  # type: ignore[misc]


class Package(_MetricCharge):
    """``price`` per started package of ``package_size`` units, after ``free_units``."""

    model: Literal["package"]  # type: ignore[misc]
    package_size: PositiveQuantity
    price: Price
    free_units: NonNegativeQuantity = Decimal(0)


class MinimumCommitment(_ChargeBase):
    """The plan version's charges of a period come to at least ``amount`` (prorated
    by day for a partial period): a true-up line makes up the difference."""

    model: Literal["minimum"]  # type: ignore[misc]
    amount: Price


class PassThrough(_ChargeBase):
    """Pre-priced ``usage.recorded`` lines, each * (1 + ``markup_percent`` / 100);
    a negative percentage is a discount."""

    model: Literal["pass_through"]  # type: ignore[misc]
    markup_percent: Percent = Decimal(0)


MetricCharge = PerUnit | Graduated | Volume | Package
#: The ``model`` tags of the charges that price a metric.
METRIC_MODELS = frozenset({"per_unit", "graduated", "volume", "package"})
Charge = Annotated[
    FixedFee | PerUnit | Graduated | Volume | Package | MinimumCommitment | PassThrough,
    Field(discriminator="model"),
]


# --------------------------------------------------------------------------- plans


def _charge_issues(version: Any) -> Issues:
    """Charge codes unique; one minimum, one pass_through; one charge per metric."""
    issues: Issues = []
    codes: dict[str, int] = {}
    metrics: dict[str, int] = {}
    singles: dict[str, int] = {}
    charges = _field(version, "charges")
    for index, charge in _items(charges):
        code, model, metric = (_field(charge, name) for name in ("code", "model", "metric"))
        if isinstance(code, str):
            if code in codes:
                issues.append(
                    (
                        ("charges", index, "code"),
                        f"duplicate charge code {code!r} (also charges[{codes[code]}])",
                    )
                )
            codes.setdefault(code, index)
        if model in ("minimum", "pass_through"):
            if model in singles:
                issues.append(
                    (
                        ("charges", index, "model"),
                        f"at most one {model} charge per version (also charges[{singles[model]}])",
                    )
                )
            singles.setdefault(model, index)
        if isinstance(metric, str) and model in METRIC_MODELS:
            if metric in metrics:
                issues.append(
                    (
                        ("charges", index, "metric"),
                        f"metric {metric!r} is already priced by charges[{metrics[metric]}]",
                    )
                )
            metrics.setdefault(metric, index)
    return issues


def _version_issues(versions: Any) -> Issues:
    """Version numbers strictly increase; ``effective_from`` never decreases."""
    issues: Issues = []
    previous: tuple[int, date] | None = None
    for index, version in _items(versions):
        number = _parse(_INT.validate_python, _field(version, "version"))
        start = _parse(_DATE.validate_python, _field(version, "effective_from"))
        if number is _NOT_PARSED or start is _NOT_PARSED:
            continue
        if previous is not None:
            if number <= previous[0]:
                issues.append(((index, "version"), f"must be greater than {previous[0]}"))
            if start < previous[1]:
                issues.append(
                    (
                        (index, "effective_from"),
                        f"must not be before {previous[1].isoformat()} (version {previous[0]})",
                    )
                )
        previous = (number, start)
    return issues


class PlanVersion(_Model):
    """One immutable version of a plan: its currency and charges, in force from
    ``effective_from`` (a UTC day). A subscription names its version; a day of a
    subscription before that date is a gap (a hold), not a price.

    Rules: charge codes unique; at most one ``minimum`` and one ``pass_through``;
    at most one charge per metric (two charges on one metric would bill its
    usage twice).
    """

    version: Annotated[int, Field(ge=1)]
    effective_from: date
    currency: BookCurrency
    charges: tuple[Charge, ...] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _charges_are_distinct(cls, data: Any, handler: Any) -> Any:
        return _checked(data, handler, _charge_issues)

    def charge_for(self, metric: str) -> PerUnit | Graduated | Volume | Package | None:
        """The charge pricing ``metric``, if any."""
        for charge in self.charges:
            if (
                isinstance(charge, PerUnit | Graduated | Volume | Package)
                and charge.metric == metric
            ):
                return charge
        return None

    @property
    def minimum(self) -> MinimumCommitment | None:
        return next((c for c in self.charges if isinstance(c, MinimumCommitment)), None)

    @property
    def pass_through(self) -> PassThrough | None:
        return next((c for c in self.charges if isinstance(c, PassThrough)), None)


class Plan(_Model):
    """A plan: its versions, numbers strictly increasing, ``effective_from`` never
    decreasing. Versions are immutable once published: a change is a new version."""

    code: Code
    name: Name | None = None
    versions: Annotated[tuple[PlanVersion, ...], Field(min_length=1)]

    @field_validator("versions", mode="wrap")
    @classmethod
    def _versions_increase(cls, versions: Any, handler: Any) -> Any:
        return _checked(versions, handler, _version_issues)

    def version(self, number: int) -> PlanVersion | None:
        return next((v for v in self.versions if v.version == number), None)


class PriceBook(_Model):
    """Billable metrics and plans. Codes are unique; every charge's metric is
    defined. An empty book is valid (pure pass-through customers need none).

    Build one from YAML with :func:`load_price_book`, from parsed data with
    :func:`price_book_from_data`; both report every error with its path.
    """

    schema_version: Literal[1] = 1
    metrics: tuple[BillableMetric, ...] = ()
    plans: tuple[Plan, ...] = ()

    @model_validator(mode="wrap")
    @classmethod
    def _references_resolve(cls, data: Any, handler: Any) -> Any:
        return _checked(data, handler, _reference_issues)

    def metric(self, code: str) -> BillableMetric | None:
        return next((m for m in self.metrics if m.code == code), None)

    def plan(self, code: str) -> Plan | None:
        return next((p for p in self.plans if p.code == code), None)

    def plan_version(self, code: str, version: int) -> PlanVersion | None:
        """The version ``version`` of plan ``code``, or ``None`` when either is unknown."""
        plan = self.plan(code)
        return None if plan is None else plan.version(version)

    @property
    def metrics_by_code(self) -> dict[str, BillableMetric]:
        return {m.code: m for m in self.metrics}


def _reference_issues(doc: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """Book-wide rules on a (possibly invalid) document: unique metric and plan
    codes, every charge's metric defined. Best effort on raw data: whatever is
    not shaped as expected is skipped (the structural validation reports it)."""
    issues: list[tuple[tuple[str | int, ...], str]] = []
    if not isinstance(doc, Mapping):
        return issues
    defined: dict[str, int] = {}
    for index, metric in _items(doc.get("metrics")):
        code = metric.get("code") if isinstance(metric, Mapping) else None
        if isinstance(code, str):
            if code in defined:
                issues.append(
                    (
                        ("metrics", index, "code"),
                        f"duplicate metric code {code!r} (also metrics[{defined[code]}])",
                    )
                )
            defined.setdefault(code, index)
    plans: dict[str, int] = {}
    for p_index, plan in _items(doc.get("plans")):
        if not isinstance(plan, Mapping):
            continue
        code = plan.get("code")
        if isinstance(code, str):
            if code in plans:
                issues.append(
                    (
                        ("plans", p_index, "code"),
                        f"duplicate plan code {code!r} (also plans[{plans[code]}])",
                    )
                )
            plans.setdefault(code, p_index)
        for v_index, version in _items(plan.get("versions")):
            if not isinstance(version, Mapping):
                continue
            for c_index, charge in _items(version.get("charges")):
                metric = charge.get("metric") if isinstance(charge, Mapping) else None
                if isinstance(metric, str) and metric not in defined:
                    issues.append(
                        (
                            ("plans", p_index, "versions", v_index, "charges", c_index, "metric"),
                            f"unknown metric {metric!r} (not in metrics)",
                        )
                    )
    return issues


def _items(value: Any) -> Iterator[tuple[int, Any]]:
    if isinstance(value, list | tuple):
        yield from enumerate(value)


# --------------------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """Safe YAML whose numbers with a fraction are read as their exact text
    (``Decimal``), never as a float; ``.inf`` stays the text ``inf``."""


def _exact_number(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    cleaned = text.replace("_", "")
    if cleaned.lower().lstrip("+-") in (".inf", ".nan"):
        return cleaned.lower().replace(".", "")
    try:
        return Decimal(cleaned)
    except ArithmeticError:
        return text


_Loader.add_constructor("tag:yaml.org,2002:float", _exact_number)


def _locate(loc: Sequence[str | int], doc: Any) -> tuple[str | int, ...]:
    """A pydantic error location reduced to the path of the value in ``doc``:
    parts that are not in the document (a union's tag, ``[key]``) are dropped by
    following the document, except a last name (a missing field), which is kept."""
    kept: list[str | int] = []
    node = doc
    for index, part in enumerate(loc):
        in_list = isinstance(part, int) and isinstance(node, list) and 0 <= part < len(node)
        in_mapping = isinstance(part, str) and isinstance(node, Mapping) and part in node
        if in_list or in_mapping:
            kept.append(part)
            node = node[part]
        elif (
            index == len(loc) - 1
            and isinstance(part, str)
            and part != "[key]"
            and isinstance(node, Mapping)
        ):
            kept.append(part)
    return tuple(kept)


def render_path(path: Sequence[str | int]) -> str:
    """``("plans", 1, "versions", 0, "code")`` → ``plans[1].versions[0].code``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part and all(ch.isalnum() or ch in "_-" for ch in part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def _message(error: Mapping[str, Any]) -> str:
    message = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if error.get("type") == "missing":
        return "required"
    if error.get("type") == "extra_forbidden":
        return "unknown field"
    return message


class _Lines:
    """Positions (line, column; 1-based line) of a composed YAML document by path,
    and its duplicate keys."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.marks: dict[tuple[str | int, ...], tuple[int, int]] = {}
        self.duplicates: list[tuple[tuple[str | int, ...], str, tuple[int, int]]] = []
        self.nodes = 0

    def walk(self, node: yaml.Node, path: tuple[str | int, ...]) -> None:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            issue = PriceBookIssue(
                "", f"document expands to more than {MAX_NODES} nodes (aliases?)"
            )
            raise PriceBookError((issue,), self.source)
        self.marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column))
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                mark = (key_node.start_mark.line + 1, key_node.start_mark.column)
                if key in seen:
                    message = f"duplicate key {key!r} (first at line {seen[key]})"
                    self.duplicates.append(((*path, key), message, mark))
                    continue
                seen[key] = mark[0]
                self.marks[(*path, key)] = mark
                self.walk(value_node, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self.walk(item, (*path, index))

    def mark(self, loc: tuple[str | int, ...]) -> tuple[int, int] | None:
        """The position of ``loc``, else of its nearest ancestor in the document."""
        while True:
            if loc in self.marks:
                return self.marks[loc]
            if not loc:
                return None
            loc = loc[:-1]


def load_price_book(text: str, *, source: str = "price book") -> PriceBook:
    """Parse and validate a price book written in YAML (pure: the text, not a file).

    Args:
        text: the YAML document.
        source: how errors name the document (a file name).

    Returns:
        The validated, frozen :class:`PriceBook`.

    Raises:
        PriceBookError: the YAML does not parse, is not a mapping, has duplicate
            keys, or does not validate. ``issues`` holds **every** error found,
            each with its path and line, in document order.
    """
    loader = _Loader(text)
    lines = _Lines(source)
    try:
        node = loader.get_single_node()
        if node is not None:
            lines.walk(node, ())
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise PriceBookError((PriceBookIssue("", f"not YAML: {exc}", line),), source) from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    return _validate(data, source, lines)


def price_book_from_data(data: Any, *, source: str = "price book") -> PriceBook:
    """Validate already parsed data (a mapping as from JSON or YAML) as a price book.

    Raises:
        PriceBookError: see :func:`load_price_book` (without line numbers).
    """
    return _validate(data, source, None)


def _validate(data: Any, source: str, lines: _Lines | None) -> PriceBook:
    if not isinstance(data, Mapping):
        raise PriceBookError(
            (PriceBookIssue("", f"must be a mapping, not {type(data).__name__}"),), source
        )
    issues: list[tuple[tuple[str | int, ...], str, tuple[int, int] | None]] = []
    if lines is not None:
        issues.extend(lines.duplicates)
    try:
        book = PriceBook.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        for error in errors:
            if error["type"] == "too_short" and _has_item_errors(error["loc"], errors):
                continue  # pydantic counts only the valid items; the items' errors say why
            loc = _locate(error["loc"], data)
            issues.append((loc, _message(error), None if lines is None else lines.mark(loc)))
    else:
        if not issues:
            return book
    raise PriceBookError(_document_order(issues), source)


def _has_item_errors(loc: Sequence[str | int], errors: Sequence[Mapping[str, Any]]) -> bool:
    size = len(loc)
    return any(len(e["loc"]) > size and tuple(e["loc"][:size]) == tuple(loc) for e in errors)


def _document_order(
    issues: Sequence[tuple[tuple[str | int, ...], str, tuple[int, int] | None]],
) -> tuple[PriceBookIssue, ...]:
    """Issues without duplicates, by position in the document (when known), else
    as found."""
    ranked: list[tuple[tuple[int, int], int, PriceBookIssue]] = []
    seen: set[tuple[str, str]] = set()
    for order, (loc, message, mark) in enumerate(issues):
        text = render_path(loc)
        if (text, message) in seen:
            continue
        seen.add((text, message))
        line = None if mark is None else mark[0]
        ranked.append((mark or (0, 0), order, PriceBookIssue(text, message, line)))
    ranked.sort(key=lambda item: item[:2])
    return tuple(issue for _, _, issue in ranked)


def price_book_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12 keywords, validation mode) of a price book
    document, from the models: what an editor can check a YAML file against.
    Book-wide rules (unique codes, defined metrics, increasing tiers) are beyond
    JSON Schema; :func:`load_price_book` checks them."""
    schema = PriceBook.model_json_schema(mode="validation")
    schema["description"] = (
        "A price book of the invoicing pipeline: billable metrics and plans with "
        "immutable, effective-dated versions (streams/domain/rating/book.py). Validate a "
        "file with `invoicing plans validate FILE`: it also checks what JSON Schema "
        "cannot (unique codes, defined metrics, increasing tier bounds, the last tier open)."
    )
    return schema


__all__ = [
    "CODE_PATTERN",
    "PRICE_DECIMALS",
    "PROPERTY_NAME_PATTERN",
    "Aggregation",
    "BillableMetric",
    "Charge",
    "FixedFee",
    "Graduated",
    "MetricCharge",
    "MinimumCommitment",
    "Package",
    "PassThrough",
    "PerUnit",
    "Plan",
    "PlanVersion",
    "PriceBook",
    "Tier",
    "Volume",
    "load_price_book",
    "price_book_from_data",
    "price_book_json_schema",
]
