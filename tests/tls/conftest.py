"""Fixtures of the TLS tier (``make test-tls``): the profile's settings, and the chaos
tier's seed fixtures for the chaos scenario run over TLS (tests/chaos/conftest.py).

The tier runs on the stack ``make test-tls`` started with ``--profile tls``; nothing here
starts or stops it."""

from __future__ import annotations

import pytest

from streams.settings import Settings
from tests.chaos.conftest import chaos_seed, pytest_runtest_makereport, rerun
from tests.support.fixtures import unique

__all__ = ["chaos_seed", "pytest_runtest_makereport", "rerun", "tls_settings", "unique"]


@pytest.fixture(scope="session")
def tls_settings(settings: Settings) -> Settings:
    """The session's settings, which must be the TLS profile's (Kafka over SASL_SSL).

    Fails the test (never skips) when the environment is not the profile's."""
    if settings.kafka.security_protocol != "SASL_SSL":
        pytest.fail(
            "not the TLS profile's environment: `invoicing stack up --profile tls` and "
            "`source .local/conf/tls/tls.env` first (make test-tls does both)"
        )
    return settings
