"""Every command's ``--help`` as a user reads it (typer's CliRunner renders it): flags
show no type, no doubled ``--no-no-`` switch, no reStructuredText markup, a
``--version``, and ``replay`` says it needs exactly one of ``--dry-run`` / ``--apply``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from streams.entrypoints.app import app
from streams.entrypoints.help import package_version

runner = CliRunner()

#: reStructuredText that help must not show: ``literals`` and :role:`targets`.
RST = re.compile(r"``|:(?:func|class|mod|meth|attr|data|exc):`")


def command_paths() -> Iterator[tuple[str, ...]]:
    """The path of every command and group of the ``invoicing`` app (root included)."""
    root = typer.main.get_command(app)

    def walk(cmd: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield path
        # typer's own click: a group is what has sub-commands
        if isinstance(getattr(cmd, "commands", None), dict):
            for name, sub in cmd.commands.items():
                yield from walk(sub, (*path, name))

    yield from walk(root, ())


PATHS = list(command_paths())


def help_of(*path: str) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_walk_finds_the_commands() -> None:
    assert ("replay",) in PATHS and ("stack", "up") in PATHS and ("outbox", "prune") in PATHS
    assert len(PATHS) > 40


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "invoicing")
def test_help_reads_clean(path: tuple[str, ...]) -> None:
    text = help_of(*path)
    assert "<bool>" not in text, "a flag takes no value: its help shows no type"
    assert "--no-no-" not in text
    assert not RST.search(text), f"reStructuredText in help: {RST.search(text)}"


def test_flags_show_no_type_and_valued_options_keep_theirs() -> None:
    text = help_of("replay")
    dry_run = next(line for line in text.splitlines() if "--dry-run " in line)
    assert "<" not in dry_run
    margin = next(line for line in text.splitlines() if "--margin-days" in line)
    assert "<float>" in margin


def test_stack_up_provision_switch() -> None:
    text = help_of("stack", "up")
    assert "--provision" in text and "--no-provision" in text
    assert "[default: provision]" in text


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"invoicing {package_version()}"
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())
    assert "--version" in help_of()


def test_replay_says_exactly_one_mode() -> None:
    text = " ".join(help_of("replay").split())
    assert "exactly one of --dry-run and --apply" in text
    assert "Mode (exactly one is required)" in text


def test_replay_refuses_neither_and_both_modes() -> None:
    for args in (["replay", "2026-01"], ["replay", "2026-01", "--dry-run", "--apply"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert "exactly one of --dry-run and --apply" in result.output


def test_outbox_prune_help_is_plain_text() -> None:
    text = help_of("outbox", "prune")
    assert "prune_outbox()" in text and "``" not in text
