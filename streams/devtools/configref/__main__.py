"""``python -m streams.devtools.configref [--check]``: write ``docs/configuration.md``
(or, with ``--check``, exit 1 when it is out of date) under the current directory."""

from __future__ import annotations

import sys
from pathlib import Path

from streams.devtools.configref import PAGE, is_current, write


def main(argv: list[str]) -> int:
    """Exit status: 0 written or current; 1 ``--check`` and the page differs."""
    root = Path.cwd()
    if "--check" in argv:
        if is_current(root):
            return 0
        print(f"{PAGE} is out of date: run python -m streams.devtools.configref", file=sys.stderr)
        return 1
    print(write(root))
    return 0


sys.exit(main(sys.argv[1:]))
