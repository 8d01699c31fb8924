"""CI smoke of the benchmark harness: ``python -m benchmarks run --set smoke`` runs on
the real stack and prints every row beside a baseline measured in the same run.

Speed is never asserted (docs/conventions.md "Tests that can fail"): only that the harness ran, that
every scenario produced its rows, and that each row has a measured baseline and a ratio, in the JSON
report and in the printed table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Rows per scenario of the smoke set (benchmarks/scenarios.py): every row must be there.
ROWS_PER_SCENARIO = {
    "FOCUS import": 1,
    "usage ingest": 2,  # vs COPY, vs the bare consumer
    "fencing": 1,  # one invoice size in smoke
    "close": 5,  # → issued, → email, issued → email, lines/s, the close command
    "memory": 2,  # during the close, linearity
    "replay": 2,  # whole run, re-read phase
    "idle latency": 6,  # p50/p99 of three spans
    "one partition": 2,
    "linearity": 1,
    "incident": 5,  # N and 1 workers: → email, → issued; N against 1
}


@pytest.mark.timeout(600)
def test_bench_smoke_prints_every_row_with_a_same_run_baseline(tmp_path: Path) -> None:
    report = tmp_path / "bench-smoke.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "--set", "smoke", "--json", str(report)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-6000:]}"

    document = json.loads(report.read_text())
    assert document["set"] == "smoke"
    assert document["machine"]["commit"]
    (run,) = document["runs"]
    assert "error" not in run, run
    rows = run["rows"]
    counts = Counter(row["scenario"] for row in rows)
    assert dict(counts) == ROWS_PER_SCENARIO, [(r["scenario"], r["figure"]) for r in rows]
    for row in rows:
        assert row["baseline"], row
        assert row["baseline_value"] > 0, row
        assert row["ratio"] is not None and row["ratio"] > 0, row
        assert row["value"] > 0, row

    printed = " ".join(proc.stdout.split())
    assert "bench --set smoke" in printed
    for row in rows:
        line = " ".join(row["figure"].split())
        assert line in printed, f"row not printed: {row['figure']!r}\n{proc.stdout[-4000:]}"
        assert " ".join(row["baseline"].split()) in printed, row["baseline"]
