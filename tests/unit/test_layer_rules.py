"""Import rules between the packages of ``streams`` (docs/architecture.md "Layers and
import rules"), beyond the domain's purity rule (tests/unit/test_import_rule.py).

Each rule names the packages it applies to and the ``streams`` packages they must
not import. Every import counts: module level, inside functions, under
``TYPE_CHECKING``, relative imports, and ``from streams import bootstrap``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

STREAMS = Path(__file__).resolve().parents[2] / "streams"

#: The long-running stream processors: none imports another.
WORKERS = ("invoicing", "email", "usage_view")
#: Command logic and the kernel: neither builds its own clients nor calls the CLI.
NOT_ROOT = ("bootstrap", "entrypoints")


@dataclass(frozen=True)
class Rule:
    """Modules of the packages ``sources`` must not import the packages ``forbidden``."""

    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...]
    why: str


RULES: tuple[Rule, ...] = (
    Rule(
        "workers do not import one another",
        WORKERS,
        WORKERS,
        "a worker's internals are its own; what two workers share lives in the kernel",
    ),
    Rule(
        "replay, ops, importers and email use the kernel, not a worker's internals",
        ("replay", "ops", "importers", "email", "usage_view", "demo", "drill"),
        ("invoicing",),
        "the issuance transaction, stores, fences and dead letters are streams.billing's",
    ),
    Rule(
        "only entrypoints import the composition root",
        (
            "adapters",
            "billing",
            "demo",
            "domain",
            "drill",
            "email",
            "importers",
            "invoicing",
            "ops",
            "replay",
            "sandbox",
            "schemas",
            "stack",
            "usage_view",
            "settings",
            "topics",
        ),
        NOT_ROOT,
        "clients are built from settings in one place (CONVENTIONS §6) and passed down",
    ),
    Rule(
        "the kernel imports no worker, command or harness",
        ("billing",),
        (
            *WORKERS,
            "replay",
            "ops",
            "importers",
            "demo",
            "drill",
            "sandbox",
            "stack",
            "schemas",
            *NOT_ROOT,
        ),
        "everything builds on the kernel; it builds on the domain and the adapters only",
    ),
    Rule(
        "adapters import no worker, command or harness",
        ("adapters",),
        ("invoicing", "replay", "ops", "importers", "demo", "drill", "sandbox", "usage_view"),
        "adapters are the edges the core calls through its ports",
    ),
    Rule(
        "foundation modules import only the domain",
        ("settings", "topics"),
        tuple(
            sorted(
                {p.name for p in STREAMS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
                - {"domain"}
            )
        ),
        "settings and the topic registry are read by everything, so they depend on nothing",
    ),
)


def package_of(path: Path, root: Path = STREAMS) -> str:
    """``streams/billing/store/usage.py`` → ``billing``; ``streams/topics.py`` → ``topics``."""
    rel = path.relative_to(root)
    return rel.parts[0].removesuffix(".py")


def imported_packages(
    source: str, module: str, *, is_package: bool = False
) -> list[tuple[int, str]]:
    """``(line, package)`` of every ``streams.<package>`` that ``source`` imports, where
    ``module`` is the dotted name of the module holding ``source`` (for relative imports;
    ``is_package`` when it is a package's ``__init__``)."""
    found: list[tuple[int, str]] = []
    anchor = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = anchor[: len(anchor) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            # ``from streams import bootstrap`` imports the module streams.bootstrap.
            targets = (
                [f"{target}.{alias.name}" for alias in node.names]
                if target == "streams"
                else [target]
            )
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if len(parts) >= 2 and parts[0] == "streams":
                found.append((node.lineno, parts[1]))
    return found


def violations(rule: Rule, files: list[Path], root: Path = STREAMS) -> list[str]:
    """``"<file>:<line> imports streams.<package>"`` for each import of ``files`` (under
    ``root``, the ``streams`` folder) that breaks ``rule``."""
    out: list[str] = []
    for path in files:
        source_pkg = package_of(path, root)
        if source_pkg not in rule.sources:
            continue
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        source = path.read_text(encoding="utf-8")
        for line, pkg in imported_packages(source, module, is_package=path.name == "__init__.py"):
            if pkg in rule.forbidden and pkg != source_pkg:
                out.append(f"{path.relative_to(root.parent)}:{line} imports streams.{pkg}")
    return out


def product_files() -> list[Path]:
    return sorted(STREAMS.rglob("*.py"))


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_rule_holds(rule: Rule) -> None:
    assert violations(rule, product_files()) == [], rule.why


def test_every_package_is_named_by_some_rule() -> None:
    """A new package must be placed in the layers on purpose (add it to a rule)."""
    named = {pkg for rule in RULES for pkg in (*rule.sources, *rule.forbidden)}
    packages = {p.name for p in STREAMS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - named - {"migrations"} == set()


def test_relative_imports_of_a_package_init_resolve_from_the_package() -> None:
    assert imported_packages("from ..replay import run", "streams.billing", is_package=True) == [
        (1, "replay")
    ]
    assert imported_packages("from . import rows", "streams.billing", is_package=True) == [
        (1, "billing")
    ]


@pytest.mark.parametrize(
    ("module", "source", "package"),
    [
        ("streams.email.sender", "from streams.invoicing import worker", "invoicing"),
        ("streams.email.sender", "import streams.invoicing.jobs", "invoicing"),
        ("streams.replay.run", "from streams import bootstrap", "bootstrap"),
        ("streams.replay.run", "def f():\n    from streams.bootstrap import x\n", "bootstrap"),
        ("streams.billing.fencing", "from ..invoicing import worker", "invoicing"),
        ("streams.billing.store.usage", "from ...replay import run", "replay"),
        (
            "streams.ops.status",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from streams.invoicing.jobs import JobResult\n",
            "invoicing",
        ),
    ],
)
def test_the_checker_sees_every_form_of_import(module: str, source: str, package: str) -> None:
    assert [pkg for _, pkg in imported_packages(source, module)] == [package]


@pytest.mark.parametrize(
    ("rule_name", "where", "source"),
    [
        ("workers do not", "email/sender.py", "from streams.invoicing import jobs\n"),
        ("replay, ops", "ops/status.py", "from streams.invoicing.worker import X\n"),
        ("only entrypoints", "importers/close_period.py", "from streams import bootstrap\n"),
        ("the kernel", "billing/store/usage.py", "from ...replay import run\n"),
        ("adapters import", "adapters/kafka.py", "import streams.ops.status\n"),
        ("foundation", "topics.py", "from streams.billing import rows\n"),
    ],
)
def test_a_planted_violation_is_reported(
    tmp_path: Path, rule_name: str, where: str, source: str
) -> None:
    """Each rule can fail: a violating module in a copy of the layout is reported."""
    rule = next(r for r in RULES if r.name.startswith(rule_name))
    root = tmp_path / "streams"
    planted = root / where
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(source, encoding="utf-8")
    found = violations(rule, [planted], root)
    assert len(found) == 1 and found[0].startswith(f"streams/{where}:1 imports streams."), found
