"""The schema files on disk and in git: the versions the compatibility check compares against."""

from __future__ import annotations

import subprocess
from pathlib import Path

from streams.devtools.schemas.compat.findings import BaseUnavailable


def read_folder(root: Path) -> dict[str, str]:
    """The ``*.schema.json`` files and ``asyncapi.yaml`` under ``root``, by POSIX path
    relative to it. A missing folder reads as empty.

    Raises:
        OSError: a file cannot be read.
    """
    files: dict[str, str] = {}
    if not root.is_dir():
        return files
    for path in sorted(root.rglob("*")):
        if path.is_file() and (path.name.endswith(".schema.json") or path.name == "asyncapi.yaml"):
            files[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return files


def run_git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            encoding="utf-8",
            check=False,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BaseUnavailable(f"git {' '.join(args)} failed: {exc}") from exc


def read_git_folder(repo: Path, ref: str, folder: str) -> dict[str, str]:
    """The same files as :func:`read_folder`, as committed at ``ref`` (``folder`` is
    relative to the repository root, POSIX form). Empty if ``ref`` has no such folder.

    Raises:
        BaseUnavailable: ``ref`` does not name a commit, or git failed.
    """
    commit = run_git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit.returncode != 0:
        raise BaseUnavailable(f"{ref!r} is not a commit in {repo}")
    sha = commit.stdout.strip()
    prefix = folder.strip("/") + "/"
    listing = run_git(repo, "ls-tree", "-r", "-z", "--name-only", sha, "--", prefix)
    if listing.returncode != 0:
        raise BaseUnavailable(f"git ls-tree {ref}: {listing.stderr.strip()}")
    files: dict[str, str] = {}
    for path in filter(None, listing.stdout.split("\0")):
        name = path.rsplit("/", 1)[-1]
        if not (name.endswith(".schema.json") or name == "asyncapi.yaml"):
            continue
        shown = run_git(repo, "show", f"{sha}:{path}")
        if shown.returncode != 0:
            raise BaseUnavailable(f"git show {ref}:{path}: {shown.stderr.strip()}")
        files[path[len(prefix) :]] = shown.stdout
    return files


def history_bases(repo: Path, folder: str, *, allow_shallow: bool = False) -> list[str]:
    """Every committed version of ``folder`` to compare against when no base is given:
    one commit per distinct tree of the folder, newest first, from ``git log -- folder``
    (the folder's whole history, so a breaking commit stays refused after later
    commits). Empty when the folder was never committed.

    Raises:
        BaseUnavailable: the repository is a shallow clone (its history of
            ``folder`` is incomplete: ``git fetch --unshallow``, or pass a base) and
            ``allow_shallow`` is False, or git failed.
    """
    shallow = run_git(repo, "rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        raise BaseUnavailable(f"git rev-parse failed in {repo}: {shallow.stderr.strip()}")
    if shallow.stdout.strip() == "true" and not allow_shallow:
        raise BaseUnavailable(
            f"{repo} is a shallow clone: the history of {folder}/ is incomplete, so a "
            "breaking change could pass unseen; run `git fetch --unshallow` or pass --base REF"
        )
    head = run_git(repo, "rev-parse", "--verify", "--quiet", "HEAD")
    if head.returncode != 0:
        return []  # no commit yet
    log = run_git(repo, "log", "--format=%H", "HEAD", "--", folder)
    if log.returncode != 0:
        raise BaseUnavailable(f"git log -- {folder} failed: {log.stderr.strip()}")
    bases: list[str] = []
    seen: set[str] = set()
    for commit in log.stdout.split():
        tree = run_git(repo, "rev-parse", "--verify", "--quiet", f"{commit}:{folder}")
        key = tree.stdout.strip() if tree.returncode == 0 else f"none:{commit}"
        if key not in seen:
            seen.add(key)
            bases.append(commit)
    return bases
