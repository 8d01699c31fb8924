"""Integration tier: real services (see tests/support/fixtures.py)."""

from tests.support.fixtures import pg, redis_conn, stack, unique

__all__ = ["pg", "redis_conn", "stack", "unique"]
