"""Hypothesis for the rating tests: one reproducible profile.

``derandomize=True``: examples come from a seed derived from each test's name,
so CI and a laptop generate the same cases and a red run is red again locally;
no example database (``database=None``) so local history cannot change what CI
sees. On failure Hypothesis prints the falsifying example and, with
``print_blob``, the ``@reproduce_failure`` line that replays it. Examples are
bounded (``max_examples``) to keep the unit tier fast; no deadline, since the
machines are shared and a slow example is not a wrong one.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

PROFILE = "invoicing-unit"

settings.register_profile(
    PROFILE, derandomize=True, database=None, print_blob=True, max_examples=50, deadline=None
)
settings.load_profile(PROFILE)


def pytest_report_header(config: pytest.Config) -> str:
    current = settings.get_profile(PROFILE)
    return (
        f"hypothesis profile {PROFILE}: derandomize={current.derandomize}, "
        f"max_examples={current.max_examples}"
    )
