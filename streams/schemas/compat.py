"""Compatibility of schema changes for existing consumers (``invoicing schemas check-compat``).

Policy (docs/subscribing.md, "Compatibility"): within one topic version (the ``.vN``
suffix of the topic name) a contract only grows. Consumers keep reading the topic
from the beginning (retention is infinite), so every record that was valid under
the old schema must stay valid under the new one, and every field they read must
stay there with the type it had. Breaking, for a file that exists before and after:

- a field removed, or a field that was optional becoming required, or a new
  required field without a ``default``;
- a type changed, narrowed or widened (``string`` → ``integer``, ``number`` →
  ``integer``, ``integer`` → ``number``, ``null`` allowed or no longer allowed): code
  written against the old type does not expect the new one;
- an ``enum``/``const`` losing values, or added where any value was allowed;
- a constraint tightened or added: ``maxLength``/``maxItems``/``maximum`` lowered,
  ``minLength``/``minItems``/``minimum`` raised, ``pattern``, ``format`` or
  ``multipleOf`` added or changed, ``additionalProperties: false`` where it was open;
- a schema file (event type, key, headers) removed, a topic removed, or a topic's
  partition count, cleanup policy or retention changed (per-customer order and
  "read from the beginning" are part of the contract; from ``asyncapi.yaml``).

Accepted: adding an optional field, a new event type, a new topic, a new ``enum``
value, loosening a constraint, and any change to annotations (``title``, ``description``, ``examples``,
``x-*``). A breaking change ships on a new topic version: the files move from
``<name>.vN/`` to ``<name>.vM/`` (M > N); the old folder may then disappear.

:func:`breaking_changes` is the pure comparison of two JSON Schemas;
:func:`compare_trees` applies it to two ``schemas/`` folders; :func:`check_compat`
reads the bases from git (``git ls-tree`` / ``git show <ref>:schemas/...``): one
given ref, or by default every committed version of the folder
(:func:`history_bases`), so a breaking commit followed by others is still refused.

Scope of the comparison: local ``$ref`` (``#/...``) are resolved, ``anyOf``/``oneOf``
branches are matched by type, ``allOf`` members are merged; a remote ``$ref`` that
changes is reported as a change. It errs on the side of reporting.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Bounds where a new value lower than the old one narrows (or a new bound narrows).
_UPPER_BOUNDS = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum")
#: Bounds where a new value higher than the old one narrows (or a new bound narrows).
_LOWER_BOUNDS = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum")
#: Keywords whose addition or change narrows (their values cannot be ordered).
_OPAQUE = ("pattern", "format", "multipleOf")

_VERSIONED = re.compile(r"^(?P<stem>.+)\.v(?P<version>[0-9]+)$")


class CompatError(Exception):
    """Root of this module's errors."""


class BaseUnavailable(CompatError):
    """The base version cannot be read (not a git repository, unknown ref, git failed)."""


# --------------------------------------------------------------------------- pure comparison


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


class Narrowing(str):
    """A breaking change that adds or tightens one constraint of one field: its text,
    plus ``field`` (the path, ``""`` for the root), ``keyword`` (``maxLength``,
    ``pattern``, …) and ``new`` (the new value), which is what a documented
    exception (:class:`CompatException`) can accept. Compares and hashes as its text."""

    field: str
    keyword: str
    new: Any

    def __new__(cls, text: str, field: str, keyword: str, new: Any) -> Narrowing:
        made = super().__new__(cls, text)
        made.field, made.keyword, made.new = field, keyword, new
        return made


# --------------------------------------------------------------------------- folders


@dataclass(frozen=True)
class Incompatibility:
    """One breaking change: where (topic, message or file) and why."""

    topic: str
    message: str
    detail: str

    def __str__(self) -> str:
        return f"{self.topic} {self.message}: {self.detail}"


@dataclass(frozen=True)
class CompatException:
    """A documented narrowing accepted without a new topic version (``schemas/compat-exceptions.yaml``).

    ``accept`` maps (topic, message, field, keyword) to the exact new value accepted:
    a later change to another value, another field or another keyword is refused
    again. ``reason`` says why existing records are not broken by it and
    ``verified_by`` how that was (and is to be) checked.
    """

    id: str
    reason: str
    verified_by: str
    accept: Mapping[tuple[str, str, str, str], Any]

    def accepts(self, problem: Incompatibility) -> bool:
        detail = problem.detail
        if not isinstance(detail, Narrowing):
            return False
        key = (problem.topic, problem.message, detail.field, detail.keyword)
        return key in self.accept and self.accept[key] == detail.new


EXCEPTIONS_FILE = "compat-exceptions.yaml"


def load_exceptions(path: Path) -> list[CompatException]:
    """The exceptions declared in ``path`` (none when it does not exist).

    Format (YAML)::

        exceptions:
          - id: <name>
            reason: <why existing records stay valid>
            verified_by: <how that is checked>
            values: {<name>: <value>, ...}          # named values, used below by name
            accept:
              <topic>: {<message>: {<field path>: {<keyword>: <value or value name>}}}

    Raises:
        CompatError: the file is not YAML of that shape.
    """
    if not path.is_file():
        return []
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        found = []
        for entry in document.get("exceptions") or ():
            names: Mapping[str, Any] = entry.get("values") or {}
            accept: dict[tuple[str, str, str, str], Any] = {}
            for topic, messages in (entry.get("accept") or {}).items():
                for message, fields in messages.items():
                    for field_path, keywords in fields.items():
                        for keyword, value in keywords.items():
                            resolved = names.get(value, value) if isinstance(value, str) else value
                            accept[(topic, message, field_path, keyword)] = resolved
            found.append(
                CompatException(
                    id=str(entry["id"]),
                    reason=str(entry.get("reason", "")),
                    verified_by=str(entry.get("verified_by", "")),
                    accept=accept,
                )
            )
    except (yaml.YAMLError, AttributeError, KeyError, TypeError) as exc:
        raise CompatError(f"{path} is not a compatibility exceptions file: {exc!r}") from exc
    return found


def propose_exceptions(problems: Iterable[Incompatibility]) -> dict[str, Any]:
    """The ``accept`` block (topic → message → field → keyword → value) that would accept
    the narrowings among ``problems``: a starting point for a documented exception."""
    accept: dict[str, Any] = {}
    for problem in problems:
        detail = problem.detail
        if isinstance(detail, Narrowing):
            fields = accept.setdefault(problem.topic, {}).setdefault(problem.message, {})
            fields.setdefault(detail.field, {})[detail.keyword] = detail.new
    return accept


def _message_name(file_name: str) -> str:
    """``invoice.issued.schema.json`` → ``invoice.issued`` (``key``, ``headers`` likewise)."""
    return file_name.removesuffix(".schema.json")


def _superseded(topic: str, new_topics: Iterable[str]) -> str | None:
    """The newest ``<stem>.vM`` (M > N) in ``new_topics`` for ``topic`` = ``<stem>.vN``."""
    match = _VERSIONED.match(topic)
    if match is None:
        return None
    best: tuple[int, str] | None = None
    for other in new_topics:
        found = _VERSIONED.match(other)
        if (
            found
            and found["stem"] == match["stem"]
            and int(found["version"]) > int(match["version"])
        ):
            candidate = (int(found["version"]), other)
            best = candidate if best is None or candidate > best else best
    return best[1] if best else None


def compare_trees(old: Mapping[str, str], new: Mapping[str, str]) -> list[Incompatibility]:
    """Breaking changes from the ``old`` to the ``new`` schemas folder.

    Args:
        old, new: file text by path relative to the ``schemas/`` folder (POSIX
            form): ``<topic>/<name>.schema.json`` files and ``asyncapi.yaml``;
            other files are ignored.

    Raises:
        CompatError: a file is not valid JSON (or YAML, for ``asyncapi.yaml``).
    """
    old_files = _schema_files(old)
    new_files = _schema_files(new)
    new_topics = {topic for topic, _ in new_files}
    problems: list[Incompatibility] = []
    for topic in sorted({topic for topic, _ in old_files}):
        if topic not in new_topics:
            successor = _superseded(topic, new_topics)
            if successor is None:
                problems.append(
                    Incompatibility(topic, "*", "topic removed without a successor version")
                )
            continue
        for (file_topic, name), text in sorted(old_files.items()):
            if file_topic != topic:
                continue
            message = _message_name(name)
            if (topic, name) not in new_files:
                problems.append(Incompatibility(topic, message, "schema removed"))
                continue
            for detail in breaking_changes(
                _load_json(f"{topic}/{name}", text),
                _load_json(f"{topic}/{name}", new_files[(topic, name)]),
            ):
                problems.append(Incompatibility(topic, message, detail))
    if "asyncapi.yaml" in old and "asyncapi.yaml" in new:
        problems += _channel_changes(
            _load_yaml(old["asyncapi.yaml"]), _load_yaml(new["asyncapi.yaml"])
        )
    return problems


def _schema_files(files: Mapping[str, str]) -> dict[tuple[str, str], str]:
    result: dict[tuple[str, str], str] = {}
    for path, text in files.items():
        parts = path.split("/")
        if len(parts) == 2 and parts[1].endswith(".schema.json"):
            result[(parts[0], parts[1])] = text
    return result


def _load_json(path: str, text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompatError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise CompatError(f"{path} is not a JSON Schema object")
    return document


def _load_yaml(text: str) -> dict[str, Any]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CompatError(f"asyncapi.yaml is not YAML: {exc}") from exc
    return document if isinstance(document, dict) else {}


def _channel_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Incompatibility]:
    """Partition count, cleanup policy and retention of topics present in both documents."""

    def bindings(doc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        result: dict[str, Mapping[str, Any]] = {}
        for channel in (doc.get("channels") or {}).values():
            if isinstance(channel, Mapping) and isinstance(channel.get("address"), str):
                kafka = (channel.get("bindings") or {}).get("kafka") or {}
                result[channel["address"]] = kafka
        return result

    before, after = bindings(old), bindings(new)
    problems: list[Incompatibility] = []
    for topic in sorted(set(before) & set(after)):
        was, now = before[topic], after[topic]
        if was.get("partitions") != now.get("partitions"):
            problems.append(
                Incompatibility(
                    topic,
                    "channel",
                    f"partition count changed from {was.get('partitions')} to "
                    f"{now.get('partitions')} (moves customers to other partitions: "
                    "per-customer order breaks across the change)",
                )
            )
        config_was = was.get("topicConfiguration") or {}
        config_now = now.get("topicConfiguration") or {}
        if config_was.get("cleanup.policy") != config_now.get("cleanup.policy"):
            problems.append(
                Incompatibility(
                    topic,
                    "channel",
                    f"cleanup.policy changed from {config_was.get('cleanup.policy')} to "
                    f"{config_now.get('cleanup.policy')}",
                )
            )
        retention_was = _retention(config_was.get("retention.ms"))
        retention_now = _retention(config_now.get("retention.ms"))
        if retention_now < retention_was:
            problems.append(
                Incompatibility(
                    topic,
                    "channel",
                    f"retention.ms lowered from {config_was.get('retention.ms')} to "
                    f"{config_now.get('retention.ms')} (subscribers may no longer start from "
                    "the beginning)",
                )
            )
    return problems


def _retention(value: Any) -> float:
    if value is None or value == -1:
        return float("inf")
    return float(value)


# --------------------------------------------------------------------------- files and git


def read_folder(root: Path) -> dict[str, str]:
    """The ``*.schema.json`` files and ``asyncapi.yaml`` under ``root``, by POSIX path
    relative to it. A missing folder reads as empty.

    Raises:
        OSError: a file cannot be read.
    """
    files: dict[str, str] = {}
    if not root.is_dir():
        return files
    for path in sorted(root.rglob("*")):
        if path.is_file() and (path.name.endswith(".schema.json") or path.name == "asyncapi.yaml"):
            files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return files


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            encoding="utf-8",
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BaseUnavailable(f"git {' '.join(args)} failed: {exc}") from exc


def read_git_folder(repo: Path, ref: str, folder: str) -> dict[str, str]:
    """The same files as :func:`read_folder`, as committed at ``ref`` (``folder`` is
    relative to the repository root, POSIX form). Empty if ``ref`` has no such folder.

    Raises:
        BaseUnavailable: ``ref`` does not name a commit, or git failed.
    """
    commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit.returncode != 0:
        raise BaseUnavailable(f"{ref!r} is not a commit in {repo}")
    sha = commit.stdout.strip()
    prefix = folder.strip("/") + "/"
    listing = _git(repo, "ls-tree", "-r", "-z", "--name-only", sha, "--", prefix)
    if listing.returncode != 0:
        raise BaseUnavailable(f"git ls-tree {ref}: {listing.stderr.strip()}")
    files: dict[str, str] = {}
    for path in filter(None, listing.stdout.split("\0")):
        name = path.rsplit("/", 1)[-1]
        if not (name.endswith(".schema.json") or name == "asyncapi.yaml"):
            continue
        shown = _git(repo, "show", f"{sha}:{path}")
        if shown.returncode != 0:
            raise BaseUnavailable(f"git show {ref}:{path}: {shown.stderr.strip()}")
        files[path[len(prefix) :]] = shown.stdout
    return files


def history_bases(repo: Path, folder: str, *, allow_shallow: bool = False) -> list[str]:
    """Every committed version of ``folder`` to compare against when no base is given:
    one commit per distinct tree of the folder, newest first, from ``git log -- folder``
    (the folder's whole history, so a breaking commit stays refused after later
    commits). Empty when the folder was never committed.

    Raises:
        BaseUnavailable: the repository is a shallow clone (its history of
            ``folder`` is incomplete: ``git fetch --unshallow``, or pass a base) and
            ``allow_shallow`` is False, or git failed.
    """
    shallow = _git(repo, "rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        raise BaseUnavailable(f"git rev-parse failed in {repo}: {shallow.stderr.strip()}")
    if shallow.stdout.strip() == "true" and not allow_shallow:
        raise BaseUnavailable(
            f"{repo} is a shallow clone: the history of {folder}/ is incomplete, so a "
            "breaking change could pass unseen; run `git fetch --unshallow` or pass --base REF"
        )
    head = _git(repo, "rev-parse", "--verify", "--quiet", "HEAD")
    if head.returncode != 0:
        return []  # no commit yet
    log = _git(repo, "log", "--format=%H", "HEAD", "--", folder)
    if log.returncode != 0:
        raise BaseUnavailable(f"git log -- {folder} failed: {log.stderr.strip()}")
    bases: list[str] = []
    seen: set[str] = set()
    for commit in log.stdout.split():
        tree = _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}:{folder}")
        key = tree.stdout.strip() if tree.returncode == 0 else f"none:{commit}"
        if key not in seen:
            seen.add(key)
            bases.append(commit)
    return bases


@dataclass(frozen=True)
class CompatReport:
    """What :func:`check_compat` compared and found.

    ``bases``: the commits compared against, newest first (empty = nothing to
    compare); ``compared``: schema files present both on disk and in the newest base;
    ``problems``: every distinct breaking change, each naming the commit it breaks;
    ``accepted``: the breaking changes a documented exception accepts, with its id.
    """

    bases: list[str]
    compared: int
    problems: list[Incompatibility]
    accepted: list[tuple[Incompatibility, str]] = field(default_factory=list)

    @property
    def base(self) -> str | None:
        """The newest base compared against (None: nothing to compare)."""
        return self.bases[0] if self.bases else None

    @property
    def ok(self) -> bool:
        return not self.problems


def check_compat(
    schemas_dir: Path,
    base: str | None = None,
    *,
    allow_shallow: bool = False,
    exceptions: list[CompatException] | None = None,
) -> CompatReport:
    """Compare the ``schemas_dir`` folder as it is on disk against ``base`` in the git
    repository that holds it or, when ``base`` is None, against every committed
    version of the folder (:func:`history_bases`: compatibility is transitive, like
    the Confluent Schema Registry's ``BACKWARD_TRANSITIVE`` mode, because consumers
    read the topics from the beginning). ``allow_shallow``: in a shallow clone,
    compare against the versions it has instead of refusing. ``exceptions``: the
    documented narrowings to accept (default: ``<schemas_dir>/compat-exceptions.yaml``,
    :func:`load_exceptions`); an accepted change is reported in ``accepted``.

    Raises:
        BaseUnavailable: ``base`` was given but cannot be read, the clone is shallow
            (default mode), or git failed.
        CompatError: a schema file is not valid JSON/YAML.
    """
    schemas_dir = schemas_dir.resolve()
    if exceptions is None:
        exceptions = load_exceptions(schemas_dir / EXCEPTIONS_FILE)
    top = _git(
        schemas_dir if schemas_dir.is_dir() else schemas_dir.parent, "rev-parse", "--show-toplevel"
    )
    if top.returncode != 0:
        if base is not None:
            raise BaseUnavailable(f"{schemas_dir} is not inside a git repository")
        return CompatReport([], 0, [])
    repo = Path(top.stdout.strip())
    folder = schemas_dir.relative_to(repo.resolve()).as_posix()
    refs = [base] if base is not None else history_bases(repo, folder, allow_shallow=allow_shallow)
    new = read_folder(schemas_dir)
    problems: list[Incompatibility] = []
    accepted: list[tuple[Incompatibility, str]] = []
    seen: set[str] = set()
    compared = 0
    for n, ref in enumerate(refs):
        old = read_git_folder(repo, ref, folder)
        if n == 0:
            compared = len(set(_schema_files(old)) & set(_schema_files(new)))
        for problem in compare_trees(old, new):
            if str(problem) in seen:
                continue
            seen.add(str(problem))
            where = ref[:12] if base is None else ref
            detail: str = f"{problem.detail} (vs {where})"
            if isinstance(problem.detail, Narrowing):
                narrowing = problem.detail
                detail = Narrowing(detail, narrowing.field, narrowing.keyword, narrowing.new)
            noted = Incompatibility(problem.topic, problem.message, detail)
            by = next((e.id for e in exceptions if e.accepts(problem)), None)
            if by is None:
                problems.append(noted)
            else:
                accepted.append((noted, by))
    return CompatReport(refs, compared, problems, accepted)
