"""``invoicing … | head``: a reader that stops early ends the command quietly."""

from __future__ import annotations

import subprocess
import sys

# The real entry point, with a command that writes far more than a pipe holds.
_SCRIPT = """
from streams.entrypoints import app as root

def lots() -> None:
    for _ in range(200_000):
        print("x" * 80)

root.app = lots
root.main()
"""


def test_a_reader_that_stops_early_ends_the_command_quietly() -> None:
    """Exit status 141 (128 + SIGPIPE, as a shell reports a C tool that SIGPIPE ended),
    and no traceback."""
    with subprocess.Popen(
        [sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline() == b"x" * 80 + b"\n"
        proc.stdout.close()  # what `head -1` does after its line
        stderr = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 141
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
