"""Contract of the :class:`~streams.core.billing.ports.TaxCache` port.

Run on :class:`~streams.adapters.memory.tax_cache.InMemoryTaxCache` (unit tier) and
on :class:`~streams.adapters.tax.cache.RedisTaxCache` against the stack's Redis
(integration tier). A subclass provides the ``harness`` fixture.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import pytest

from streams.core.billing.ports import Rate, RateKey, TaxCache
from streams.core.domain.invoice import TaxedLine

#: The TTL the harness's caches are built with (seconds).
TTL_S = 2


@dataclass
class CacheHarness:
    """A cache built with ``ttl_s`` = :data:`TTL_S`, a clock, and a cache that is down."""

    cache: TaxCache
    #: Let ``seconds`` pass for the cache (a sleep for the real one).
    advance: Callable[[float], None]
    #: A cache whose store is unavailable (for the real one: Redis on a closed port).
    down: TaxCache


def new_key() -> str:
    return f"inv-{uuid.uuid4().hex}"


def answer(*taxes: str) -> list[TaxedLine]:
    return [
        TaxedLine(f"l{i}", "US-CA-STD", Decimal("0.0725"), Decimal(tax))
        for i, tax in enumerate(taxes)
    ]


RATES: dict[RateKey, Rate] = {
    ("us-west-2", None): Rate("US-WA-STD", Decimal("0.065")),
    (None, None): Rate("GLOBAL-STD", Decimal("0.05")),
    ("ap-northeast-1", "EXEMPT"): Rate("JP-EXEMPT", Decimal("0")),
}


class TaxCacheContract:
    """The tax cache's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> CacheHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    # ------------------------------------------------------------------ documents

    def test_an_unknown_document_is_a_miss(self, harness: CacheHarness) -> None:
        assert harness.cache.get_document(new_key(), "f" * 64) is None

    def test_a_stored_document_is_a_hit_with_exact_decimals(self, harness: CacheHarness) -> None:
        key = new_key()
        lines = [
            TaxedLine(
                "a",
                "US-CA-STD",
                Decimal("0.0725"),
                Decimal("895061720339506172.0339506172033950125"),
            ),
            TaxedLine("b", "FR-STD", Decimal("0.20"), Decimal("-0.8500")),
            TaxedLine("c", "JP-EXEMPT", Decimal("0"), Decimal("0E-8")),
            TaxedLine("d", "US-VA-STD", Decimal("0.053"), Decimal("4.24E-8")),
        ]
        harness.cache.put_document(key, "fp-1", lines)
        got = harness.cache.get_document(key, "fp-1")
        assert got == lines
        assert got is not None
        assert [(str(t.rate), str(t.tax)) for t in got] == [
            (str(t.rate), str(t.tax)) for t in lines
        ]

    def test_a_document_keeps_its_line_order(self, harness: CacheHarness) -> None:
        key = new_key()
        lines = [TaxedLine(i, "X", Decimal("0.1"), Decimal("1")) for i in ("z", "a", "m")]
        harness.cache.put_document(key, "fp", lines)
        got = harness.cache.get_document(key, "fp")
        assert got is not None
        assert [t.line_id for t in got] == ["z", "a", "m"]

    def test_another_fingerprint_under_the_key_is_a_miss(self, harness: CacheHarness) -> None:
        key = new_key()
        harness.cache.put_document(key, "fp-1", answer("1.00"))
        assert harness.cache.get_document(key, "fp-2") is None
        assert harness.cache.get_document(key, "fp-1") == answer("1.00")

    def test_a_put_replaces_the_entry_of_its_key(self, harness: CacheHarness) -> None:
        key = new_key()
        harness.cache.put_document(key, "fp-1", answer("1.00"))
        harness.cache.put_document(key, "fp-2", answer("2.00", "3.00"))
        assert harness.cache.get_document(key, "fp-1") is None
        assert harness.cache.get_document(key, "fp-2") == answer("2.00", "3.00")

    def test_documents_are_kept_by_key(self, harness: CacheHarness) -> None:
        first, second = new_key(), new_key()
        harness.cache.put_document(first, "fp", answer("1.00"))
        harness.cache.put_document(second, "fp", answer("9.00"))
        assert harness.cache.get_document(first, "fp") == answer("1.00")
        assert harness.cache.get_document(second, "fp") == answer("9.00")
        assert harness.cache.get_document(f"{first}:0", "fp") is None

    # ------------------------------------------------------------------ rates

    def test_rates_hit_and_miss(self, harness: CacheHarness) -> None:
        region = f"region-{uuid.uuid4().hex[:8]}"
        rates = {(region, None): Rate("R-STD", Decimal("0.125")), **RATES}
        harness.cache.put_rates(rates)
        unknown: RateKey = (f"other-{region}", None)
        got = harness.cache.get_rates([*rates, unknown])
        assert got == rates
        assert unknown not in got
        assert str(got[(region, None)].rate) == "0.125"

    def test_no_keys_no_rates(self, harness: CacheHarness) -> None:
        assert harness.cache.get_rates([]) == {}
        harness.cache.put_rates({})  # nothing to store: no error

    def test_a_rate_key_tells_none_from_text(self, harness: CacheHarness) -> None:
        region = f"region-{uuid.uuid4().hex[:8]}"
        harness.cache.put_rates({(region, None): Rate("R-STD", Decimal("0.1"))})
        assert harness.cache.get_rates([(region, "null"), (region, "None"), (region, "")]) == {}
        assert harness.cache.get_rates([(region, None)]) == {
            (region, None): Rate("R-STD", Decimal("0.1"))
        }

    def test_a_repeated_key_is_answered_once(self, harness: CacheHarness) -> None:
        region = f"region-{uuid.uuid4().hex[:8]}"
        harness.cache.put_rates({(region, None): Rate("R-STD", Decimal("0.1"))})
        assert harness.cache.get_rates([(region, None), (region, None)]) == {
            (region, None): Rate("R-STD", Decimal("0.1"))
        }

    # ------------------------------------------------------------------ expiry

    def test_entries_expire_after_the_ttl(self, harness: CacheHarness) -> None:
        key = new_key()
        region = f"region-{uuid.uuid4().hex[:8]}"
        harness.cache.put_document(key, "fp", answer("1.00"))
        harness.cache.put_rates({(region, None): Rate("R-STD", Decimal("0.1"))})
        harness.advance(TTL_S * 0.4)
        assert harness.cache.get_document(key, "fp") == answer("1.00")
        assert (region, None) in harness.cache.get_rates([(region, None)])
        harness.advance(TTL_S * 0.6 + 0.25)
        assert harness.cache.get_document(key, "fp") is None
        assert harness.cache.get_rates([(region, None)]) == {}

    def test_a_put_restarts_the_ttl(self, harness: CacheHarness) -> None:
        key = new_key()
        region = f"region-{uuid.uuid4().hex[:8]}"
        harness.cache.put_document(key, "fp", answer("1.00"))
        harness.cache.put_rates({(region, None): Rate("R-STD", Decimal("0.1"))})
        harness.advance(TTL_S * 0.6)
        harness.cache.put_document(key, "fp", answer("1.00"))
        harness.cache.put_rates({(region, None): Rate("R-STD", Decimal("0.1"))})
        harness.advance(TTL_S * 0.6)  # 1.2 TTL after the first put, 0.6 after the second
        assert harness.cache.get_document(key, "fp") == answer("1.00")
        assert (region, None) in harness.cache.get_rates([(region, None)])

    # ------------------------------------------------------------------ unavailable

    def test_a_cache_that_is_down_is_a_miss_and_raises_nothing(self, harness: CacheHarness) -> None:
        key = new_key()
        harness.down.put_document(key, "fp", answer("1.00"))
        harness.down.put_rates(RATES)
        assert harness.down.get_document(key, "fp") is None
        assert harness.down.get_rates(list(RATES)) == {}
