"""The tax cache's contract (tests/contracts/tax_cache.py) on the in-memory twin, with a
fake clock (no sleeping), and what only the twin does (counting operations while down)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from streams.adapters.memory.tax_cache import InMemoryTaxCache
from streams.core.billing.ports import Rate
from streams.core.domain.invoice import TaxedLine
from tests.contracts.tax_cache import TTL_S, CacheHarness, TaxCacheContract


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TestInMemoryTaxCache(TaxCacheContract):
    @pytest.fixture
    def harness(self) -> CacheHarness:
        clock = FakeClock()
        down = InMemoryTaxCache(ttl_s=TTL_S, clock=clock)
        down.down = True
        return CacheHarness(
            cache=InMemoryTaxCache(ttl_s=TTL_S, clock=clock), advance=clock.advance, down=down
        )


def test_operations_while_down_are_counted_and_forgotten() -> None:
    cache = InMemoryTaxCache(ttl_s=60)
    cache.down = True
    cache.put_document("k", "fp", [TaxedLine("a", "X", Decimal("0.1"), Decimal("1"))])
    cache.put_rates({(None, None): Rate("GLOBAL-STD", Decimal("0.05"))})
    assert cache.get_document("k", "fp") is None
    assert cache.errors == {"put_document": 1, "put_rates": 1, "get_document": 1}
    cache.down = False  # back: what was put while down was never stored
    assert cache.get_document("k", "fp") is None
    assert cache.get_rates([(None, None)]) == {}
