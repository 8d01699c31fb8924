"""``docs/configuration.md``, generated from :class:`~streams.settings.Settings`.

:func:`render` is the whole page (every key, its environment variable, type, default
and meaning, from :func:`streams.apps.ops.config.reference`); :func:`write` puts it
in place and :func:`is_current` tells whether the committed page equals it (the drift
check of ``tests/unit/test_config_reference.py``). Regenerate with
``invoicing config reference`` or ``python -m streams.devtools.configref``.
"""

from __future__ import annotations

from pathlib import Path

from streams.apps.ops.config import ENV_DELIMITER, ENV_PREFIX, reference, section_docs

#: The page, relative to the project root.
PAGE = Path("docs") / "configuration.md"

_HEADER = f"""# Configuration reference

<!-- Generated from streams/settings.py by `invoicing config reference`
     (python -m streams.devtools.configref). Do not edit: change the field's
     `description=` and regenerate; tests/unit/test_config_reference.py fails while
     this page differs from the settings. -->

Every process reads its settings once, from the environment, when it starts
(`Settings()` in `streams/settings.py`; nothing else reads the environment). Each key
below is set by its variable: the prefix `{ENV_PREFIX}`, then the section and the
field in capitals joined by `{ENV_DELIMITER}`, e.g.
`{ENV_PREFIX}POSTGRES{ENV_DELIMITER}PORT=5432`. Unknown variables under the prefix
are refused at start (`extra="forbid"`), and a validation error never echoes a value.
A value of a tuple type is given as JSON (`["a", "b"]`).

The defaults are the local stack's (`invoicing stack up`, 127.0.0.1, non-default
ports); every production deployment sets at least the addresses and the passwords.
`invoicing config show` prints the effective configuration of the current
environment (secrets masked: `***`, a URL with only its credentials masked), with
`--json` for a machine; `given` tells which values came from the environment.
Secret fields (type `SecretStr`) are marked *secret* below: give them from a secret
store (the Kubernetes manifests read them from Secret objects), never on a command
line.
"""


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (``|`` escaped, one line)."""
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """The whole of ``docs/configuration.md``."""
    rows = reference()
    docs = section_docs()
    parts = [_HEADER]
    sections = list(dict.fromkeys(row.section for row in rows))
    parts.append("## Sections\n")
    parts.extend(f"- [`{name}`](#{name}): {docs[name]}." for name in sections)
    parts.append("")
    for name in sections:
        parts.append(f"## {name}\n")
        parts.append(f"{docs[name]}.\n")
        parts.append("| key | environment variable | type | default | meaning |")
        parts.append("|---|---|---|---|---|")
        for row in (r for r in rows if r.section == name):
            meaning = row.description + (" *secret*" if row.secret else "")
            parts.append(
                f"| `{row.key}` | `{row.env}` | `{_cell(row.type)}` | "
                f"{_cell(row.default if row.default.startswith('computed') else f'`{row.default}`')}"
                f" | {_cell(meaning)} |"
            )
        parts.append("")
    return "\n".join(parts).rstrip("\n") + "\n"


def write(root: Path) -> Path:
    """Write the page under the project ``root``; returns its path."""
    path = root / PAGE
    path.write_text(render(), encoding="utf-8")
    return path


def is_current(root: Path) -> bool:
    """Whether the committed page under ``root`` equals :func:`render`."""
    path = root / PAGE
    return path.is_file() and path.read_text(encoding="utf-8") == render()
