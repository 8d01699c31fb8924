"""The incident drill without services: the naive design's isolation, the customer set,
the report's expectations."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from streams.devtools.drill.config import DrillConfig
from streams.devtools.drill.customers import generate_customers, usage_events
from streams.devtools.drill.report import DrillReport, duplicate_counts, spread

STREAMS = Path(__file__).resolve().parents[2] / "streams"
NAIVE = "streams.devtools.drill.naive"


def imports_of_naive(source: str, filename: str = "<source>") -> list[str]:
    """``"<line>: <how>"`` for every way ``source`` imports the naive module:
    ``import streams.devtools.drill.naive``, ``from streams.devtools.drill import naive``,
    ``from streams.devtools.drill.naive import …``, relative forms, and
    ``importlib.import_module``/``__import__`` with the name as a literal."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            found += [
                f"{node.lineno}: import {a.name}"
                for a in node.names
                if a.name == NAIVE or a.name.startswith(NAIVE + ".")
            ]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0 and (module == NAIVE or module.startswith(NAIVE + ".")):
                found.append(f"{node.lineno}: from {module}")
            elif (node.level == 0 and module == "streams.devtools.drill") or (
                node.level > 0 and module in ("", "drill")
            ):
                found += [
                    f"{node.lineno}: from {module} import naive"
                    for a in node.names
                    if a.name == "naive"
                ]
            elif node.level > 0 and module in ("naive", "drill.naive"):
                found.append(f"{node.lineno}: from {'.' * node.level}{module}")
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == NAIVE
        ):
            found.append(f"{node.lineno}: dynamic import of {NAIVE}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "import streams.devtools.drill.naive",
        "import streams.devtools.drill.naive as n",
        "from streams.devtools.drill import naive",
        "from streams.devtools.drill.naive import run_naive",
        "def f():\n    from streams.devtools.drill.naive import NaiveWorker",
        "import importlib\nimportlib.import_module('streams.devtools.drill.naive')",
        "__import__('streams.devtools.drill.naive')",
        "from .drill import naive",
        "from ..drill.naive import run_naive",
    ],
)
def test_the_detector_catches_every_form_of_import(source: str) -> None:
    assert imports_of_naive(source)


@pytest.mark.parametrize(
    "source",
    [
        "import streams.devtools.drill",
        "from streams.devtools.drill import safe",
        "from streams.devtools.drill.report import DrillReport",
        "x = 'streams.devtools.drill.naive is documented here'",
    ],
)
def test_the_detector_ignores_other_imports(source: str) -> None:
    assert imports_of_naive(source) == []


def test_no_module_outside_streams_drill_imports_the_naive_design() -> None:
    """The design that failed (docs/design.md "The incident") is reproduced in
    streams/devtools/drill/naive.py for the drill only; the pipeline must never use it."""
    offenders = []
    checked = 0
    for path in sorted(STREAMS.rglob("*.py")):
        if STREAMS / "devtools" / "drill" in path.parents:
            continue
        checked += 1
        offenders += [
            f"{path.relative_to(STREAMS.parent)}:{hit}"
            for hit in imports_of_naive(path.read_text(encoding="utf-8"), str(path))
        ]
    assert checked > 30  # the walk found the package
    assert offenders == []


def test_only_the_drill_command_runs_the_naive_design() -> None:
    users = sorted(
        path.name
        for path in (STREAMS / "devtools" / "drill").glob("*.py")
        if path.name != "naive.py" and imports_of_naive(path.read_text(encoding="utf-8"))
    )
    assert users == ["run.py"]


# --------------------------------------------------------------------------- customers


def test_the_seed_makes_the_customer_set_deterministic() -> None:
    config = DrillConfig(customers=40, large_lines=(100, 200), small_lines=(2, 9), seed=11)
    first = generate_customers(config, "aaa")
    again = generate_customers(config, "bbb")
    assert [(c.large, c.lines) for c in first] == [(c.large, c.lines) for c in again]
    assert [c.customer_id for c in first][:2] == ["drill-s11-aaa-0000", "drill-s11-aaa-0001"]
    other = generate_customers(
        DrillConfig(customers=40, large_lines=(100, 200), small_lines=(2, 9), seed=12), "aaa"
    )
    assert [c.lines for c in other] != [c.lines for c in first]


def test_customer_sizes_follow_the_config() -> None:
    config = DrillConfig(customers=50, large_share=0.1, large_lines=(100, 200), small_lines=(2, 9))
    customers = generate_customers(config, "t")
    large = [c for c in customers if c.large]
    assert len(large) == 5 == config.large_count
    assert all(100 <= len(c.lines) <= 200 for c in large)
    assert all(2 <= len(c.lines) <= 9 for c in customers if not c.large)
    assert all(
        line.amount > 0 and line.amount.as_tuple().exponent == -4
        for c in customers
        for line in c.lines
    )


def test_usage_events_carry_every_line_once_with_deterministic_ids() -> None:
    customer = generate_customers(DrillConfig(customers=1, small_lines=(3, 3)), "t")[0]
    events = list(usage_events(customer, "2025-01"))
    assert [e.type for e in events] == ["customer.upserted"] + ["usage.recorded"] * 3
    assert sum(e.data.amount for e in events[1:]) == customer.subtotal
    assert [e.id for e in events] == [e.id for e in usage_events(customer, "2025-01")]
    assert len({e.id for e in events}) == 4


def test_sizes_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError):
        generate_customers(DrillConfig(customers=0), "t")
    with pytest.raises(ValueError):
        generate_customers(DrillConfig(large_lines=(10, 5)), "t")


# --------------------------------------------------------------------------- report


def _report(mode: str, **counts: int) -> DrillReport:
    return DrillReport(
        mode=mode,  # type: ignore[arg-type]
        seed=1,
        run_tag="t",
        period="2025-01",
        customers=10,
        large_customers=1,
        workers=2,
        lease="x",
        **counts,  # type: ignore[arg-type]
    )


def test_duplicate_counts() -> None:
    assert duplicate_counts({"a": 1, "b": 2, "c": 3, "d": 4}) == (1 + 2 + 3, 1, 2)
    assert duplicate_counts({}) == (0, 0, 0)


def test_naive_holds_only_when_it_reproduced_duplicates() -> None:
    assert not _report("naive", invoices=10).ok
    assert _report("naive", invoices=11, duplicate_invoices=1).ok


@pytest.mark.parametrize(
    ("counts", "ok"),
    [
        ({"invoices": 10, "emails": 10}, True),
        ({"invoices": 11, "duplicate_invoices": 1}, False),
        ({"duplicate_emails": 1}, False),
        ({"missing": 1}, False),
        ({"unemailed": 1}, False),
    ],
)
def test_safe_holds_only_without_duplicates_or_gaps(counts: dict[str, int], ok: bool) -> None:
    assert _report("safe", **counts).ok is ok


def test_both_modes_print_the_same_rows() -> None:
    naive = [metric for metric, _, _ in _report("naive").rows()]
    safe = [metric for metric, _, _ in _report("safe").rows()]
    assert naive == safe
    assert {
        "duplicate invoices",
        "duplicate emails",
        "writes refused by fencing",
        "wall time",
    } <= set(naive)


def test_spread() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == (1.0, 2.5, 10.0)
    assert spread([]) == (0.0, 0.0, 0.0)
