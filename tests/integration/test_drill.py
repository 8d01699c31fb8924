"""The incident drill at a small scale, against the real stack: the naive design
double-invoices (the reproduction), the pipeline does not, on the same customers."""

from __future__ import annotations

from pathlib import Path

from streams import bootstrap
from streams.devtools.drill.config import DrillConfig
from streams.devtools.drill.naive import run_naive
from streams.devtools.drill.safe import run_safe
from streams.settings import Settings

SMALL = DrillConfig(
    customers=20,
    large_share=0.15,  # 3 large customers
    large_lines=(300, 600),
    small_lines=(5, 20),
    workers=4,
    seed=20250131,
    lock_ttl_s=0.5,  # a large naive job takes several TTLs
    timeout_s=240,
)


def test_naive_reproduces_duplicates_and_safe_has_none(
    settings: Settings, unique: str, tmp_path: Path
) -> None:
    messages: list[str] = []
    naive = run_naive(
        settings,
        SMALL,
        tmp_path / "naive",
        run_tag=f"n{unique[:6]}",
        redis_conn=bootstrap.naive_drill_redis(settings),
        progress=messages.append,
    )
    assert (naive.customers, naive.large_customers) == (20, 3)
    assert naive.missing == 0
    assert naive.duplicate_invoices >= 1, naive.to_dict()
    assert naive.invoices == 20 + naive.duplicate_invoices
    assert naive.duplicate_emails >= 1  # each duplicate invoice was emailed too
    assert naive.leases_lost >= 1  # because locks expired mid-job
    assert naive.longest_job_s > SMALL.lock_ttl_s
    assert naive.ok

    safe = run_safe(
        settings,
        SMALL,
        tmp_path / "safe",
        run_tag=f"s{unique[:6]}",
        producer=bootstrap.producer,
        close_period=bootstrap.run_close_period,
        progress=messages.append,
    )
    assert (safe.customers, safe.large_customers) == (20, 3)
    assert safe.ok, safe.to_dict()
    assert (safe.invoices, safe.duplicate_invoices, safe.missing) == (20, 0, 0)
    assert (safe.emails, safe.duplicate_emails, safe.unemailed) == (20, 0, 0)
    assert safe.fencing_refusals == 0
    assert safe.duplicate_tax_commits == 0
    assert safe.tax_requests >= 20
    assert any(m.startswith("safe:") for m in messages)
