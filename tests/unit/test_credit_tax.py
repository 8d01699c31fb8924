"""The pro-rata tax of partial credit notes (streams/core/domain/credit.py; the rule of
docs/invoices.md "Partial credit notes"): rounded half-even to the minor unit, the sum of
a line's credits never more than its creditable tax, and crediting the whole line credits
exactly that tax."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.domain.credit import CreditExceeded, credit_line, round_half_even

EXPONENT = 2
CENT = Decimal("0.01")

amounts = st.decimals(min_value=Decimal("0.01"), max_value=Decimal("100000"), places=3)
rates = st.decimals(min_value=Decimal("0"), max_value=Decimal("0.3"), places=4)


def credit_all(charged: Decimal, tax: Decimal, parts: list[int]) -> list[tuple[Decimal, Decimal]]:
    """Credit the line in pieces of ``parts`` cents (the last piece: whatever is open)."""
    creditable = round_half_even(charged, EXPONENT)
    done_amount, done_tax = Decimal(0), Decimal(0)
    credits: list[tuple[Decimal, Decimal]] = []
    for part in parts:
        amount = min(part * CENT, creditable - done_amount)
        if amount <= 0:
            break
        credit = credit_line(
            charged_amount=charged,
            charged_tax=tax,
            credited_amount=done_amount,
            credited_tax=done_tax,
            amount=amount,
            exponent=EXPONENT,
        )
        credits.append((credit.amount, credit.tax))
        done_amount += credit.amount
        done_tax += credit.tax
    return credits


@given(
    charged=amounts,
    rate=rates,
    parts=st.lists(st.integers(min_value=1, max_value=5_000_000), min_size=1, max_size=12),
)
def test_credits_never_exceed_the_charged_tax_and_the_full_credit_equals_it(
    charged: Decimal, rate: Decimal, parts: list[int]
) -> None:
    tax = charged * rate  # the tax service's unrounded answer
    creditable_tax = round_half_even(tax, EXPONENT)
    creditable = round_half_even(charged, EXPONENT)
    credits = credit_all(charged, tax, parts)
    running = Decimal(0)
    for _amount, credited in credits:
        assert credited >= 0 and credited == round_half_even(credited, EXPONENT)
        running += credited
        assert running <= creditable_tax
    # then credit whatever is still open: the whole line is credited, its tax exactly
    done = sum((a for a, _ in credits), Decimal(0))
    if done < creditable:
        last = credit_line(
            charged_amount=charged,
            charged_tax=tax,
            credited_amount=done,
            credited_tax=running,
            amount=creditable - done,
            exponent=EXPONENT,
        )
        running += last.tax
    assert running == creditable_tax


@given(charged=amounts, rate=rates, cents=st.integers(min_value=1, max_value=10_000_000))
def test_a_partial_credit_is_the_rounded_pro_rata_share(
    charged: Decimal, rate: Decimal, cents: int
) -> None:
    tax = charged * rate
    creditable = round_half_even(charged, EXPONENT)
    amount = cents * CENT
    if amount >= creditable:
        return
    credit = credit_line(
        charged_amount=charged,
        charged_tax=tax,
        credited_amount=Decimal(0),
        credited_tax=Decimal(0),
        amount=amount,
        exponent=EXPONENT,
    )
    share = round_half_even(tax, EXPONENT) * amount / creditable
    assert abs(credit.tax - share) <= CENT / 2


def test_half_even_and_the_exact_remainder() -> None:
    assert round_half_even(Decimal("0.125"), 2) == Decimal("0.12")
    assert round_half_even(Decimal("0.135"), 2) == Decimal("0.14")

    # 10.00 charged with 1.00 tax, credited in thirds: 0.33, 0.33, then the rest 0.34
    def third(done: str, done_tax: str, amount: str) -> Decimal:
        return credit_line(
            charged_amount=Decimal("10.00"),
            charged_tax=Decimal("1.00"),
            credited_amount=Decimal(done),
            credited_tax=Decimal(done_tax),
            amount=Decimal(amount),
            exponent=2,
        ).tax

    assert third("0", "0", "3.33") == Decimal("0.33")
    assert third("3.33", "0.33", "3.33") == Decimal("0.33")
    assert third("6.66", "0.66", "3.34") == Decimal("0.34")


@pytest.mark.parametrize("amount", ["0", "-1", "0.001", "10.01"])
def test_bad_or_excess_amounts_are_refused(amount: str) -> None:
    with pytest.raises(CreditExceeded):
        credit_line(
            charged_amount=Decimal("10.00"),
            charged_tax=Decimal("1.00"),
            credited_amount=Decimal(0),
            credited_tax=Decimal(0),
            amount=Decimal(amount),
            exponent=2,
        )
