"""The ``invoicing`` process ends without the interpreter's teardown, and loses nothing.

Each case runs the real entry point (:func:`streams.entrypoints.app.main`) in a child
process with a stand-in command, and checks what a command's end must keep: its exit
status, its buffered output, its log records, the exit handlers it registered and its
non-daemon threads' work. The teardown itself is seen to be skipped: a module-level
object's ``__del__`` that the teardown would call never runs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_PRELUDE = """
import atexit, logging, sys, threading, time
from streams.entrypoints import app as root

class Witness:
    def __del__(self):
        sys.stderr.write("teardown ran\\n")

WITNESS = Witness()  # freed by the interpreter's teardown, if it happens
"""


def _run(body: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = _PRELUDE + textwrap.dedent(body) + "\nroot.app = command\nroot.main()\n"
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ("def command():\n    print('done')\n", 0),
        ("def command():\n    sys.exit(3)\n", 3),
        ("def command():\n    sys.exit(None)\n", 0),
        ("def command():\n    raise SystemExit('refused: bad period')\n", 1),
        ("def command():\n    raise RuntimeError('boom')\n", 1),
    ],
)
def test_the_exit_status_is_the_commands(body: str, status: int, tmp_path: Path) -> None:
    result = _run(body, tmp_path)
    assert result.returncode == status, result.stderr
    assert "teardown ran" not in result.stderr  # the teardown was skipped
    if "RuntimeError" in body:
        assert "Traceback" in result.stderr and "boom" in result.stderr
    if "refused" in body:
        assert "refused: bad period" in result.stderr


def test_output_logs_exit_handlers_and_threads_are_all_finished(tmp_path: Path) -> None:
    """Buffered stdout and stderr (no newline, larger than nothing), a file log handler,
    an exit handler registered by the command and a non-daemon thread's last write all
    reach their files before the process ends."""
    body = """
    def command():
        logging.basicConfig(filename="run.log", level=logging.INFO)
        logging.getLogger("x").info("logged line")
        atexit.register(lambda: open("handler.txt", "w").write("handler ran"))

        def late():
            time.sleep(0.3)
            open("thread.txt", "w").write("thread finished")

        threading.Thread(target=late).start()
        sys.stdout.write("o" * 100_000)  # no newline: still in the buffer
        sys.stderr.write("partial stderr")
        sys.exit(5)
    """
    result = _run(body, tmp_path)
    assert result.returncode == 5
    assert result.stdout == "o" * 100_000
    assert "partial stderr" in result.stderr
    assert "logged line" in (tmp_path / "run.log").read_text()
    assert (tmp_path / "handler.txt").read_text() == "handler ran"
    assert (tmp_path / "thread.txt").read_text() == "thread finished"
    assert "teardown ran" not in result.stderr
