"""The tax port's contract (tests/contracts/tax.py) on the in-memory twin, and what only
the twin does (scripted failures)."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest

from streams.adapters.memory.tax import InMemoryTaxService
from streams.core.billing.ports import TaxRejected, TaxService, TaxUnavailable
from streams.core.domain.invoice import TaxLine
from tests.contracts.tax import SeenRequest, TaxHarness, TaxServiceContract


class TestInMemoryTaxService(TaxServiceContract):
    @pytest.fixture
    def harness(self) -> TaxHarness:
        twin = InMemoryTaxService()

        def requests(key: str) -> list[SeenRequest]:
            return [
                SeenRequest(c.idempotency_key, c.line_count, c.outcome)
                for c in twin.calls
                if c.idempotency_key.startswith(f"{key}:")
            ]

        def unreachable() -> TaxService:
            down = InMemoryTaxService()
            down.down = True
            return down

        return TaxHarness(
            service=twin,
            requests=requests,
            documents=lambda: len(twin.ledger),
            rate=twin.rate,
            fail_next_call=twin.fail_next,
            unreachable=unreachable,
        )


def lines() -> list[TaxLine]:
    return [TaxLine("l0", Decimal("1.50"), "us-west-2", None)]


def new_key() -> str:
    return f"inv-{uuid.uuid4().hex}"


def test_in_memory_fake_can_be_told_to_fail() -> None:
    fake = InMemoryTaxService()
    fake.fail_next(1)
    key = new_key()
    with pytest.raises(TaxUnavailable):
        fake.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    got = fake.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    assert got[0].tax == Decimal("1.50") * Decimal("0.065")
    assert fake.outcomes(key) == ["error", "ok"]
    fake.fail_next(1, TaxRejected("refused", status=422))
    with pytest.raises(TaxRejected):
        fake.calculate(idempotency_key=new_key(), customer_id="c1", currency="USD", lines=lines())


def test_twins_sharing_a_ledger_share_committed_documents() -> None:
    first = InMemoryTaxService()
    second = InMemoryTaxService(ledger=first.ledger)
    key = new_key()
    answer = first.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    again = second.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=lines())
    assert again == answer
    assert second.outcomes(key) == ["replay"]


def test_a_smaller_request_size_chunks_earlier() -> None:
    twin = InMemoryTaxService(max_lines_per_request=2)
    key = new_key()
    five = [TaxLine(f"l{i}", Decimal("1"), None, None) for i in range(5)]
    twin.calculate(idempotency_key=key, customer_id="c1", currency="USD", lines=five)
    assert [(c.idempotency_key, c.line_count) for c in twin.calls] == [
        (f"{key}:0", 2),
        (f"{key}:1", 2),
        (f"{key}:2", 1),
    ]
