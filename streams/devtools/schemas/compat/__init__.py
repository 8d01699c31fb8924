"""Compatibility of schema changes for existing consumers (``invoicing schemas check-compat``).

Policy (docs/subscribing.md, "Compatibility"): within one topic version (the ``.vN``
suffix of the topic name) a contract only grows. Consumers keep reading the topic
from the beginning (retention is infinite), so every record that was valid under
the old schema must stay valid under the new one, and every field they read must
stay there with the type it had. Breaking, for a file that exists before and after:

- a field removed, or a field that was optional becoming required, or a new
  required field without a ``default``;
- a type changed, narrowed or widened (``string`` → ``integer``, ``number`` →
  ``integer``, ``integer`` → ``number``, ``null`` allowed or no longer allowed): code
  written against the old type does not expect the new one;
- an ``enum``/``const`` losing values, or added where any value was allowed;
- a constraint tightened or added: ``maxLength``/``maxItems``/``maximum`` lowered,
  ``minLength``/``minItems``/``minimum`` raised, ``pattern``, ``format`` or
  ``multipleOf`` added or changed, ``additionalProperties: false`` where it was open;
- a schema file (event type, key, headers) removed, a topic removed, or a topic's
  partition count, cleanup policy or retention changed (per-customer order and
  "read from the beginning" are part of the contract; from ``asyncapi.yaml``).

Accepted: adding an optional field, a new event type, a new topic, a new ``enum``
value, loosening a constraint, and any change to annotations (``title``, ``description``, ``examples``,
``x-*``). A breaking change ships on a new topic version: the files move from
``<name>.vN/`` to ``<name>.vM/`` (M > N); the old folder may then disappear.

:func:`breaking_changes` is the pure comparison of two JSON Schemas;
:func:`compare_trees` applies it to two ``schemas/`` folders; :func:`check_compat`
reads the bases from git (``git ls-tree`` / ``git show <ref>:schemas/...``): one
given ref, or by default every committed version of the folder
(:func:`history_bases`), so a breaking commit followed by others is still refused.

Modules: :mod:`~streams.devtools.schemas.compat.schema_diff` (the pure comparison),
:mod:`~streams.devtools.schemas.compat.asyncapi` (the channels' rules),
:mod:`~streams.devtools.schemas.compat.trees` (two folders),
:mod:`~streams.devtools.schemas.compat.policy` (documented exceptions),
:mod:`~streams.devtools.schemas.compat.git` (the committed versions),
:mod:`~streams.devtools.schemas.compat.findings` (errors and findings); this package
holds :func:`check_compat`.

Scope of the comparison: local ``$ref`` (``#/...``) are resolved, ``anyOf``/``oneOf``
branches are matched by type, ``allOf`` members are merged; a remote ``$ref`` that
changes is reported as a change. It errs on the side of reporting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from streams.devtools.schemas.compat.findings import (
    BaseUnavailable,
    CompatError,
    Incompatibility,
    Narrowing,
)
from streams.devtools.schemas.compat.git import (
    history_bases,
    read_folder,
    read_git_folder,
    run_git,
)
from streams.devtools.schemas.compat.policy import (
    EXCEPTIONS_FILE,
    CompatException,
    load_exceptions,
    propose_exceptions,
)
from streams.devtools.schemas.compat.schema_diff import breaking_changes
from streams.devtools.schemas.compat.trees import compare_trees, schema_files


@dataclass(frozen=True)
class CompatReport:
    """What :func:`check_compat` compared and found.

    ``bases``: the commits compared against, newest first (empty = nothing to
    compare); ``compared``: schema files present both on disk and in the newest base;
    ``problems``: every distinct breaking change, each naming the commit it breaks;
    ``accepted``: the breaking changes a documented exception accepts, with its id.
    """

    bases: list[str]
    compared: int
    problems: list[Incompatibility]
    accepted: list[tuple[Incompatibility, str]] = field(default_factory=list)

    @property
    def base(self) -> str | None:
        """The newest base compared against (None: nothing to compare)."""
        return self.bases[0] if self.bases else None

    @property
    def ok(self) -> bool:
        return not self.problems


def check_compat(
    schemas_dir: Path,
    base: str | None = None,
    *,
    allow_shallow: bool = False,
    exceptions: list[CompatException] | None = None,
) -> CompatReport:
    """Compare the ``schemas_dir`` folder as it is on disk against ``base`` in the git
    repository that holds it or, when ``base`` is None, against every committed
    version of the folder (:func:`history_bases`: compatibility is transitive, like
    the Confluent Schema Registry's ``BACKWARD_TRANSITIVE`` mode, because consumers
    read the topics from the beginning). ``allow_shallow``: in a shallow clone,
    compare against the versions it has instead of refusing. ``exceptions``: the
    documented narrowings to accept (default: ``<schemas_dir>/compat-exceptions.yaml``,
    :func:`load_exceptions`); an accepted change is reported in ``accepted``.

    Raises:
        BaseUnavailable: ``base`` was given but cannot be read, the clone is shallow
            (default mode), or git failed.
        CompatError: a schema file is not valid JSON/YAML.
    """
    schemas_dir = schemas_dir.resolve()
    if exceptions is None:
        exceptions = load_exceptions(schemas_dir / EXCEPTIONS_FILE)
    top = run_git(
        schemas_dir if schemas_dir.is_dir() else schemas_dir.parent, "rev-parse", "--show-toplevel"
    )
    if top.returncode != 0:
        if base is not None:
            raise BaseUnavailable(f"{schemas_dir} is not inside a git repository")
        return CompatReport([], 0, [])
    repo = Path(top.stdout.strip())
    folder = schemas_dir.relative_to(repo.resolve()).as_posix()
    refs = [base] if base is not None else history_bases(repo, folder, allow_shallow=allow_shallow)
    new = read_folder(schemas_dir)
    problems: list[Incompatibility] = []
    accepted: list[tuple[Incompatibility, str]] = []
    seen: set[str] = set()
    compared = 0
    for n, ref in enumerate(refs):
        old = read_git_folder(repo, ref, folder)
        if n == 0:
            compared = len(set(schema_files(old)) & set(schema_files(new)))
        for problem in compare_trees(old, new):
            if str(problem) in seen:
                continue
            seen.add(str(problem))
            where = ref[:12] if base is None else ref
            detail: str = f"{problem.detail} (vs {where})"
            if isinstance(problem.detail, Narrowing):
                narrowing = problem.detail
                detail = Narrowing(detail, narrowing.field, narrowing.keyword, narrowing.new)
            noted = Incompatibility(problem.topic, problem.message, detail)
            by = next((e.id for e in exceptions if e.accepts(problem)), None)
            if by is None:
                problems.append(noted)
            else:
                accepted.append((noted, by))
    return CompatReport(refs, compared, problems, accepted)


__all__ = [
    "EXCEPTIONS_FILE",
    "BaseUnavailable",
    "CompatError",
    "CompatException",
    "CompatReport",
    "Incompatibility",
    "Narrowing",
    "breaking_changes",
    "check_compat",
    "compare_trees",
    "history_bases",
    "load_exceptions",
    "propose_exceptions",
    "read_folder",
    "read_git_folder",
]
