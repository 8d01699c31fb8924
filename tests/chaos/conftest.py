"""Chaos tier: faults injected into the real stack (see tests/support/fixtures.py and
tests/chaos/harness.py).

Every test takes the ``chaos_seed`` fixture: the seed (``$CHAOS_SEED`` or a fresh
random one) is printed at the start of the test, and a failed test's report
carries a "chaos seed" section with the exact command that reruns it with that seed.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.chaos.harness import chaos_seed_value, rerun_command
from tests.support.fixtures import pg, pipeline, redis_conn, stack, unique

__all__ = ["chaos_seed", "pg", "pipeline", "redis_conn", "stack", "unique"]

_SEED_KEY = pytest.StashKey[int]()


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """The test's seed, printed with the command that reruns the test with it."""
    seed = chaos_seed_value()
    request.node.stash[_SEED_KEY] = seed
    print(f"\nchaos seed {seed}; rerun: {rerun_command(seed, request.node.nodeid)}")
    return seed


@pytest.fixture
def rerun(request: pytest.FixtureRequest, chaos_seed: int) -> str:
    """The exact command that reruns this test with its seed."""
    return rerun_command(chaos_seed, request.node.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    seed = item.stash.get(_SEED_KEY, None)
    if seed is not None and report.failed:
        report.sections.append(("chaos seed", rerun_command(seed, item.nodeid)))
    return report
