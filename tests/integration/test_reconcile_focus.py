"""``invoicing reconcile --focus FILE`` against the real stack: the FOCUS sample invoiced
by the pipeline, then compared with the file (all match) and with tampered copies
(the difference reported, exit 1)."""

from __future__ import annotations

import csv
import json
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streams.apps.ops.focus_expected import expected_from_file
from streams.bootstrap import run_close_period, run_import_focus
from streams.entrypoints.app import app
from streams.settings import Settings
from tests.support.pipeline import Pipeline, isolated_pipeline

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "focus" / "focus_sample.csv"
EXPECTED = expected_from_file(SAMPLE)
PAIRS = len(EXPECTED.sums)


@pytest.fixture(scope="module")
def invoiced(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory, stack: str
) -> Iterator[Pipeline]:
    """The sample imported, invoiced by 2 workers (no email sender: not needed here)."""
    with isolated_pipeline(
        settings, f"rf{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("rf"),
        connector=False, smtp=False,  # invoices only: no event or email is read here
    ) as p:  # fmt: skip
        summary = run_import_focus(SAMPLE, p.settings, progress=False)
        assert summary.produced == EXPECTED.rows
        p.workers.start("invoicing", 2)
        for period in EXPECTED.periods:
            run_close_period(period, p.settings, progress=False)
        deadline = time.monotonic() + 300  # generous: the slowest CI box, under every other tier
        issued = 0
        with p.connect() as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM invoices WHERE status = 'issued'"
                ).fetchone()
                issued = int(row[0]) if row else 0
                if issued == PAIRS:
                    break
                time.sleep(0.5)
        assert issued == PAIRS, p.worker_logs()
        yield p


def reconcile(p: Pipeline, path: Path, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["reconcile", "--focus", str(path), *extra], env=p.env)
    return result.exit_code, result.output


def test_every_invoice_of_the_sample_matches_its_file(invoiced: Pipeline) -> None:
    code, output = reconcile(invoiced, SAMPLE, "--json")
    assert code == 0, output
    report = json.loads(output)
    assert report["ok"] is True and report["rows"] == 1000
    assert report["counts"] == {"match": PAIRS, "mismatch": 0, "missing": 0, "unexpected": 0}
    by_pair = {(p["customer_id"], p["period"]): p for p in report["pairs"]}
    largest = max(EXPECTED.sums, key=lambda key: EXPECTED.sums[key])
    assert by_pair[largest]["exact_billed_cost"] == "13.61648254970"
    assert by_pair[largest]["rounded"] == by_pair[largest]["invoice_subtotal"] == "13.62"
    assert by_pair[largest]["invoice_number"].startswith("INV-")

    code, table = reconcile(invoiced, SAMPLE)
    assert code == 0, table
    assert f"{PAIRS} match, 0 mismatch, 0 missing, 0 unexpected" in table
    assert "13.61648254970" in table


def tampered(tmp_path: Path) -> tuple[Path, str, str, str]:
    """A copy of the sample with one cent added to the first row's cost, every row of
    another account removed, and a row of an account the pipeline never saw."""
    with SAMPLE.open(newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.reader(handle))
    header, body = rows[0], rows[1:]
    cost, account, row_id = (header.index(n) for n in ("BilledCost", "SubAccountId", "Id"))
    changed = body[0][account]
    body[0][cost] = format(Decimal(body[0][cost]) + Decimal("0.01"), "f")
    dropped = next(r[account] for r in body if r[account] != changed)
    body = [r for r in body if r[account] != dropped]
    ghost = list(body[1])
    ghost[account], ghost[row_id] = "ghost-account", "ghost-row-1"
    body.append(ghost)
    path = tmp_path / "tampered.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([header, *body])
    return path, changed, dropped, "ghost-account"


def test_a_tampered_file_reports_each_difference_and_exits_1(
    invoiced: Pipeline, tmp_path: Path
) -> None:
    path, changed, dropped, ghost = tampered(tmp_path)
    code, output = reconcile(invoiced, path, "--json")
    assert code == 1, output
    report = json.loads(output)
    assert report["ok"] is False
    verdicts = {
        (p["customer_id"], p["verdict"]) for p in report["pairs"] if p["verdict"] != "match"
    }
    assert verdicts == {(changed, "mismatch"), (dropped, "unexpected"), (ghost, "missing")}
    assert report["counts"]["match"] == PAIRS - 2
    mismatch = next(p for p in report["pairs"] if p["verdict"] == "mismatch")
    assert Decimal(mismatch["rounded"]) != Decimal(mismatch["invoice_subtotal"])

    code, table = reconcile(invoiced, path)
    assert code == 1
    lines = {line.split()[-1]: line for line in table.splitlines() if line.startswith("2024-")}
    assert " mismatch " in lines[changed] and " unexpected " in lines[dropped]
    assert "(none)" in lines[ghost] and " missing " in lines[ghost]


def test_an_unreadable_file_exits_2(invoiced: Pipeline, tmp_path: Path) -> None:
    code, output = reconcile(invoiced, tmp_path / "absent.csv")
    assert code == 2 and "cannot read" in output
