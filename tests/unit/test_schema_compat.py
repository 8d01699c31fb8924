"""The compatibility check: the pure comparison, the folder comparison and the command."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from streams.devtools.schemas.compat import (
    BaseUnavailable,
    breaking_changes,
    check_compat,
    compare_trees,
    history_bases,
    read_folder,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
INVOICE = "billing.invoices.v1/invoice.issued.schema.json"


def load(relative: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((SCHEMAS / relative).read_text(encoding="utf-8"))
    return document


def changed(relative: str, edit: Callable[[dict[str, Any]], None]) -> list[str]:
    old = load(relative)
    new = copy.deepcopy(old)
    edit(new)
    return breaking_changes(old, new)


# --------------------------------------------------------------------------- pure function


def test_identical_and_annotation_only_changes_are_compatible() -> None:
    assert changed(INVOICE, lambda s: None) == []

    def annotate(s: dict[str, Any]) -> None:
        s["description"] = "reworded"
        s["properties"]["total"]["title"] = "Grand total"
        s["$defs"]["TaxAmount"]["description"] = "x"
        s["x-owner"] = "billing"

    assert changed(INVOICE, annotate) == []


def test_a_removed_field_is_refused() -> None:
    def remove(s: dict[str, Any]) -> None:
        del s["properties"]["total"]
        s["required"].remove("total")

    assert changed(INVOICE, remove) == ["field 'total': field removed"]


def test_a_removed_nested_field_is_refused_with_its_path() -> None:
    def remove(s: dict[str, Any]) -> None:
        del s["$defs"]["TaxAmount"]["properties"]["rate"]
        s["$defs"]["TaxAmount"]["required"].remove("rate")

    assert changed(INVOICE, remove) == ["field 'taxes[].rate': field removed"]


def test_a_retyped_field_is_refused() -> None:
    def retype(s: dict[str, Any]) -> None:
        s["properties"]["total"] = {"type": "integer", "title": "Total"}

    problems = changed(INVOICE, retype)
    assert problems == ["field 'total': type changed or narrowed from string to integer"]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"type": "number"}, {"type": "integer"}),  # narrowed
        ({"type": "integer"}, {"type": "number"}),  # widened: consumers parse integers
        ({"anyOf": [{"type": "string"}, {"type": "null"}]}, {"type": "string"}),
        ({"type": "string"}, {"anyOf": [{"type": "string"}, {"type": "null"}]}),
        ({"type": "string"}, {"type": ["string", "integer"]}),
        ({}, {"type": "string"}),
    ],
)
def test_any_type_change_is_refused(before: dict[str, Any], after: dict[str, Any]) -> None:
    old = {"type": "object", "properties": {"f": before}}
    new = {"type": "object", "properties": {"f": after}}
    [problem] = breaking_changes(old, new)
    assert problem.startswith("field 'f': type changed or narrowed from ")


def test_an_added_optional_field_is_accepted() -> None:
    def add(s: dict[str, Any]) -> None:
        s["properties"]["purchase_order"] = {
            "anyOf": [{"type": "string"}, {"type": "null"}],
            "default": None,
        }

    assert changed(INVOICE, add) == []


def test_a_new_required_field_needs_a_default() -> None:
    def add_required(s: dict[str, Any]) -> None:
        s["properties"]["purchase_order"] = {"type": "string"}
        s["required"].append("purchase_order")

    assert changed(INVOICE, add_required) == [
        "field 'purchase_order': new required field without default"
    ]

    def add_with_default(s: dict[str, Any]) -> None:
        s["properties"]["purchase_order"] = {"type": "string", "default": ""}
        s["required"].append("purchase_order")

    assert changed(INVOICE, add_with_default) == []


def test_an_optional_field_becoming_required_is_refused() -> None:
    def require(s: dict[str, Any]) -> None:
        del s["properties"]["supersedes_invoice_id"]["default"]
        s["required"].append("supersedes_invoice_id")

    assert changed(INVOICE, require) == [
        "field 'supersedes_invoice_id': optional field became required"
    ]


def test_enum_narrowing_is_refused_and_widening_accepted() -> None:
    closed = "billing.account-events.v1/billing_period.closed.schema.json"

    def narrow(s: dict[str, Any]) -> None:
        s["properties"]["reason"]["enum"] = ["period_closed", "draft_finalize"]

    assert changed(closed, narrow) == ["field 'reason': allowed value(s) \"hold_released\" removed"]

    def widen(s: dict[str, Any]) -> None:
        s["properties"]["reason"]["enum"].append("manual")

    assert changed(closed, widen) == []

    def restrict(s: dict[str, Any]) -> None:
        s["properties"]["customer_name"]["enum"] = ["ACME"]

    assert changed(INVOICE, restrict) == ["field 'customer_name': values restricted to \"ACME\""]

    def bump_const(s: dict[str, Any]) -> None:
        s["properties"]["schema_version"]["const"] = 2

    assert changed(INVOICE, bump_const) == ["field 'schema_version': allowed value(s) 1 removed"]


def test_tightened_constraints_are_refused_and_loosened_accepted() -> None:
    def lower(s: dict[str, Any]) -> None:
        s["properties"]["customer_id"]["maxLength"] = 64

    assert changed(INVOICE, lower) == ["field 'customer_id': maxLength lowered from 128 (now 64)"]

    def raise_(s: dict[str, Any]) -> None:
        s["properties"]["customer_id"]["maxLength"] = 256

    assert changed(INVOICE, raise_) == []

    def add_pattern(s: dict[str, Any]) -> None:
        s["properties"]["invoice_number"]["pattern"] = "^INV-"

    assert changed(INVOICE, add_pattern) == ["field 'invoice_number': pattern '^INV-' added"]

    def change_pattern(s: dict[str, Any]) -> None:
        s["properties"]["currency"]["pattern"] = "^[A-Z]{3}[A-Z]?$"

    assert changed(INVOICE, change_pattern) == [
        "field 'currency': pattern changed from '^[A-Z]{3}$' to '^[A-Z]{3}[A-Z]?$'"
    ]

    def drop_pattern(s: dict[str, Any]) -> None:
        del s["properties"]["currency"]["pattern"]

    assert changed(INVOICE, drop_pattern) == []

    def add_minimum(s: dict[str, Any]) -> None:
        s["properties"]["line_count"]["minimum"] = 1
        s["properties"]["invoice_id"]["format"] = "uuid"
        s["properties"]["taxes"]["maxItems"] = 10

    assert changed(INVOICE, add_minimum) == [
        "field 'invoice_id': format 'uuid' added",
        "field 'line_count': minimum raised from 0 (now 1)",
        "field 'taxes': maxItems added (now 10)",
    ]


def test_closing_an_open_object_is_refused() -> None:
    old = {"type": "object", "properties": {"a": {"type": "string"}}}
    new = {**old, "additionalProperties": False}
    assert breaking_changes(old, new) == ["(root): additionalProperties false added (was open)"]
    assert breaking_changes(new, old) == []


def test_key_and_header_schemas_compare_too() -> None:
    def shorter(s: dict[str, Any]) -> None:
        s["maxLength"] = 64

    assert changed("billing.invoices.v1/key.schema.json", shorter) == [
        "(root): maxLength lowered from 128 (now 64)"
    ]

    def drop_header(s: dict[str, Any]) -> None:
        del s["properties"]["document_id"]
        s["required"].remove("document_id")

    assert changed("billing.invoices.v1/headers.schema.json", drop_header) == [
        "field 'document_id': field removed"
    ]


def test_every_committed_schema_is_compatible_with_itself() -> None:
    files = read_folder(SCHEMAS)
    assert len(files) >= 13 and "asyncapi.yaml" in files
    assert compare_trees(files, files) == []


# --------------------------------------------------------------------------- folders


def test_folder_comparison_names_topic_and_message() -> None:
    old = read_folder(SCHEMAS)
    new = dict(old)
    issued = json.loads(new[INVOICE])
    issued["properties"]["total"]["type"] = "number"
    new[INVOICE] = json.dumps(issued)
    del new["billing.invoices.v1/invoice.voided.schema.json"]
    assert [str(p) for p in compare_trees(old, new)] == [
        "billing.invoices.v1 invoice.issued: field 'total': type changed or narrowed from "
        "string to number",
        "billing.invoices.v1 invoice.voided: schema removed",
    ]


def test_a_breaking_change_on_a_new_topic_version_is_accepted() -> None:
    old = read_folder(SCHEMAS)
    moved = {
        path.replace("billing.invoices.v1/", "billing.invoices.v2/"): text
        for path, text in old.items()
    }
    issued = json.loads(moved["billing.invoices.v2/invoice.issued.schema.json"])
    del issued["properties"]["total"]
    moved["billing.invoices.v2/invoice.issued.schema.json"] = json.dumps(issued)
    assert compare_trees(old, moved) == []
    # ... but removing a topic without a successor is refused.
    dropped = {k: v for k, v in old.items() if not k.startswith("billing.invoices.v1/")}
    assert [str(p) for p in compare_trees(old, dropped)] == [
        "billing.invoices.v1 *: topic removed without a successor version"
    ]


def test_channel_changes_in_the_asyncapi_document_are_refused() -> None:
    old = read_folder(SCHEMAS)
    new = dict(old)
    new["asyncapi.yaml"] = (
        old["asyncapi.yaml"]
        .replace("partitions: 12", "partitions: 24", 1)
        .replace("retention.ms: -1", "retention.ms: 604800000", 1)
    )
    assert [p.detail.split(" (")[0] for p in compare_trees(old, new)] == [
        "partition count changed from 12 to 24",
        "retention.ms lowered from -1 to 604800000",
    ]


# --------------------------------------------------------------------------- git + command


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A throwaway git repository whose first commit holds a copy of schemas/."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "test@example.invalid")
    git(repo, "config", "user.name", "test")
    shutil.copytree(SCHEMAS, repo / "schemas")
    git(repo, "add", "schemas")
    git(repo, "commit", "-q", "-m", "schemas")
    return repo


def run_command(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streams.entrypoints.schemas", "check-compat", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_command_against_a_git_repository(repo: Path) -> None:
    # A single commit: compared with itself, passes (a fresh clone with no difference).
    assert history_bases(repo, "schemas") == [git(repo, "rev-parse", "HEAD")]
    first = run_command(repo)
    assert first.returncode == 0, first.stderr
    assert "compatible with 1 committed version" in " ".join(first.stderr.split())

    # An added optional field, committed: accepted against the previous commit.
    path = repo / "schemas" / INVOICE
    schema = json.loads(path.read_text(encoding="utf-8"))
    schema["properties"]["purchase_order"] = {"type": "string", "default": ""}
    path.write_text(json.dumps(schema, indent=2), encoding="utf-8")
    git(repo, "commit", "-q", "-am", "add an optional field")
    assert history_bases(repo, "schemas") == [
        git(repo, "rev-parse", "HEAD"),
        git(repo, "rev-parse", "HEAD~1"),
    ]
    added = run_command(repo)
    assert added.returncode == 0, added.stderr
    assert "compatible with" in added.stderr

    # A removed field in the working tree: refused, naming topic, message, field and why.
    del schema["properties"]["total"]
    schema["required"].remove("total")
    path.write_text(json.dumps(schema, indent=2), encoding="utf-8")
    removed = run_command(repo)
    assert removed.returncode == 1
    assert "billing.invoices.v1 invoice.issued: field 'total': field removed" in " ".join(
        removed.stderr.split()
    )
    # ... against any ref given with --base, too; an unknown ref exits 2.
    assert run_command(repo, "--base", "HEAD").returncode == 1
    unknown = run_command(repo, "--base", "no-such-ref")
    assert unknown.returncode == 2
    with pytest.raises(BaseUnavailable):
        check_compat(repo / "schemas", "no-such-ref")

    # The same change moved to a new topic version is accepted.
    v2 = repo / "schemas" / "billing.invoices.v2"
    shutil.move(repo / "schemas" / "billing.invoices.v1", v2)
    report = check_compat(repo / "schemas")
    assert report.ok, report.problems


def test_a_committed_breaking_change_stays_refused_after_later_commits(repo: Path) -> None:
    path = repo / "schemas" / INVOICE
    schema = json.loads(path.read_text(encoding="utf-8"))
    del schema["properties"]["total"]
    schema["required"].remove("total")
    path.write_text(json.dumps(schema, indent=2), encoding="utf-8")
    git(repo, "commit", "-q", "-am", "break: remove total")
    (repo / "README").write_text("unrelated\n", encoding="utf-8")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "an unrelated commit on top")
    result = run_command(repo)
    assert result.returncode == 1, result.stderr
    assert "field 'total': field removed" in " ".join(result.stderr.split())


def test_a_shallow_clone_is_refused(repo: Path, tmp_path: Path) -> None:
    (repo / "README").write_text("second commit\n", encoding="utf-8")
    git(repo, "add", "README")
    git(repo, "commit", "-q", "-m", "second")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow))
    result = run_command(shallow)
    assert result.returncode == 2, result.stderr
    assert "shallow clone" in " ".join(result.stderr.split())
    # an explicit base still works there
    assert run_command(shallow, "--base", "HEAD").returncode == 0
    # ... or, explicitly weaker, against the commits the clone has
    assert run_command(shallow, "--allow-shallow").returncode == 0
