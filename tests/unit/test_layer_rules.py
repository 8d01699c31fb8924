"""The layers of ``streams`` and their import rules (docs/architecture.md, "Layers and
import rules"), beyond the domain's purity rule (tests/unit/test_import_rule.py).

Every package of ``streams`` belongs to one layer of :data:`LAYERS`; a module may import
its own package and the layers below its own, never a layer above. Two more rules hold
within a layer: an app does not import another app, and the domain imports nothing of
``streams`` outside itself but the exception root (``streams/errors.py``), which imports
nothing of ``streams`` at all. Every import counts: module level, inside functions, under
``TYPE_CHECKING``, relative imports, and ``from streams import bootstrap``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

STREAMS = Path(__file__).resolve().parents[2] / "streams"

#: Layer of each unit, lowest first. A unit is ``core.domain``, ``core.billing``,
#: ``adapters``, ``apps.<name>``, ``devtools.<name>`` or a top-level module.
LAYERS: dict[str, int] = {
    "errors": 0,
    "core.domain": 0,
    "settings": 1,
    "topics": 1,
    "core.billing": 2,
    "adapters": 3,
    "apps": 4,
    "devtools": 5,
    "bootstrap": 6,
    "entrypoints": 7,
}

#: Folders whose sub-packages are units of their own (``apps.email``, ``devtools.stack``).
SPLIT = ("core", "apps", "devtools")


def unit_of(dotted: str) -> str | None:
    """``streams.apps.email.sender`` → ``apps.email``; ``streams.adapters.postgres.grants``
    → ``adapters``; ``streams.topics`` → ``topics``; ``None`` outside ``streams``."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "streams":
        return None
    if parts[1] in SPLIT and len(parts) >= 3:
        return f"{parts[1]}.{parts[2]}"
    return parts[1]


def layer_of(unit: str) -> int:
    """The layer of ``unit``: its own entry, else its folder's (``apps.email`` → apps).

    Raises:
        KeyError: the unit is in no layer (a new package must be placed on purpose).
    """
    return LAYERS[unit] if unit in LAYERS else LAYERS[unit.split(".")[0]]


def imported_units(source: str, module: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """``(line, unit)`` of every ``streams`` unit that ``source`` imports, where ``module``
    is the dotted name of the module holding ``source`` (for relative imports;
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
            # ``from streams import bootstrap`` and ``from streams.apps import email``
            # import the modules named after ``import``.
            names = [f"{target}.{alias.name}" for alias in node.names]
            targets = names if target in ("streams", *(f"streams.{s}" for s in SPLIT)) else [target]
        else:
            continue
        for target in targets:
            unit = unit_of(target)
            if unit is not None:
                found.append((node.lineno, unit))
    return found


@dataclass(frozen=True)
class Rule:
    """A rule over one import: ``check(source unit, imported unit)`` is a complaint or None."""

    name: str
    why: str

    def check(self, source: str, target: str) -> str | None:
        if source == target:
            return None
        if self.name == "layers":
            if layer_of(target) > layer_of(source):
                return f"layer {layer_of(source)} imports layer {layer_of(target)}"
        elif self.name == "apps":
            if source.startswith("apps.") and target.startswith("apps."):
                return "an app imports another app"
        elif self.name == "domain":
            if source == "core.domain" and target not in ("core.domain", "errors"):
                return "the domain imports streams outside itself (but the exception root)"
            if source == "errors":
                return "the exception root imports streams"
        return None


RULES: tuple[Rule, ...] = (
    Rule(
        "layers",
        "a module imports its own layer and the layers below: core ← settings/topics ← "
        "kernel ← adapters ← apps ← devtools ← bootstrap ← entrypoints",
    ),
    Rule("apps", "an app's internals are its own; what two apps share lives in the core"),
    Rule(
        "domain",
        "the domain is pure and depends on nothing of the project but the exception root, "
        "which depends on nothing",
    ),
)


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def violations(rule: Rule, files: list[Path], root: Path = STREAMS) -> list[str]:
    """``"<file>:<line> imports streams.<unit> (<complaint>)"`` for each import of
    ``files`` (under ``root``, the ``streams`` folder) that breaks ``rule``."""
    out: list[str] = []
    for path in files:
        module = module_name(path, root)
        source_unit = unit_of(module) if module != "streams" else None
        if source_unit is None or source_unit in SPLIT:
            continue
        text = path.read_text(encoding="utf-8")
        for line, target in imported_units(text, module, is_package=path.name == "__init__.py"):
            if target in SPLIT:
                continue
            complaint = rule.check(source_unit, target)
            if complaint:
                out.append(
                    f"{path.relative_to(root.parent)}:{line} imports streams.{target} ({complaint})"
                )
    return out


def product_files() -> list[Path]:
    return sorted(STREAMS.rglob("*.py"))


def units_on_disk(root: Path = STREAMS) -> set[str]:
    """Every unit the tree holds: packages and modules at the top, and the sub-packages
    of the split folders."""
    units: set[str] = set()
    for child in root.iterdir():
        if child.name.startswith(("_", ".")):
            continue
        if child.is_dir() and (child / "__init__.py").exists():
            if child.name in SPLIT:
                units |= {
                    f"{child.name}.{sub.name}"
                    for sub in child.iterdir()
                    if sub.is_dir() and (sub / "__init__.py").exists()
                }
                units |= {
                    f"{child.name}.{m.stem}"
                    for m in child.glob("*.py")
                    if not m.name.startswith("_")
                }
            else:
                units.add(child.name)
        elif child.suffix == ".py":
            units.add(child.stem)
    return units


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.name)
def test_rule_holds(rule: Rule) -> None:
    assert violations(rule, product_files()) == [], rule.why


def test_every_unit_is_in_a_layer() -> None:
    """A new package must be placed in the layers on purpose: each unit has a layer, and
    the layer map names no folder that is gone."""
    on_disk = units_on_disk()
    for unit in sorted(on_disk):
        assert layer_of(unit) >= 0, unit
    assert {u for u in LAYERS if "." in u or u not in SPLIT} <= on_disk | {"apps", "devtools"}
    # the email sender and the ingest edge, among others, are apps
    assert {"apps.email", "apps.ingest", "apps.usage_view", "apps.invoicing"} <= on_disk


def test_relative_imports_of_a_package_init_resolve_from_the_package() -> None:
    assert imported_units(
        "from ...apps.replay import run", "streams.core.billing", is_package=True
    ) == [(1, "apps.replay")]
    assert imported_units("from . import rows", "streams.core.billing", is_package=True) == [
        (1, "core.billing")
    ]


@pytest.mark.parametrize(
    ("module", "source", "unit"),
    [
        (
            "streams.apps.email.sender",
            "from streams.apps.invoicing import worker",
            "apps.invoicing",
        ),
        ("streams.apps.email.sender", "import streams.apps.invoicing.jobs", "apps.invoicing"),
        ("streams.apps.email.sender", "from streams.apps import invoicing", "apps.invoicing"),
        ("streams.apps.replay.run", "from streams import bootstrap", "bootstrap"),
        ("streams.apps.replay.run", "def f():\n    from streams.bootstrap import x\n", "bootstrap"),
        ("streams.core.billing.fencing", "from ...apps.invoicing import worker", "apps.invoicing"),
        ("streams.core.billing.store.usage", "from ....apps.replay import run", "apps.replay"),
        (
            "streams.apps.ops.status",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from streams.apps.invoicing.jobs import JobResult\n",
            "apps.invoicing",
        ),
    ],
)
def test_the_checker_sees_every_form_of_import(module: str, source: str, unit: str) -> None:
    assert [u for _, u in imported_units(source, module)] == [unit]


@pytest.mark.parametrize(
    ("rule_name", "where", "source"),
    [
        ("apps", "apps/email/sender.py", "from streams.apps.invoicing import jobs\n"),
        ("apps", "apps/ops/status.py", "from streams.apps.invoicing.worker import X\n"),
        ("layers", "apps/importers/close_period.py", "from streams import bootstrap\n"),
        ("layers", "core/billing/store/usage.py", "from ....apps.replay import run\n"),
        ("layers", "core/billing/dead_letters.py", "from streams.adapters.kafka import R\n"),
        ("layers", "adapters/kafka.py", "import streams.apps.ops.status\n"),
        ("layers", "adapters/memory/tax.py", "from streams.devtools.stack import x\n"),
        ("layers", "apps/ops/reconcile.py", "from streams.devtools.demo import expected\n"),
        ("layers", "topics.py", "from streams.core.billing import rows\n"),
        ("layers", "devtools/demo/run.py", "from streams.entrypoints import app\n"),
        ("domain", "core/domain/events.py", "from streams.settings import Settings\n"),
        ("domain", "errors.py", "from streams.core.domain.money import Amount\n"),
        ("layers", "errors.py", "from streams.topics import REGISTRY\n"),
    ],
)
def test_a_planted_violation_is_reported(
    tmp_path: Path, rule_name: str, where: str, source: str
) -> None:
    """Each rule can fail: a violating module in a copy of the layout is reported."""
    rule = next(r for r in RULES if r.name == rule_name)
    root = tmp_path / "streams"
    planted = root / where
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(source, encoding="utf-8")
    found = violations(rule, [planted], root)
    assert len(found) == 1 and found[0].startswith(f"streams/{where}:1 imports streams."), found


def test_the_domain_may_import_the_exception_root(tmp_path: Path) -> None:
    root = tmp_path / "streams"
    planted = root / "core" / "domain" / "x.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from streams.errors import InvoicingError\n", encoding="utf-8")
    assert all(violations(r, [planted], root) == [] for r in RULES)


def test_every_project_exception_derives_from_the_root() -> None:
    """Each public exception class of ``streams`` is an ``InvoicingError`` (the private
    ones, which never leave their module, may not be)."""
    import importlib
    import inspect

    from streams.errors import InvoicingError

    strays = []
    for path in product_files():
        if path.name == "__main__.py" or "migrations" in path.parts:
            continue
        module = importlib.import_module(module_name(path, STREAMS))
        for name, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
                and not issubclass(obj, InvoicingError)
            ):
                strays.append(f"{module.__name__}.{name}")
    assert strays == [], "derive from streams.errors.InvoicingError (or a package root)"


def test_removing_a_rule_lets_a_violation_through(tmp_path: Path) -> None:
    """The rules are what refuses: without the layer rule, an upward import passes."""
    root = tmp_path / "streams"
    planted = root / "core" / "billing" / "x.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("from streams.apps.replay import run\n", encoding="utf-8")
    others = [r for r in RULES if r.name != "layers"]
    assert all(violations(r, [planted], root) == [] for r in others)
    assert violations(RULES[0], [planted], root) != []
