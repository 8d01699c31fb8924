"""Rows of a benchmark run, the rich table and the JSON report.

Every row is a figure next to its baseline measured in the same run, and their
ratio ``value / baseline``. For rates (``kind="rate"``) a ratio below 1 means
slower than the baseline; for durations and lower bounds (``kind="time"``) a
ratio above 1 means slower than the baseline. ``target`` is the target for
that ratio (docs/benchmarks.md "Targets"), shown for context and never asserted.
"""

from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table


@dataclass(frozen=True)
class Row:
    """One line of the table."""

    scenario: str
    figure: str
    value: float
    unit: str
    baseline: str
    baseline_value: float
    baseline_unit: str
    kind: Literal["rate", "time", "size"]
    target: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline_value == 0:
            return None
        return self.value / self.baseline_value

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


@dataclass
class RunReport:
    """One run of a set: its rows, timings of its phases, and what was measured how."""

    set_name: str
    sizes: dict[str, Any]
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    rows: list[Row] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def to_dict(self) -> dict[str, Any]:
        return {
            "set": self.set_name,
            "sizes": self.sizes,
            "started_at": self.started_at,
            "wall_s": self.wall_s,
            "phases_s": self.phases,
            "rows": [r.to_dict() for r in self.rows],
            "details": self.details,
        }


def _num(value: float, unit: str) -> str:
    if unit in ("s", "ms"):
        return f"{value:,.3f}" if value < 10 else f"{value:,.1f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def table(report: RunReport) -> Table:
    """The run as a rich table: scenario, figure, value, baseline, ratio, target."""
    t = Table(
        title=f"bench --set {report.set_name} ({report.started_at[:19]}Z, {report.wall_s:,.0f} s)",
        show_lines=False,
    )
    for col, justify in (
        ("scenario", "left"),
        ("figure", "left"),
        ("value", "right"),
        ("baseline (same run)", "left"),
        ("baseline", "right"),
        ("ratio", "right"),
        ("target", "left"),
    ):
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in report.rows:
        ratio = row.ratio
        t.add_row(
            row.scenario,
            row.figure,
            f"{_num(row.value, row.unit)} {row.unit}",
            row.baseline,
            f"{_num(row.baseline_value, row.baseline_unit)} {row.baseline_unit}",
            "-" if ratio is None else f"{ratio:.3f}",
            row.target,
        )
    return t


def print_report(report: RunReport, console: Console) -> None:
    console.print(table(report))
    notes = [(r.figure, r.note) for r in report.rows if r.note]
    for figure, note in notes:
        console.print(f"  [dim]{figure}: {note}[/]")


def machine_notes(home: Path) -> dict[str, Any]:
    """Where and on what the run happened: commit, CPU, memory, load."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(home), *args], capture_output=True, text=True, check=True
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "?"

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = []
    import os

    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "branch": git("rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "loadavg_at_start": load,
        "kernel": platform.release(),
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def markdown(document: dict[str, Any]) -> str:
    """The runs of a JSON report as markdown tables (for docs/benchmarks.md)."""
    out: list[str] = []
    machine = document.get("machine", {})
    out.append(
        f"`{document.get('command', '')}` at commit {machine.get('commit', '?')} "
        f"({machine.get('cpus', '?')} x {machine.get('cpu', '?')}, load at start "
        f"{' '.join(machine.get('loadavg_at_start', []))})"
    )
    for i, run in enumerate(document.get("runs", []), start=1):
        out.append("")
        if "error" in run:
            out.append(f"run {i}: failed: {run['error']}")
            if not run.get("rows"):
                continue
        out.append(f"run {i} ({run['started_at'][:19]}Z, wall {run['wall_s']:,.0f} s)")
        out.append("")
        out.append(
            "| scenario | figure | value | baseline (same run) | baseline | ratio | target |"
        )
        out.append("|---|---|---:|---|---:|---:|---|")
        for row in run["rows"]:
            ratio = row.get("ratio")
            out.append(
                f"| {row['scenario']} | {row['figure']} | {_num(row['value'], row['unit'])} "
                f"{row['unit']} | {row['baseline']} | "
                f"{_num(row['baseline_value'], row['baseline_unit'])} {row['baseline_unit']} | "
                f"{'-' if ratio is None else f'{ratio:.3f}'} | {row.get('target', '')} |"
            )
    return "\n".join(out) + "\n"


def markdown_compare(documents: list[dict[str, Any]]) -> str:
    """Every run of ``documents`` side by side, one row per figure: each cell is
    ``value / baseline = ratio`` of that run (for docs/benchmarks.md)."""
    runs = [(doc, run) for doc in documents for run in doc.get("runs", []) if run.get("rows")]
    keys: list[tuple[str, str]] = []
    cells: dict[tuple[str, str], dict[int, str]] = {}
    meta: dict[tuple[str, str], tuple[str, str]] = {}
    for i, (_doc, run) in enumerate(runs):
        for row in run["rows"]:
            key = (row["scenario"], row["figure"])
            if key not in cells:
                keys.append(key)
                cells[key] = {}
                meta[key] = (row["baseline"], row.get("target", ""))
            ratio = row.get("ratio")
            cells[key][i] = (
                f"{_num(row['value'], row['unit'])} {row['unit']} / "
                f"{_num(row['baseline_value'], row['baseline_unit'])} {row['baseline_unit']} = "
                f"**{'-' if ratio is None else f'{ratio:.3f}'}**"
            )
    head = " | ".join(
        f"run {i + 1} ({run['started_at'][11:16]}Z, {doc['machine'].get('commit', '?')})"
        for i, (doc, run) in enumerate(runs)
    )
    out = [
        f"| scenario | figure | baseline (same run) | {head} | target |",
        "|---|---|---|" + "---|" * len(runs) + "---|",
    ]
    for key in keys:
        baseline, target = meta[key]
        values = " | ".join(cells[key].get(i, "") for i in range(len(runs)))
        out.append(f"| {key[0]} | {key[1]} | {baseline} | {values} | {target} |")
    return "\n".join(out) + "\n"
