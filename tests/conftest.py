"""Shared pytest configuration: tiers by folder, and the settings fixture.

Tests under ``tests/integration``, ``tests/chaos`` and ``tests/fuzz`` are marked
``integration`` (and ``chaos`` / ``fuzz``) automatically; they run against the real local stack, which the
``stack`` fixture (tests/integration/conftest.py) brings up when it is not
running, and they fail (never skip) when a service is missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.settings import Settings

TESTS = Path(__file__).resolve().parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        action="store",
        default=None,
        help="seed of the fuzz tier (tests/fuzz): replays a run; default $FUZZ_SEED or random",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if TESTS / "integration" in path.parents:
            item.add_marker(pytest.mark.integration)
        elif TESTS / "chaos" in path.parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.chaos)
        elif TESTS / "fuzz" in path.parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.fuzz)


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The settings every test starts from (defaults point at the local stack)."""
    return Settings()
