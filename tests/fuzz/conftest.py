"""Fuzz tier: generated records against real consumers on the real stack.

Every test takes the ``fuzz_seed`` fixture: ``--seed N`` (or ``$FUZZ_SEED``) replays
a run, otherwise a fresh seed is drawn. It is printed at the start of the test, and
a failed test's report carries a "fuzz seed" section with the exact rerun command.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.fuzz.harness import fuzz_seed_value, rerun_command
from tests.support.fixtures import pg, pipeline, redis_conn, stack, unique

__all__ = ["fuzz_seed", "pg", "pipeline", "redis_conn", "stack", "unique"]

_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture
def fuzz_seed(request: pytest.FixtureRequest) -> int:
    """The test's seed, printed with the command that reruns the test with it."""
    option = request.config.getoption("--seed")
    seed = fuzz_seed_value(int(option) if option is not None else None)
    request.node.stash[_SEED_KEY] = seed
    print(f"\nfuzz seed {seed}; rerun: {rerun_command(seed, request.node.nodeid)}")
    return seed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    seed = item.stash.get(_SEED_KEY, None)
    if seed is not None and report.failed:
        report.sections.append(("fuzz seed", rerun_command(seed, item.nodeid)))
    return report
