"""One contract suite for every :class:`~streams.adapters.tax.TaxService` implementation:
the in-memory fake and the HTTP client against the real fake server (a subprocess
of the project's own Python on a free port of 127.0.0.1), so the fake cannot drift."""

from __future__ import annotations

import decimal
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from streams.adapters.memory.tax import InMemoryTaxService
from streams.adapters.tax.client import HttpTaxService
from streams.billing.ports import Rate, TaxRejected, TaxService
from streams.domain.invoice import TaxLine
from streams.settings import TaxSettings
from streams.stack.fake_tax import FakeTaxConfig, FakeTaxProcess, running_fake_tax


@dataclass
class Harness:
    """One implementation under test, with a way to see the requests it made."""

    name: str
    service: TaxService
    #: Outcomes (ok, replay, conflict, invalid, …) of the requests of a document key.
    outcomes: Callable[[str], list[str]]
    rate: Callable[[str | None, str | None], Rate]


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeTaxProcess]:
    workdir: Path = tmp_path_factory.mktemp("fake_tax")
    with running_fake_tax(workdir, config=FakeTaxConfig(base_latency_s=0.0)) as server:
        yield server


@pytest.fixture(params=["in_memory", "http"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    if request.param == "in_memory":
        memory = InMemoryTaxService()
        yield Harness("in_memory", memory, memory.outcomes, memory.rate)
        return
    server: FakeTaxProcess = request.getfixturevalue("fake_server")
    settings = TaxSettings(
        url=server.url, max_attempts=2, backoff_initial_s=0.01, backoff_max_s=0.05
    )

    def outcomes(key: str) -> list[str]:
        return [r.outcome for r in server.admin.requests(key_prefix=f"{key}:")]

    with HttpTaxService(settings) as http:
        yield Harness("http", http, outcomes, http.rate)


def new_key() -> str:
    return f"inv-{uuid.uuid4().hex}"


def line(
    line_id: str, amount: str, region: str | None = "us-west-2", code: str | None = None
) -> TaxLine:
    return TaxLine(line_id=line_id, amount=Decimal(amount), region_id=region, tax_code=code)


class TestTaxServiceContract:
    def test_one_result_per_line_in_input_order(self, harness: Harness) -> None:
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

    def test_tax_keeps_full_precision(self, harness: Harness) -> None:
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

    def test_negative_amounts_give_negative_tax(self, harness: Harness) -> None:
        got = harness.service.calculate(
            idempotency_key=new_key(),
            customer_id="c1",
            currency="USD",
            lines=[line("credit", "-12.50", "eu-west-2"), line("charge", "12.50", "eu-west-2")],
        )
        assert got[0].tax == Decimal("-2.5")
        assert got[0].tax == -got[1].tax

    def test_committed_document_replays_the_same_answer(self, harness: Harness) -> None:
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

    def test_same_key_with_other_lines_conflicts(self, harness: Harness) -> None:
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

    def test_same_key_for_another_customer_conflicts(self, harness: Harness) -> None:
        key = new_key()
        harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=[line("a", "1.00")]
        )
        with pytest.raises(TaxRejected) as caught:
            harness.service.calculate(
                idempotency_key=key, customer_id="c2", currency="USD", lines=[line("a", "1.00")]
            )
        assert caught.value.status == 409

    def test_quote_stores_nothing(self, harness: Harness) -> None:
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

    def test_more_than_1000_lines_are_split_into_requests(self, harness: Harness) -> None:
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

    def test_unknown_product_tax_code_is_rejected(self, harness: Harness) -> None:
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

    def test_repeated_line_id_is_refused_before_sending(self, harness: Harness) -> None:
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

    def test_no_lines_means_no_call(self, harness: Harness) -> None:
        key = new_key()
        got = harness.service.calculate(
            idempotency_key=key, customer_id="c1", currency="USD", lines=[]
        )
        assert got == []
        assert harness.outcomes(key) == []

    def test_rate_of_a_region(self, harness: Harness) -> None:
        assert harness.rate("ap-south-1", None) == Rate("IN-STD", Decimal("0.18"))
        assert harness.rate(None, None) == Rate("GLOBAL-STD", Decimal("0.05"))
        assert harness.rate("westus2", "EXEMPT") == Rate("US-WA-EXEMPT", Decimal("0"))
        with pytest.raises(TaxRejected) as caught:
            harness.rate("us-east-1", "BOGUS")
        assert caught.value.status == 422
