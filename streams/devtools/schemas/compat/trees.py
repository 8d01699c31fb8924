"""Two ``schemas/`` folders compared: schema files by topic and message, and the channels."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from streams.devtools.schemas.compat.asyncapi import channel_changes, load_asyncapi
from streams.devtools.schemas.compat.findings import CompatError, Incompatibility
from streams.devtools.schemas.compat.schema_diff import breaking_changes

_VERSIONED = re.compile(r"^(?P<stem>.+)\.v(?P<version>[0-9]+)$")


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
    old_files = schema_files(old)
    new_files = schema_files(new)
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
        problems += channel_changes(
            load_asyncapi(old["asyncapi.yaml"]), load_asyncapi(new["asyncapi.yaml"])
        )
    return problems


def schema_files(files: Mapping[str, str]) -> dict[tuple[str, str], str]:
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
