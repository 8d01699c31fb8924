"""Contract of the :class:`~streams.core.billing.ports.TaxService` port.

Run on :class:`~streams.adapters.memory.tax.InMemoryTaxService` (unit tier) and on
:class:`~streams.adapters.tax.client.HttpTaxService` against the real fake tax
service process (integration tier). A subclass provides the ``harness`` fixture.
"""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

import pytest

from streams.core.billing.ports import Rate, TaxRejected, TaxService, TaxUnavailable
from streams.core.domain.invoice import TaxLine


@dataclass(frozen=True)
class SeenRequest:
    """One request the service received: its key (``key:i``), size and outcome
    (``ok``, ``replay``, ``conflict``, ``invalid``, ``error``, …)."""

    idempotency_key: str
    line_count: int
    outcome: str


@dataclass
class TaxHarness:
    """One implementation under test and what the suite needs to observe and steer it."""

    service: TaxService
    #: The requests of one document (keys ``f"{key}:{i}"``), in arrival order.
    requests: Callable[[str], list[SeenRequest]]
    #: How many committed documents (requests) the service holds.
    documents: Callable[[], int]
    #: The rate lookup of the service (``GET /v1/rates`` for the real one).
    rate: Callable[[str | None, str | None], Rate]
    #: Make the next ``calculate`` fail transiently, through every retry it makes.
    fail_next_call: Callable[[], None]
    #: An implementation whose service cannot be reached.
    unreachable: Callable[[], TaxService]

    def outcomes(self, key: str) -> list[str]:
        return [r.outcome for r in self.requests(key)]


def new_key() -> str:
    return f"inv-{uuid.uuid4().hex}"


def line(
    line_id: str, amount: str, region: str | None = "us-west-2", code: str | None = None
) -> TaxLine:
    return TaxLine(line_id=line_id, amount=Decimal(amount), region_id=region, tax_code=code)


def many(count: int, region: str = "eu-north-1") -> list[TaxLine]:
    return [line(f"l{i:05d}", f"{i}.01", region) for i in range(count)]


class TaxServiceContract:
    """The tax port's contract. Subclasses override :meth:`harness`."""

    @pytest.fixture
    def harness(self) -> TaxHarness:
        raise NotImplementedError("a subclass provides the implementation under test")

    # ------------------------------------------------------------------ answers

    def test_one_result_per_line_in_input_order(self, harness: TaxHarness) -> None:
        lines = [
            line("l3", "100.00", "us-west-2"),
            line("l1", "10", "eu-central-1"),
            line("l2", "20", None),
            line("l4", "40", "GLOBAL"),
            line("l5", "50", "us-gov-west-9"),
            line("l6", "60", "ap-northeast-1", "EXEMPT"),
        ]
        got = harness.service.calculate(
            idempotency_key=new_key(), customer_id="c1", currency="USD", lines=lines
        )
        assert [t.line_id for t in got] == ["l3", "l1", "l2", "l4", "l5", "l6"]
        assert [(t.tax_code, t.rate, t.tax) for t in got] == [
            ("US-WA-STD", Decimal("0.065"), Decimal("6.5")),
            ("DE-STD", Decimal("0.19"), Decimal("1.9")),
            ("GLOBAL-STD", Decimal("0.05"), Decimal("1")),
            ("GLOBAL-STD", Decimal("0.05"), Decimal("2")),
            ("US-STD", Decimal("0.06"), Decimal("3")),
            ("JP-EXEMPT", Decimal("0"), Decimal("0")),
        ]

    def test_tax_keeps_full_precision(self, harness: TaxHarness) -> None:
        tiny = "0.00000080000"
        huge = "12345678901234567890.123456789012345"  # 35 digits, beyond a 28-digit context
        got = harness.service.calculate(
            idempotency_key=new_key(),
            customer_id="c1",
            currency="USD",
            lines=[line("a", tiny, "us-east-1"), line("b", huge, "us-west-1")],
        )
        exact = decimal.Context(prec=100)
        assert got[0].tax == exact.multiply(Decimal(tiny), Decimal("0.053"))
        assert got[1].tax == exact.multiply(Decimal(huge), Decimal("0.0725"))
        assert got[1].tax == Decimal("895061720339506172.0339506172033950125")

    def test_negative_amounts_give_negative_tax(self, harness: TaxHarness) -> None:
        got = harness.service.calculate(
            idempotency_key=new_key(),
            customer_id="c1",
            currency="USD",
            lines=[line("credit", "-12.50", "eu-west-2"), line("charge", "12.50", "eu-west-2")],
        )
        assert got[0].tax == Decimal("-2.5")
        assert got[0].tax == -got[1].tax

    def test_no_lines_means_no_call(self, harness: TaxHarness) -> None:
        key = new_key()
        got = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=[]
        )
        assert got == []
        assert harness.outcomes(key) == []

    def test_rate_of_a_region(self, harness: TaxHarness) -> None:
        assert harness.rate("ap-south-1", None) == Rate("IN-STD", Decimal("0.18"))
        assert harness.rate(None, None) == Rate("GLOBAL-STD", Decimal("0.05"))
        assert harness.rate("westus2", "EXEMPT") == Rate("US-WA-EXEMPT", Decimal("0"))
        with pytest.raises(TaxRejected) as caught:
            harness.rate("us-east-1", "BOGUS")
        assert caught.value.status == 422

    # ------------------------------------------------------------------ idempotency

    def test_committed_document_replays_the_same_answer(self, harness: TaxHarness) -> None:
        key = new_key()
        lines = [line("a", "1.00"), line("b", "2.00", "eu-west-1")]
        first = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=lines
        )
        # 1.0 and 1.00 are the same amount: the same document.
        same = [line("a", "1.0"), line("b", "2", "eu-west-1")]
        second = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=same
        )
        assert second == first
        assert harness.outcomes(key) == ["ok", "replay"]

    def test_reusing_a_key_taxes_nothing_twice(self, harness: TaxHarness) -> None:
        key = new_key()
        lines = [line("a", "10.00", "eu-west-3"), line("b", "4.00", "ap-south-1")]
        before = harness.documents()
        answers = [
            harness.service.calculate(
                idempotency_key=key, customer_id="c1", currency="USD", lines=lines
            )
            for _ in range(3)
        ]
        assert answers[0] == answers[1] == answers[2]
        assert [t.tax for t in answers[0]] == [Decimal("2.000"), Decimal("0.7200")]
        assert harness.documents() == before + 1
        assert harness.outcomes(key) == ["ok", "replay", "replay"]

    def test_same_key_with_other_lines_conflicts(self, harness: TaxHarness) -> None:
        key = new_key()
        harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=[line("a", "1.00")]
        )
        with pytest.raises(TaxRejected) as caught:
            harness.service.calculate(
                idempotency_key=key, customer_id="c1", currency="USD", lines=[line("a", "1.01")]
            )
        assert caught.value.status == 409
        assert caught.value.idempotency_key == f"{key}:0"
        assert harness.outcomes(key) == ["ok", "conflict"]

    def test_a_refused_document_leaves_the_committed_one_standing(
        self, harness: TaxHarness
    ) -> None:
        key = new_key()
        original = [line("a", "3.00", "eu-central-1")]
        first = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=original
        )
        with pytest.raises(TaxRejected) as caught:
            harness.service.calculate(
                idempotency_key=key,
                customer_id="c1",
                currency="USD",
                lines=[*original, line("b", "1.00")],
            )
        assert caught.value.status == 409
        again = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=original
        )
        assert again == first
        assert harness.outcomes(key) == ["ok", "conflict", "replay"]

    def test_same_key_for_another_customer_conflicts(self, harness: TaxHarness) -> None:
        key = new_key()
        harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=[line("a", "1.00")]
        )
        with pytest.raises(TaxRejected) as caught:
            harness.service.calculate(
                idempotency_key=key, customer_id="c2", currency="USD", lines=[line("a", "1.00")]
            )
        assert caught.value.status == 409

    def test_quote_stores_nothing(self, harness: TaxHarness) -> None:
        key = new_key()
        quoted = harness.service.calculate(
            idempotency_key=key,
            customer_id="c1",
            currency="USD",
            lines=[line("a", "5.00")],
            commit=False,
        )
        committed = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=[line("a", "7.00")]
        )
        assert quoted[0].tax == Decimal("0.325")
        assert committed[0].tax == Decimal("0.455")
        assert harness.outcomes(key) == ["ok", "ok"]

    # ------------------------------------------------------------------ chunking

    def test_exactly_1000_lines_go_in_one_request(self, harness: TaxHarness) -> None:
        key = new_key()
        lines = many(1000)
        got = harness.service.calculate(
            idempotency_key=key, customer_id="big", currency="USD", lines=lines
        )
        assert len(got) == 1000
        assert harness.requests(key) == [SeenRequest(f"{key}:0", 1000, "ok")]

    def test_1001_lines_go_in_two_requests(self, harness: TaxHarness) -> None:
        key = new_key()
        lines = many(1001)
        got = harness.service.calculate(
            idempotency_key=key, customer_id="big", currency="USD", lines=lines
        )
        assert [t.line_id for t in got] == [ln.line_id for ln in lines]
        assert harness.requests(key) == [
            SeenRequest(f"{key}:0", 1000, "ok"),
            SeenRequest(f"{key}:1", 1, "ok"),
        ]

    def test_more_than_1000_lines_are_split_into_requests(self, harness: TaxHarness) -> None:
        key = new_key()
        lines = [line(f"l{i:05d}", f"{i}.01", "eu-north-1") for i in range(2501)]
        got = harness.service.calculate(
            idempotency_key=key, customer_id="big", currency="USD", lines=lines
        )
        assert [t.line_id for t in got] == [ln.line_id for ln in lines]
        assert all(t.tax == ln.amount * Decimal("0.25") for t, ln in zip(got, lines, strict=True))
        assert harness.outcomes(key) == ["ok", "ok", "ok"]
        again = harness.service.calculate(
            idempotency_key=key, customer_id="big", currency="USD", lines=lines
        )
        assert again == got
        assert harness.outcomes(key)[3:] == ["replay", "replay", "replay"]

    def test_a_document_retried_after_its_first_request_committed_replays_it(
        self, harness: TaxHarness
    ) -> None:
        """As after a crash between the first and the second request of a big document:
        request ``key:0`` was committed, so the retry replays it and taxes only the rest."""
        key = new_key()
        lines = many(1001)
        first_chunk = harness.service.calculate(
            idempotency_key=key, customer_id="big", currency="USD", lines=lines[:1000]
        )
        before = harness.documents()
        got = harness.service.calculate(
            idempotency_key=key, customer_id="big", currency="USD", lines=lines
        )
        assert got[:1000] == first_chunk
        assert harness.documents() == before + 1
        assert harness.outcomes(key) == ["ok", "replay", "ok"]

    # ------------------------------------------------------------------ refusals and failures

    def test_unknown_product_tax_code_is_rejected(self, harness: TaxHarness) -> None:
        key = new_key()
        with pytest.raises(TaxRejected) as caught:
            harness.service.calculate(
                idempotency_key=key,
                customer_id="c1",
                currency="USD",
                lines=[line("a", "1", "us-west-2", "NOT-A-CODE")],
            )
        assert caught.value.status == 422
        assert harness.outcomes(key) == ["invalid"]

    def test_repeated_line_id_is_refused_before_sending(self, harness: TaxHarness) -> None:
        key = new_key()
        with pytest.raises(TaxRejected) as caught:
            harness.service.calculate(
                idempotency_key=key,
                customer_id="c1",
                currency="USD",
                lines=[line("a", "1"), line("a", "2")],
            )
        assert caught.value.status is None
        assert harness.outcomes(key) == []

    def test_a_transient_failure_surfaces_as_unavailable_and_commits_nothing(
        self, harness: TaxHarness
    ) -> None:
        key = new_key()
        lines = [line("a", "2.00", "eu-west-1")]
        before = harness.documents()
        harness.fail_next_call()
        with pytest.raises(TaxUnavailable) as caught:
            harness.service.calculate(
                idempotency_key=key, customer_id="c1", currency="USD", lines=lines
            )
        assert caught.value.idempotency_key == f"{key}:0"
        assert caught.value.attempts >= 1
        assert harness.documents() == before
        failed = harness.outcomes(key)
        assert failed and set(failed) == {"error"}
        # the same document later: computed now (nothing was committed), taxed once
        got = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=lines
        )
        assert got[0].tax == Decimal("0.4600")
        assert harness.outcomes(key) == [*failed, "ok"]
        assert harness.documents() == before + 1

    def test_an_unreachable_service_is_unavailable(self, harness: TaxHarness) -> None:
        service = harness.unreachable()
        with pytest.raises(TaxUnavailable) as caught:
            service.calculate(
                idempotency_key=new_key(), customer_id="c1", currency="USD", lines=[line("a", "1")]
            )
        assert caught.value.status is None
        assert not isinstance(caught.value, TaxRejected)
