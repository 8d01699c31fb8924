"""Measuring tools: statistics, worker RSS from /proc, py-spy profiles, waiting, the CLI.

Nothing here knows the product's internals; the CLI is run as a subprocess with
the sandbox's environment, the way an operator runs it.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class BenchError(RuntimeError):
    """A scenario could not be measured (a wait timed out, a command failed)."""


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100): the ceil(p/100 * n)-th smallest value.
    Over 20 samples p99 is the largest, p50 the 10th."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    timeout_s: float,
    interval_s: float = 0.1,
    alive: Callable[[], str | None] | None = None,
) -> float:
    """Poll ``check`` until true; returns ``time.time()`` of the first true check.

    Raises:
        BenchError: not true within ``timeout_s``, or ``alive()`` reported a problem.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return time.time()
        if alive is not None:
            problem = alive()
            if problem:
                raise BenchError(f"while waiting for {what}: {problem}")
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


# --------------------------------------------------------------------------- CLI


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    started: float
    seconds: float

    def json(self) -> Any:
        """The JSON document the command printed on stdout (its last top-level object);
        the lines py-spy adds when it runs the command (``py-spy> …``) are left out."""
        text = "".join(
            line for line in self.stdout.splitlines(keepends=True) if not line.startswith("py-spy>")
        )
        start = text.find("{")
        if start < 0:
            raise BenchError(f"{' '.join(self.argv)} printed no JSON:\n{text[-2000:]}")
        return json.loads(text[start:])


def run_cli(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: Path,
    timeout_s: float,
    check: bool = True,
) -> CommandResult:
    """Run an ``invoicing …`` command with the sandbox's environment; time it.

    Raises:
        BenchError: non-zero exit (when ``check``) or timeout.
    """
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    started = time.time()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            list(argv),
            env=full_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{' '.join(argv)} did not finish in {timeout_s:.0f} s") from exc
    result = CommandResult(
        list(argv), proc.returncode, proc.stdout, proc.stderr, started, time.perf_counter() - t0
    )
    if check and proc.returncode != 0:
        raise BenchError(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}"
        )
    return result


# --------------------------------------------------------------------------- RSS


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` from ``/proc/<pid>/status`` (``VmRSS``), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


@dataclass
class RssSampler:
    """Samples ``VmRSS`` of some processes every ``interval_s`` in a thread (a context manager)."""

    pids: list[int]
    interval_s: float = 0.25
    samples: list[tuple[float, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for pid in self.pids:
                rss = rss_bytes(pid)
                if rss is not None:
                    self.samples.append((now, pid, rss))
            self._stop.wait(self.interval_s)

    def peak_mib(self) -> float:
        """Largest single-process RSS seen (MiB)."""
        return max((s[2] for s in self.samples), default=0) / 2**20

    def first_mib(self) -> float:
        return self.samples[0][2] / 2**20 if self.samples else 0.0


# --------------------------------------------------------------------------- py-spy


@dataclass
class Profile:
    """A py-spy ``record --format raw`` (collapsed stacks) of one process."""

    name: str
    path: Path
    samples: int = 0
    top_self: list[tuple[str, int]] = field(default_factory=list)
    top_total: list[tuple[str, int]] = field(default_factory=list)

    def lines(self, n: int = 15) -> list[str]:
        out = [f"profile {self.name}: {self.samples} samples ({self.path})"]
        out.append("  self%  function (file)")
        for frame, count in self.top_self[:n]:
            out.append(f"  {100 * count / max(1, self.samples):5.1f}  {frame}")
        out.append(
            "  total% function (file), the call chain every sample shares (>= 90 %) left out"
        )
        branch = [(f, c) for f, c in self.top_total if c < 0.9 * self.samples]
        for frame, count in branch[:n]:
            out.append(f"  {100 * count / max(1, self.samples):5.1f}  {frame}")
        return out


def _py_spy_record(py_spy: str, path: Path, idle: bool) -> list[str]:
    """``py-spy record`` at 100 Hz, collapsed stacks to ``path``, threads waiting sampled
    too when ``idle``: the options every profile of the harness shares."""
    path.parent.mkdir(parents=True, exist_ok=True)
    idle_flag = ["--idle"] if idle else []
    return [py_spy, "record", "--rate", "100", "--format", "raw", "--output", str(path), *idle_flag]


def py_spy_record(py_spy: str, path: Path, idle: bool) -> list[str]:
    """The argv prefix that runs a command under ``py-spy record`` (100 Hz, collapsed
    stacks to ``path``, threads waiting sampled too when ``idle``). py-spy adds lines of
    its own to the command's stdout (``py-spy> …``), which :meth:`CommandResult.json`
    leaves out."""
    return [*_py_spy_record(py_spy, path, idle), "--"]


class Profiler:
    """``py-spy record`` attached to ``pid`` from ``start()`` to ``stop()`` (SIGINT), 100 Hz,
    non-blocking (the target is not paused). Idle threads are excluded (py-spy's
    default: the profile shows where the CPU goes) unless ``idle`` (``--idle``: a thread
    waiting on a socket or a lock is sampled too, so the profile shows where the wall
    clock goes, e.g. how long the poll thread waits for the database)."""

    def __init__(
        self, pid: int, name: str, out_dir: Path, py_spy: str, *, idle: bool = False
    ) -> None:
        self.pid = pid
        self.idle = idle
        self.name = name
        self.path = out_dir / f"profile-{name}.txt"
        self.py_spy = py_spy
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *_py_spy_record(self.py_spy, self.path, self.idle),
                *("--pid", str(self.pid), "--nonblocking"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> Profile:
        profile = Profile(self.name, self.path)
        if self.proc is None:
            return profile
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.path.exists():
            summarize_collapsed(self.path.read_text(), profile)
        return profile


_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^()]*?)(?::(?P<line>\d+))?\)$")


def _function(frame: str) -> str:
    """``func (…/site-packages/pkg/mod.py:123)`` → ``func (pkg/mod.py)``: one entry per
    function, whatever line was sampled."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    path = match.group("path")
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    elif "/lib/python3" in path:
        path = "stdlib " + path.split("/lib/python3", 1)[1].split("/", 1)[-1]
    else:
        for top in ("/streams/", "/benchmarks/"):
            if top in path:
                path = top[1:] + path.rsplit(top, 1)[1]
                break
    return f"{match.group('func')} ({path})"


def summarize_collapsed(text: str, profile: Profile) -> None:
    """Self and inclusive sample counts per frame from collapsed stacks
    (``frame;frame;… count`` per line; py-spy puts the thread first)."""
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            _function(f.strip())
            for f in stack.split(";")
            if f and not f.startswith(("thread ", "process "))
        ]
        if not frames:
            continue
        samples += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    profile.samples = samples
    profile.top_self = self_counts.most_common(25)
    profile.top_total = total_counts.most_common(80)
