"""Integration tier: real services (see tests/support/fixtures.py)."""

from tests.support.fixtures import pg, pipeline, redis_conn, stack, unique

__all__ = ["pg", "pipeline", "redis_conn", "stack", "unique"]
