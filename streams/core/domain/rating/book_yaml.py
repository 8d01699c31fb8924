"""Price books from YAML (or parsed data): exact numbers, every error with its path and line.

:func:`load_price_book` parses a YAML document with a safe loader whose numbers with
a fraction are read as their exact text (never a float), refuses duplicate keys and
documents that expand past :data:`MAX_NODES` nodes, validates the result as a
:class:`~streams.core.domain.rating.book.PriceBook`, and reports **every** error
(:class:`~streams.core.domain.rating.errors.PriceBookError`) with its path
(:func:`render_path`) and line, in document order. :func:`price_book_from_data` does
the same for already parsed data, without lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

import yaml
from pydantic import ValidationError

from streams.core.domain.rating.book import PriceBook
from streams.core.domain.rating.errors import PriceBookError, PriceBookIssue

#: Most nodes a YAML document may expand to (aliases included): a guard against
#: "billion laughs" documents, far above any real price book.
MAX_NODES = 100_000


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


__all__ = ["MAX_NODES", "load_price_book", "price_book_from_data", "render_path"]
