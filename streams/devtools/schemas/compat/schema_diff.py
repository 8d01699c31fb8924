"""The pure comparison of two JSON Schemas: what a new version breaks for existing consumers.

:func:`breaking_changes` lists every change that a record valid under the old schema,
or code written against it, would not survive (the rules: the docstring of
:mod:`streams.devtools.schemas.compat`). Local ``$ref`` are resolved, ``anyOf`` /
``oneOf`` branches matched by type, ``allOf`` members merged; a narrowed constraint is
reported as a :class:`~streams.devtools.schemas.compat.findings.Narrowing`, which a
documented exception can accept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.devtools.schemas.compat.findings import Narrowing

#: Bounds where a new value lower than the old one narrows (or a new bound narrows).
_UPPER_BOUNDS = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")
#: Bounds where a new value higher than the old one narrows (or a new bound narrows).
_LOWER_BOUNDS = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
#: Keywords whose addition or change narrows (their values cannot be ordered).
_OPAQUE = ("pattern", "format", "multipleOf")


def breaking_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Why ``new`` would break a consumer of ``old``: one line per problem, naming
    the field (``field 'taxes[].rate'``, ``(root)`` for the document itself) and
    the reason. Empty when ``new`` is a compatible evolution of ``old``.

    Both are JSON Schema documents (dicts as parsed from JSON); pure, never raises
    for well-formed schemas. See the module docstring for the rules.
    """
    return _dedupe(_Comparer(old, new).compare(old, new, ""))


@dataclass
class _Comparer:
    old_doc: Mapping[str, Any]
    new_doc: Mapping[str, Any]
    _active: set[tuple[int, int]] = field(default_factory=set)

    def compare(self, old: Any, new: Any, path: str) -> list[str]:
        if id(old) == id(new) and old is not None:
            return []
        key = (id(old), id(new))
        if key in self._active:  # a recursive schema: its body is being compared already
            return []
        self._active.add(key)
        try:
            return self._compare(old, new, path)
        finally:
            self._active.discard(key)

    def _compare(self, old: Any, new: Any, path: str) -> list[str]:
        if new is False:
            return [] if old is False else [f"{_where(path)}: no value is accepted any more"]
        if old is False:
            return []
        old_branches = self._branches(old, self.old_doc)
        new_branches = self._branches(new, self.new_doc)
        changed = (
            f"{_where(path)}: type changed or narrowed from {_describe(old_branches)} "
            f"to {_describe(new_branches)}"
        )
        problems: list[str] = []
        old_types = _union(old_branches)
        for branch in new_branches:
            # A new type (string -> string|null, integer -> number) is a change that
            # code written against the old schema does not expect.
            if isinstance(branch, dict) and not _covers(old_types, _types(branch)):
                problems.append(changed)
        for old_branch in old_branches:
            if isinstance(old_branch, str):  # an unresolvable (remote) $ref
                if old_branch not in new_branches:
                    problems.append(f"{_where(path)}: reference {old_branch!r} changed or removed")
                continue
            candidates = [
                b
                for b in new_branches
                if isinstance(b, dict) and _covers(_types(b), _types(old_branch))
            ]
            if not candidates:
                problems.append(changed)
                continue
            best: list[str] | None = None
            for branch in candidates:
                found = self._compare_branch(old_branch, branch, path)
                if best is None or len(found) < len(best):
                    best = found
            problems.extend(best or [])
        return problems

    def _branches(self, schema: Any, doc: Mapping[str, Any]) -> list[dict[str, Any] | str]:
        """The alternatives a value may match: ``anyOf``/``oneOf`` flattened, local
        ``$ref`` resolved, ``allOf`` merged; a remote ``$ref`` stays its string."""
        if schema is True or schema is None:
            return [{}]
        if not isinstance(schema, Mapping):
            return [{}]
        resolved = self._resolve(schema, doc, depth=0)
        if isinstance(resolved, str):
            return [resolved]
        for keyword in ("anyOf", "oneOf"):
            if keyword in resolved:
                base = {k: v for k, v in resolved.items() if k != keyword}
                branches: list[dict[str, Any] | str] = []
                for alternative in resolved[keyword]:
                    for branch in self._branches(alternative, doc):
                        branches.append(branch if isinstance(branch, str) else {**base, **branch})
                return branches
        return [resolved]

    def _resolve(self, schema: Mapping[str, Any], doc: Mapping[str, Any], depth: int) -> Any:
        if depth > 32:
            return dict(schema)
        result = dict(schema)
        ref = result.pop("$ref", None)
        if isinstance(ref, str):
            target = _pointer(doc, ref)
            if target is None:
                return ref
            if isinstance(target, Mapping):
                base = self._resolve(target, doc, depth + 1)
                if isinstance(base, str):
                    return base
                result = {**base, **result}
        for member in result.pop("allOf", ()) or ():
            if isinstance(member, Mapping):
                merged = self._resolve(member, doc, depth + 1)
                if isinstance(merged, str):
                    return merged
                result = _merge(result, merged)
        return result

    def _compare_branch(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[str]:
        where = _where(path)
        problems: list[str] = []
        old_values, new_values = _values(old), _values(new)
        if new_values is not None:
            if old_values is None:
                problems.append(f"{where}: values restricted to {_short(new_values)}")
            else:
                lost = [v for v in old_values if v not in new_values]
                if lost:
                    problems.append(f"{where}: allowed value(s) {_short(lost)} removed")
        for bound in _UPPER_BOUNDS:
            if bound in new and (bound not in old or new[bound] < old[bound]):
                was = f"lowered from {old[bound]}" if bound in old else "added"
                text = f"{where}: {bound} {was} (now {new[bound]})"
                problems.append(Narrowing(text, path, bound, new[bound]))
        for bound in _LOWER_BOUNDS:
            if bound in new and (bound not in old or new[bound] > old[bound]):
                was = f"raised from {old[bound]}" if bound in old else "added"
                text = f"{where}: {bound} {was} (now {new[bound]})"
                problems.append(Narrowing(text, path, bound, new[bound]))
        for keyword in _OPAQUE:
            if keyword in new and new.get(keyword) != old.get(keyword):
                if keyword in old:
                    text = f"{where}: {keyword} changed from {old[keyword]!r} to {new[keyword]!r}"
                else:
                    text = f"{where}: {keyword} {new[keyword]!r} added"
                problems.append(Narrowing(text, path, keyword, new[keyword]))
        if new.get("uniqueItems") is True and old.get("uniqueItems") is not True:
            problems.append(f"{where}: uniqueItems added")
        if "items" in new:
            problems += self.compare(old.get("items", True), new["items"], f"{path}[]")
        problems += self._compare_object(old, new, path)
        return problems

    def _compare_object(self, old: dict[str, Any], new: dict[str, Any], path: str) -> list[str]:
        old_props: Mapping[str, Any] = old.get("properties") or {}
        new_props: Mapping[str, Any] = new.get("properties") or {}
        old_required = set(old.get("required") or ())
        problems: list[str] = []
        for name in old_props:
            if name not in new_props:
                problems.append(f"{_where(_join(path, name))}: field removed")
        for name in new.get("required") or ():
            if name in old_required:
                continue
            schema = new_props.get(name)
            if isinstance(schema, Mapping) and "default" in schema:
                continue
            if name in old_props:
                problems.append(f"{_where(_join(path, name))}: optional field became required")
            else:
                problems.append(f"{_where(_join(path, name))}: new required field without default")
        for name, new_schema in new_props.items():
            if name in old_props:
                problems += self.compare(old_props[name], new_schema, _join(path, name))
        old_additional = old.get("additionalProperties", True)
        new_additional = new.get("additionalProperties", True)
        if new_additional is False and old_additional is not False:
            problems.append(f"{_where(path)}: additionalProperties false added (was open)")
        elif new_additional is not False and old_additional is not False:
            problems += self.compare(old_additional, new_additional, _join(path, "*"))
        old_patterns: Mapping[str, Any] = old.get("patternProperties") or {}
        for pattern, new_schema in (new.get("patternProperties") or {}).items():
            before = old_patterns.get(pattern, old_additional)
            problems += self.compare(before, new_schema, _join(path, f"/{pattern}/"))
        return problems


def _pointer(doc: Mapping[str, Any], ref: str) -> Any:
    """The target of a local ``#/...`` reference in ``doc``, or None (remote, missing)."""
    if ref == "#":
        return doc
    if not ref.startswith("#/"):
        return None
    node: Any = doc
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _merge(left: dict[str, Any], right: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(left)
    for key, value in right.items():
        if key == "properties" and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        elif key == "required" and isinstance(merged.get(key), list):
            merged[key] = list(dict.fromkeys([*merged[key], *value]))
        else:
            merged.setdefault(key, value)
    return merged


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _values(schema: Mapping[str, Any]) -> list[Any] | None:
    if "const" in schema:
        return [schema["const"]]
    enum = schema.get("enum")
    return list(enum) if isinstance(enum, list) else None


def _types(schema: Mapping[str, Any]) -> frozenset[str] | None:
    """JSON types a branch accepts; None = any type."""
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared})
    if isinstance(declared, list):
        return frozenset(declared)
    values = _values(schema)
    return None if values is None else frozenset(_json_type(v) for v in values)


def _union(branches: Iterable[dict[str, Any] | str]) -> frozenset[str] | None:
    """Every JSON type the branches accept together; None = any."""
    types: set[str] = set()
    for branch in branches:
        if isinstance(branch, str):
            continue
        found = _types(branch)
        if found is None:
            return None
        types |= found
    return frozenset(types)


def _covers(new: frozenset[str] | None, old: frozenset[str] | None) -> bool:
    """Whether every value of the ``old`` types is of one of the ``new`` types."""
    if new is None:
        return True
    if old is None:
        return False
    widened = set(new) | ({"integer"} if "number" in new else set())
    return old <= widened


def _describe(branches: Iterable[dict[str, Any] | str]) -> str:
    parts: list[str] = []
    for branch in branches:
        if isinstance(branch, str):
            parts.append(f"$ref {branch}")
            continue
        types = _types(branch)
        parts.append("any" if types is None else "|".join(sorted(types)))
    return " | ".join(dict.fromkeys(parts)) or "any"


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _where(path: str) -> str:
    return f"field {path!r}" if path else "(root)"


def _short(values: Iterable[Any]) -> str:
    return ", ".join(json.dumps(v) for v in values)


def _dedupe(problems: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(problems))
