"""The import rule (docs/conventions.md "Pure core, I/O at the edges"): streams/core/domain imports
no I/O library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DOMAIN = Path(__file__).resolve().parents[2] / "streams" / "core" / "domain"

FORBIDDEN = frozenset(
    {
        "confluent_kafka",
        "faust",
        "psycopg",
        "psycopg_pool",
        "redis",
        "httpx",
        "aiohttp",
        "aiosmtpd",
        "sqlalchemy",
        "alembic",
    }
)


def forbidden_imports(source: str, filename: str = "<source>") -> list[str]:
    """``"<line>: <module>"`` for every import of a forbidden top-level package,
    wherever it appears (module level, functions, ``TYPE_CHECKING`` blocks)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.extend(f"{node.lineno}: {name}" for name in names if name.split(".")[0] in FORBIDDEN)
    # importlib.import_module("redis") and __import__("httpx") are imports too.
    for node in ast.walk(ast.parse(source, filename)):
        if (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.split(".")[0] in FORBIDDEN
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            found.append(f"{node.lineno}: {node.args[0].value}")
    return found


def domain_modules() -> list[Path]:
    """Every module of the domain package, sub-packages included (rating/)."""
    return sorted(DOMAIN.rglob("*.py"))


def test_the_domain_package_exists_and_has_modules() -> None:
    names = {path.name for path in domain_modules()}
    assert {"money.py", "periods.py", "codec.py", "invoice.py", "focus.py"} <= names
    assert (DOMAIN / "events" / "__init__.py").exists()


def test_sub_packages_are_covered() -> None:
    relative = {path.relative_to(DOMAIN).as_posix() for path in domain_modules()}
    assert {
        "rating/__init__.py",
        "rating/book.py",
        "rating/rate.py",
        "events/account.py",
    } <= relative


@pytest.mark.parametrize(
    "path", domain_modules(), ids=lambda path: path.relative_to(DOMAIN).as_posix()
)
def test_domain_module_imports_no_io_library(path: Path) -> None:
    assert forbidden_imports(path.read_text(encoding="utf-8"), str(path)) == []


@pytest.mark.parametrize(
    "source",
    [
        "import redis",
        "import confluent_kafka.admin as admin",
        "from psycopg import sql",
        "from psycopg_pool import ConnectionPool",
        "def f():\n    import httpx\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from faust import App\n",
        "import os, sqlalchemy",
        "import importlib\nimportlib.import_module('aiohttp.web')",
        "__import__('alembic')",
        "from aiosmtpd.controller import Controller",
    ],
)
def test_the_checker_catches_forbidden_imports(source: str) -> None:
    assert len(forbidden_imports(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "import decimal",
        "from streams.core.domain.money import Amount",
        "from . import money",
        "import redistribute",  # a prefix is not the package
        "from pydantic import BaseModel",
    ],
)
def test_the_checker_allows_the_rest(source: str) -> None:
    assert forbidden_imports(source) == []
