"""Shared pytest configuration: tiers by folder, and the settings fixture.

Tests under ``tests/tls`` (marked ``tls``) are deselected unless ``-m tls`` is given.
Tests under ``tests/integration``, ``tests/chaos``, ``tests/fuzz`` and ``tests/security``
are marked ``integration`` (and ``chaos`` / ``fuzz`` / ``security``) automatically; they run
against the real local stack, which the ``stack`` fixture (tests/support/fixtures.py) brings
up when it is not
running, and they fail (never skip) when a service is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "security: a finding of the security review (tests/security, docs/security.md)"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """With ``$INVOICING_TEST_RUNNING`` set (scripts/test-tiers.sh sets it to a folder per
    tier), the test this process runs is in ``<folder>/<pid>`` while it runs (set-up and
    tear-down included), so a tier stopped as hung says which tests it was in."""
    folder = os.environ.get("INVOICING_TEST_RUNNING")
    if not folder:
        yield
        return
    path = Path(folder) / str(os.getpid())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(item.nodeid + "\n")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tests/tls runs only when asked (-m tls: make test-tls), on the TLS profile's stack.
    asked_tls = "tls" in str(config.getoption("markexpr", "") or "")
    tls_items = [
        item for item in items if TESTS / "tls" in Path(str(item.fspath)).resolve().parents
    ]
    if tls_items and not asked_tls:
        config.hook.pytest_deselected(items=tls_items)
        items[:] = [item for item in items if item not in tls_items]
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
        elif TESTS / "security" in path.parents:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.security)


@pytest.fixture(scope="session")
def settings() -> Settings:
    """The settings every test starts from (defaults point at the local stack)."""
    return Settings()
