"""The price book's rules across items, checked on the raw document.

pydantic validates each item's shape; these rules relate items to each other (tier
bounds increase and only the last is open, codes are unique, one charge per metric,
versions increase, every charge's metric is defined). They run on the *raw* input,
best effort, beside the structural validation, so that one report holds the errors of
both (:func:`checked`): an item with a bad price does not hide a tier bound out of
order next to it. Each rule returns :data:`Issues` (path inside the value checked,
message); whatever is not shaped as expected is skipped, the structural validation
reports it. The rules themselves: docs/rating.md "Plans, versions, validation".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import date
from decimal import Decimal
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from streams.core.domain.rating.book_values import METRIC_MODELS, Aggregation, parse_bound

_INT: TypeAdapter[int] = TypeAdapter(int)
_DATE: TypeAdapter[date] = TypeAdapter(date)


def raise_issues(issues: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
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


def checked(data: Any, handler: Any, check: Any) -> Any:
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
    raise_issues(issues)
    return result


#: What :func:`_parse` and :func:`_field` return for a value that is absent or does not parse.
NOT_PARSED = object()


def _parse(parser: Any, value: Any) -> Any:
    try:
        return parser(value)
    except (ValueError, TypeError, ArithmeticError, PydanticCustomError, ValidationError):
        return NOT_PARSED


def _field(item: Any, name: str) -> Any:
    return item.get(name, NOT_PARSED) if isinstance(item, Mapping) else NOT_PARSED


def metric_issues(data: Any) -> Issues:
    aggregation = _field(data, "aggregation")
    if aggregation not in {a.value for a in Aggregation}:
        return []
    has_property = _field(data, "property") not in (None, NOT_PARSED)
    if aggregation == Aggregation.COUNT and has_property:
        return [(("property",), "count takes no property")]
    if aggregation != Aggregation.COUNT and not has_property:
        return [(("property",), f"required for aggregation {aggregation}")]
    return []


def tier_issues(tiers: Any) -> Issues:
    """Bounds increase; only the last tier is open, and it is."""
    issues: Issues = []
    if not isinstance(tiers, list | tuple):
        return issues
    previous: Decimal | None = None
    last = len(tiers) - 1
    for index, tier in enumerate(tiers):
        raw = _field(tier, "up_to")
        bound = NOT_PARSED if raw is NOT_PARSED else _parse(parse_bound, raw)
        if bound is NOT_PARSED:
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


def charge_issues(version: Any) -> Issues:
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


def version_issues(versions: Any) -> Issues:
    """Version numbers strictly increase; ``effective_from`` never decreases."""
    issues: Issues = []
    previous: tuple[int, date] | None = None
    for index, version in _items(versions):
        number = _parse(_INT.validate_python, _field(version, "version"))
        start = _parse(_DATE.validate_python, _field(version, "effective_from"))
        if number is NOT_PARSED or start is NOT_PARSED:
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


def reference_issues(doc: Any) -> list[tuple[tuple[str | int, ...], str]]:
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
