"""Generated load: usage events and FOCUS CSV files, realistic by sampling the bundled
FOCUS sample (``examples/focus/focus_sample.csv``, 1,000 real anonymized rows).

Usage lines take their descriptive fields (description, SKU, region, unit, charge
category, provider) and their amounts from sample rows (amounts perturbed by a
seeded factor in 0.5..1.5). A generated FOCUS file keeps every column of a sampled
row and changes only what must differ: ``Id`` (unique), ``SubAccountId`` /
``SubAccountName`` (spread over N accounts), ``BilledCost`` (perturbed), and the
billing and charge periods (one month, hourly charges).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path

from benchmarks.product import LineTemplate, Record, customer_record, usage_record

#: Smallest generated usage amount (USD).
MIN_AMOUNT = Decimal("0.01")

SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "focus" / "focus_sample.csv"


def _cell(row: dict[str, str], name: str) -> str | None:
    value = row.get(name)
    return None if value in (None, "", "NULL") else value


@lru_cache(maxsize=1)
def sample_rows() -> tuple[dict[str, str], ...]:
    with SAMPLE.open(newline="", encoding="utf-8") as handle:
        return tuple(csv.DictReader(handle))


@lru_cache(maxsize=1)
def templates() -> tuple[tuple[LineTemplate, Decimal], ...]:
    """(descriptive fields, BilledCost) of every sample row with a positive cost."""
    out = []
    for row in sample_rows():
        try:
            cost = Decimal(row["BilledCost"])
        except (InvalidOperation, KeyError):
            continue
        if cost <= 0:
            continue
        out.append(
            (
                LineTemplate(
                    description=_cell(row, "ChargeDescription"),
                    sku_id=_cell(row, "SkuId"),
                    region_id=_cell(row, "RegionId"),
                    unit=_cell(row, "PricingUnit"),
                    charge_category=_cell(row, "ChargeCategory"),
                    provider=_cell(row, "ProviderName"),
                ),
                cost,
            )
        )
    return tuple(out)


def _factor(rng: random.Random) -> Decimal:
    return Decimal(rng.randint(500, 1500)) / 1000


def customer_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-c{c:05d}" for c in range(count)]


def usage_for(
    customers: list[str], period: str, lines: int | list[int], *, seed: int = 1
) -> Iterator[Record]:
    """``customer.upserted`` then ``lines`` (or ``lines[i]`` for customer i) usage
    records per customer, customer after customer (a customer's records keep their
    order on its partition)."""
    rng = random.Random(seed)
    pool = templates()
    for i, customer in enumerate(customers):
        yield customer_record(customer)
        count = lines if isinstance(lines, int) else lines[i]
        for n in range(count):
            template, cost = pool[rng.randrange(len(pool))]
            # at least a cent per line, so that every invoice has a non-zero total and
            # is emailed (a 0.00 invoice is deliberately not emailed)
            amount = max(MIN_AMOUNT, (cost * _factor(rng)).quantize(Decimal("1E-11")))
            yield usage_record(customer, period, n, amount, template)


def write_focus_csv(
    path: Path, *, rows: int, accounts: int, prefix: str, period: str, seed: int = 1
) -> dict[str, int]:
    """A FOCUS 1.0 CSV of ``rows`` rows sampled from the bundled sample and perturbed;
    returns ``{"rows": …, "accounts": …}``."""
    rng = random.Random(seed)
    source = sample_rows()
    fieldnames = list(source[0].keys())
    year, month = (int(x) for x in period.split("-"))
    start = datetime(year, month, 1)
    end = datetime(year + (month == 12), month % 12 + 1, 1)
    hours = int((end - start).total_seconds() // 3600)
    fmt = "%Y-%m-%d %H:%M:%S"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames, quoting=csv.QUOTE_MINIMAL)
        writer.writeheader()
        for i in range(rows):
            row = dict(source[rng.randrange(len(source))])
            account = i % accounts
            row["Id"] = f"{prefix}-{i}"
            row["SubAccountId"] = f"{prefix}-a{account:05d}"
            row["SubAccountName"] = f"Account {account}"
            try:
                cost = Decimal(row["BilledCost"])
                row["BilledCost"] = str((cost * _factor(rng)).quantize(Decimal("1E-11")))
            except InvalidOperation:
                pass
            charge = start + timedelta(hours=rng.randrange(hours))
            row["BillingPeriodStart"] = start.strftime(fmt)
            row["BillingPeriodEnd"] = end.strftime(fmt)
            row["ChargePeriodStart"] = charge.strftime(fmt)
            row["ChargePeriodEnd"] = (charge + timedelta(hours=1)).strftime(fmt)
            writer.writerow(row)
    return {"rows": rows, "accounts": min(accounts, rows)}
