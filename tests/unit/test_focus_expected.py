"""The FOCUS oracle (:mod:`streams.apps.ops.focus_expected`, the answer the FOCUS demo,
the reconciliation and the integration tests compare invoices with) stays independent of
the code it checks: it reads the CSV with the standard ``csv`` module and sums with
``Decimal``; it imports nothing of the project, and running it loads none of the
importer, the domain or the billing kernel (as the pricing oracle's test checks for
the rating code)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from streams.apps.ops import focus_expected

ORACLE = Path(focus_expected.__file__)
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"


def test_the_oracle_imports_nothing_of_the_project() -> None:
    modules: list[str] = []
    for node in ast.walk(ast.parse(ORACLE.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports"
            modules.append(node.module or "")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            raise AssertionError("no dynamic imports")
    assert modules, "the walk found the imports"
    assert [m for m in modules if m.split(".")[0] == "streams"] == []
    assert {m.split(".")[0] for m in modules} <= {
        "__future__", "collections", "csv", "dataclasses", "datetime", "decimal", "pathlib",
        "typing",
    }  # fmt: skip


def test_running_the_oracle_loads_no_importer_domain_or_kernel_code() -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from streams.apps.ops.focus_expected import expected_from_file\n"
        f"answer = expected_from_file(Path({str(SAMPLE)!r}))\n"
        "assert answer.sums, 'no sums'\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('streams'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = result.stdout.strip().split(",")
    assert "streams.apps.ops.focus_expected" in loaded
    # Only the packages on the way to the module: their __init__ must stay import-free too.
    assert set(loaded) <= {
        "streams", "streams.apps", "streams.apps.ops", "streams.apps.ops.focus_expected",
    }, loaded  # fmt: skip
